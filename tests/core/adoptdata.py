"""Tars nobody in this project wrote, for `wdsprep index` (adopting WebDataset tars where they are):
made at test time by webdataset's own writers with their defaults (`wds.ShardWriter`, `wds.TarWriter`:
PAX headers for their float mtimes) and by GNU `tar` (long names, subdirectories, multi-dot names,
directory entries, links), plus webdataset's own test tars (tests/data/webdataset/). What the
tests compare against is plain webdataset reading the same tars (`plain_samples`) and `tarfile`,
never what wdsprep computes; `snapshot` says that indexing changed no byte, mode or mtime."""
import contextlib
import hashlib
import io
import json
import os
import pathlib
import stat
import subprocess
import tarfile

import numpy as np

WEBDATASET_TARS = pathlib.Path(__file__).resolve().parent.parent / "data" / "webdataset"


def shardwriter_shards(directory, count=30, maxcount=7, *, tag=""):
    """`count` samples in shards of `maxcount` by `wds.ShardWriter` with its defaults: per sample a
    PNG image, a class, a JSON object, an array, a text, and for a third of them a key with a
    subdirectory; returns the shard paths."""
    import PIL.Image
    import webdataset as wds

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(7)
    with contextlib.redirect_stdout(io.StringIO()):  # ShardWriter prints a line per shard
        with wds.ShardWriter(str(pathlib.Path(directory) / "shard-%06d.tar"), maxcount=maxcount) as writer:
            for i in range(count):
                image = io.BytesIO()
                PIL.Image.fromarray(rng.integers(0, 255, (4 + i % 3, 5, 3), dtype=np.uint8)).save(image, "png")
                key = f"{tag}group{i % 3}/s{i:04d}" if i % 3 == 0 else f"{tag}s{i:04d}"
                writer.write({"__key__": key, "png": image.getvalue(), "cls": i % 4, "json": {"label": i % 5, "w": i},
                              "npy": rng.standard_normal(i % 5 + 1).astype(np.float32), "txt": f"caption {i}"})
    return sorted(str(path) for path in pathlib.Path(directory).glob("shard-*.tar"))


def counted_webdataset_shards(directory, counts, *, tag=""):
    """Shards holding exactly `counts[i]` samples each, written by `wds.TarWriter` with its defaults;
    keys `s<shard>x<i>` (prefixed by `tag`), as tests/core/shardsets.py's converted ones; a count of
    0 is a tar without members. Returns the shards' folder."""
    import webdataset as wds

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for shard, count in enumerate(counts):
        with wds.TarWriter(str(directory / f"shard-{shard:06d}.tar")) as writer:
            for i in range(count):
                writer.write({"__key__": f"{tag}s{shard:02d}x{i:02d}", "value.npy": rng.standard_normal(8).astype(np.float32),
                              "meta.json": {"shard": shard, "i": i}})
    return directory


def gnu_tar_shards(directory):
    """Two tars made by GNU `tar` from one file tree (one in GNU format: `L` long-name records, one
    in PAX format: `x` records), holding members with names over 100 bytes, keys in subdirectories,
    multi-dot names, directory entries, a symlink, a hard link, a file without a dot (skipped by
    webdataset), a `__meta__` member, and a member compressed on its own (`.json.gz`)."""
    import gzip

    root = pathlib.Path(directory)
    tree = root / "tree"
    deep = "d" * 60 + "/" + "e" * 50
    files = {
        f"a/{deep}/long{'n' * 40}.seg.png": b"\x89PNG fake but bytes",
        f"a/{deep}/long{'n' * 40}.txt": b"a long-named sample",
        "a/x.y.z.bin": b"multi-dot one",
        "a/x.txt": b"same key x as x.y.z.bin? no: key a/x, field y.z.bin and txt",
        "b/000.cls": b"3",
        "b/000.json.gz": gzip.compress(b'{"n": 1}', mtime=0),
        "b/README": b"no dot: webdataset skips it",
        "b/001.cls": b"4",
        "b/001.dat": bytes(range(256)) * 5,
        "__meta__": b"metadata, skipped",
        "c/k.only": b"",
    }
    for name, data in files.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    os.symlink("000.cls", tree / "b" / "002.cls")  # a symlink member: skipped, as webdataset skips it
    os.link(tree / "b" / "001.dat", tree / "c" / "zz.dat")  # a hard link member: skipped likewise
    made = []
    for form in ("gnu", "pax"):
        target = root / f"{form}.tar"
        subprocess.run(["tar", f"--format={form}", "--sort=name", "-cf", str(target), "-C", str(tree), "."],
                       check=True)
        made.append(str(target))
    return made


def plain_samples(urls):
    """What plain webdataset yields for `urls`, in order: (key, {field: bytes})."""
    import webdataset as wds

    return [(sample["__key__"], {name: bytes(value) for name, value in sample.items() if not name.startswith("__")})
            for sample in wds.WebDataset(list(urls), shardshuffle=False)]


def wdsprep_samples(samples):
    """The same shape for raw wdsprep samples."""
    return [(sample["__key__"], {name: bytes(value) for name, value in sample.items() if not name.startswith("__")})
            for sample in samples]


def snapshot(directory):
    """Every entry under `directory`: its type, mode, mtime and (files) sha256 -- to show that
    indexing changed nothing."""
    found = {}
    for path in sorted(pathlib.Path(directory).rglob("*")):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
        found[str(path.relative_to(directory))] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode),
                                                   info.st_mtime_ns, digest)
    return found


@contextlib.contextmanager
def read_only(directory):
    """`directory` and everything in it without write permission (restored afterwards); the
    directory's snapshot is taken inside, so the caller compares modes as they were there."""
    paths = [pathlib.Path(directory), *pathlib.Path(directory).rglob("*")]
    modes = {path: path.lstat().st_mode for path in paths if not path.is_symlink()}
    for path, mode in sorted(modes.items(), reverse=True):
        os.chmod(path, stat.S_IMODE(mode) & ~0o222)
    try:
        yield
    finally:
        for path, mode in sorted(modes.items()):
            os.chmod(path, stat.S_IMODE(mode))


def tar_members(path):
    """(name, bytes) of the regular members of a tar, by `tarfile`."""
    with tarfile.open(path) as archive:
        return [(info.name, archive.extractfile(info).read()) for info in archive if info.isreg()]


def flip_payload_byte(path, member_data: bytes):
    """Flip one byte in the middle of a member's data (found by its bytes), keeping size and mtime."""
    data = bytearray(pathlib.Path(path).read_bytes())
    at = data.find(member_data)
    assert at > 0 and len(member_data) > 2, "member data not found once"
    info = os.stat(path)
    data[at + len(member_data) // 2] ^= 0x40
    os.chmod(path, 0o644)
    pathlib.Path(path).write_bytes(bytes(data))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def manifest_rows(out):
    return json.loads((pathlib.Path(out) / "manifest.json").read_text())["splits"]
