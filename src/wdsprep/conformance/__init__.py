"""The source conformance suite: the contract every source keeps, written once.

A source's test module subclasses `SourceTests` and fills in what only the source knows; pytest
then runs every test below against it. A new source is done when its subclass passes:

    from wdsprep.conformance import SourceTests

    class TestVoxelsConformance(SourceTests):
        source = "voxels"                          # a built-in id or "package.module:OBJECT"
        convert_args = ("--shard-bytes", "150KB")  # small shards: several units from a small input
        rebalance_shard_bytes = 150_000             # a size at which some unit rolls over (see below)

        def make_input(self, directory):           # a small native input, written into `directory`
            ...
        def corrupt_input(self, native):           # break one item; return the name the error names
            ...
        def bomb_input(self, native):              # Hostile(name, bytes it expands to)
            ...
        def malformed_input(self, native):         # Hostile(name, bytes it expands to)
            ...
        def edit_input(self, native):              # (file, new bytes of the same size)
            ...
        def stream(self, manifest, split, seed, epoch):   # training samples, resumable (optional)
            ...

The contract (one test each):
- The input made again (the same seed) at another path converts to the same shards, and the shard
  bytes do not depend on `--workers` (inline vs. a process pool); the manifest rows and the sample
  table files agree.
- Each split's sample table (`<split>.samples`, read with msgpack and struct alone) lists the keys
  of the split's shards in manifest order and the source's default index fields, a field read
  through a msgpack member holding that member's value.
- The manifest tells the truth about its shards, read back with `tarfile`, `hashlib` and `json`
  only (never wdsprep's own reader): names, sizes, sha256, sample counts, deterministic tar headers
  (mtime 0, uid/gid 0, no PAX, members of a sample adjacent and sorted, keys without dots), every
  row's index fields and the shard's index member (recomputed with `tarfile`, `xxhash`, `msgpack`),
  and `wdsprep verify` accepts it and names a shard with one flipped byte.
- At `rebalance_shard_bytes` a unit outgrows the target, rolls over and its last two shards are
  balanced (a `whole_units` source: stays one shard): every shard still carries its index, matching
  its bytes as above, and the bytes do not depend on `--workers`.
- Streaming with `wdsprep.dataset` gives every shard sample once per epoch, and the source's reader
  resumes exactly: `state_dict()` mid-epoch, a new pipeline, `load_state_dict()` -> the remaining
  samples of the uninterrupted epoch, in order.
- Bad input (`corrupt_input`): `wdsprep convert` fails with exit 1 and one line naming the file,
  leaving no manifest and no partial shard; with `--on-error skip` it reports exactly one problem
  naming the file (and a note for a split that held nothing else, left out of the manifest),
  converts the rest (some shards byte-identical to the clean conversion's, not all) and the
  output verifies.
- Hostile input (`bomb_input`: a file that expands far beyond its size, a decompression bomb or
  a header declaring more than the file holds; `malformed_input`: an object built to exhaust the
  reader, e.g. a structure nested through shared references): `wdsprep convert`, run in a child
  process (`wdsprep.conformance.measured`), fails with exit 1 and one line naming the file, having
  read and inflated less than a quarter of what the object would expand to (counted: the bytes of
  read(2) calls plus the bytes Python's zlib produced, never the clock) and grown its resident
  memory by less than that too; each hostile object expands to at least `HOSTILE_MIN_BYTES`.
- A hostile member of every kind (`hostile.KINDS`: zstd and zip bombs of 1.5 GiB, headers declaring a
  TiB the bytes do not hold, JSON and msgpack nested 10^5 deep, NaN and a key given twice in JSON, a
  tar header declaring 7 GiB in a shard without an index), planted in a shard of one of the source's
  converted samples (`hostile.plant`), is refused by every reader (`measured.READERS`: `wdsprep.
  dataset` with `wdsprep.decode()`, `wdsprep.MapDataset`, `wdsprep inspect`, `verify` and `show`), run
  in one child process: each reader a `ShardError` (a command: exit 1) in one line naming the shard,
  the member and the rule broken, never a traceback, its peak memory less than
  `HOSTILE_READ_BYTES` above what it held after reading the clean conversion.
- Every kind of input the source reads (`input_kinds`: per file suffix among the inputs
  `Source.inputs` names for the planned units, a zip archive and its members apart, and the
  `plan_files` read while planning), broken (`break_file`: cut to half its size; a zip member: its
  deflate stream corrupted), makes `wdsprep convert` fail the same way, the one line naming that
  file: whatever native reader (h5py, nibabel, rawpy, zipfile, numpy, zarr, json, yaml) meets it.
- Entries a user may leave in the input that the source does not take (`stray_entries`: a `.png`
  beside the arrays, notes, a nested or hidden folder) are each listed in the manifest's
  `problems` and in a warning line, and change no shard.
- A re-run over unchanged input rebuilds nothing; an equal-size edit of one input file, with its
  modification time put back, rebuilds exactly the units whose shards a fresh conversion of the
  edited input changes, and the result is byte-identical to that fresh conversion.

Expected values come from the inputs, a second conversion, or an independent reader; nothing here
asks the code under test what the answer should be. Conversions run in this process through
`wdsprep.cli.main` (the same path as the `wdsprep` command). Needs pytest (a dev dependency).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import struct
import tarfile
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import xxhash

from ..cli import main
from ..commands.convert import convert_options_from, source_parser
from ..sources.base import PlanContext
from ..sources.registry import load_source
from ..testing.edits import corrupt_zip_member, overwrite_keeping_size, rewritten_shards, shard_identities
from . import hostile

HOSTILE_MIN_BYTES = 1 << 30  # a hostile object expands at least this far: bounded work is then told apart
HOSTILE_READ_BYTES = 256 << 20  # what reading a hostile member may cost a reader at most, above its baseline


@dataclass(frozen=True)
class Hostile:
    """A hostile input planted by `SourceTests.bomb_input` / `malformed_input`: the name (absolute path,
    or as the source reports it) its one-line error must hold, and the bytes it would take, read as it
    declares itself (inflated, allocated at its declared shape, or expanded as if shared parts were copies)."""

    named: str
    expands_to: int


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`wdsprep *argv` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(arg) for arg in argv])
    return status, out.getvalue(), err.getvalue()


def failing_convert(argv: list[str], output: str) -> str:
    """Run `wdsprep convert *argv` in this process and check the bad-input contract: exit status 1,
    one line on stderr, no manifest and no temporary file in `output` (complete shards of good units
    may stay, for the resume once the input is fixed). Returns that line."""
    status, _, err = run_cli("convert", *argv, "--quiet")
    lines = err.strip().splitlines()
    if status != 1 or len(lines) != 1:
        raise AssertionError(f"expected exit 1 and one line, got {status} and:\n{err}")
    left = os.listdir(output) if os.path.isdir(output) else []
    partial = [name for name in left if name == "manifest.json" or name.endswith(".tmp")]
    if partial:
        raise AssertionError(f"a failed conversion left {partial} in {output}")
    for name in left:
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(output, name)) as archive:  # complete, or this raises
                archive.getmembers()
    return lines[0]


def read_manifest(output: pathlib.Path) -> dict:
    return json.loads((output / "manifest.json").read_text())


def shard_bytes(output: pathlib.Path) -> dict[str, bytes]:
    """Every shard file of an output folder, by name."""
    return {path.name: path.read_bytes() for path in sorted(output.glob("*.tar"))}


def tar_samples(path: pathlib.Path) -> list[tuple[str, list[tarfile.TarInfo]]]:
    """(key, members) per sample, in file order, by webdataset's rule (key = name up to the first
    dot of the basename), read with `tarfile` alone; `__...__` names (webdataset's meta convention:
    the shard's trailing index member) are not samples."""
    samples: list[tuple[str, list[tarfile.TarInfo]]] = []
    with tarfile.open(path, mode="r:") as archive:
        for member in archive.getmembers():
            directory, _, base = member.name.rpartition("/")
            if base.startswith("__") and base.endswith("__"):
                continue
            key = (directory + "/" if directory else "") + base.split(".", 1)[0]
            if not samples or samples[-1][0] != key:
                samples.append((key, []))
            samples[-1][1].append(member)
    return samples


INDEX_MEMBER = "__wdsprep_index__"  # the format's name for it (ARCHITECTURE.md), not imported from the code under test


def _key_and_member(name: str) -> tuple[str, str]:
    """webdataset's rule: the key is the path up to the first dot of the basename."""
    directory, _, base = name.rpartition("/")
    stem, _, member = base.partition(".")
    return (directory + "/" if directory else "") + stem, member


def assert_rows_index_their_shards(output: pathlib.Path) -> int:
    """Every manifest row carries `index_offset`/`index_bytes`/`index_digest`, and they and the
    shard's `__wdsprep_index__` member (format `wdsprep-index/2`) agree with the shard's bytes,
    recomputed here with `tarfile`, `xxhash`, `msgpack` and `struct` only: the samples tile the
    shard from byte 0, each member a 512-byte header, its data and zero padding; the index member
    last, then exactly two zero blocks. Returns the number of rows checked."""
    checked = 0
    for split, entry in read_manifest(output)["splits"].items():
        for row in entry["shards"]:
            where = f"{split}/{row['name']}"
            data = (output / row["name"]).read_bytes()
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
                members = archive.getmembers()
            assert members and members[-1].name == INDEX_MEMBER, f"{where}: no {INDEX_MEMBER} member at the end"
            index = members[-1]
            end = index.offset_data + index.size + (-index.size % 512)
            assert all(row.get(name) is not None for name in ("index_offset", "index_bytes", "index_digest")), \
                f"{where}: row without index fields: {row}"
            assert (row["index_offset"], row["index_bytes"]) == (index.offset, end - index.offset), where
            assert row["index_digest"] == f"xxh3_64:{xxhash.xxh3_64_intdigest(data[index.offset:end]):016x}", where
            assert len(data) == row["bytes"] == end + 1024 and data[end:] == bytes(1024), where
            keys, offsets, layouts, layout, sizes, digests = [], [], [], [], [], []
            at = 0
            for member in members[:-1]:
                assert (member.offset, member.offset_data) == (at, at + 512), f"{where}: {member.name} does not follow the member before"
                key, name = _key_and_member(member.name)
                if not keys or keys[-1] != key:
                    keys.append(key)
                    offsets.append(at)
                    layout.append([])
                layout[-1].append(name)
                at = member.offset_data + member.size + (-member.size % 512)
                assert data[member.offset_data + member.size : at] == bytes(at - member.offset_data - member.size), f"{where}: padding"
                sizes.append(member.size)
                digests.append(xxhash.xxh3_64_intdigest(data[member.offset : at]))
            assert at == index.offset, where
            for names in layout:
                if names not in layouts:
                    layouts.append(names)
            ids = [layouts.index(names) for names in layout]
            expected = {"format": "wdsprep-index/2", "digest": "xxh3_64", "keys": keys, "layouts": layouts,
                        "layout": struct.pack(f"<{len(ids)}I", *ids), "offsets": struct.pack(f"<{len(offsets)}Q", *offsets),
                        "sizes": struct.pack(f"<{len(sizes)}Q", *sizes), "digests": struct.pack(f"<{len(digests)}Q", *digests)}
            got = msgpack.unpackb(data[index.offset_data : index.offset_data + index.size], raw=False)
            if isinstance(got.get("reindexed_from"), str):  # a shard `wdsprep reindex` rebuilt names the one it replaced
                expected["reindexed_from"] = got["reindexed_from"]
            assert got == expected, f"{where}: the index member differs from the shard's bytes"
            assert row["samples"] == len(keys), where
            checked += 1
    return checked


def balanced_units(output: pathlib.Path, shard_bytes: int) -> list[str]:
    """Units whose second-to-last shard was not filled to the target: the first sample of the last
    shard would have fitted in it (its header-to-padding bytes, one more index entry of at most
    512 bytes of padding, the key and 16 bytes per member) -- what the writer's balance of the last
    two shards leaves, and a writer that only rolls over never does."""
    found = []
    for entry in read_manifest(output)["splits"].values():
        units: dict[str, list[dict]] = {}
        for row in entry["shards"]:
            units.setdefault(unit_of(row["name"]), []).append(row)
        for unit, rows in units.items():
            if len(rows) < 2:
                continue
            before, last = rows[-2], rows[-1]
            key, members = tar_samples(output / last["name"])[0]
            first = sum(512 + m.size + (-m.size % 512) for m in members)
            entry_room = 512 + len(key.encode()) + 16 + 16 * len(members)
            if before["bytes"] + first + entry_room <= shard_bytes:  # its index and end blocks counted in `bytes`
                found.append(unit)
    return found


def shard_rows(output: pathlib.Path) -> dict[str, list[tuple]]:
    """Per split, the manifest's (name, samples, bytes, sha256) rows: what a reader relies on."""
    return {split: [(row["name"], row["samples"], row["bytes"], row["sha256"]) for row in entry["shards"]]
            for split, entry in read_manifest(output)["splits"].items()}


def assert_same_shards(expected: pathlib.Path, output: pathlib.Path, what: str) -> None:
    """Same shard names and bytes (several of them), same manifest rows, same sample table files."""
    first, second = shard_bytes(expected), shard_bytes(output)
    assert sorted(first) == sorted(second), what
    assert len(first) > 1, "make_input/convert_args should give several shards"
    for name in first:
        assert first[name] == second[name], f"{name} differs: {what}"
    assert shard_rows(expected) == shard_rows(output), what
    tables = {path.name: path.read_bytes() for path in sorted(expected.glob("*.samples"))}
    assert tables and tables == {path.name: path.read_bytes() for path in sorted(output.glob("*.samples"))}, \
        f"sample tables differ: {what}"


MISSING = {"<i8": -1, "|b1": False, "<f8": float("nan")}  # a sample without the field (docs/format.md)


def read_sample_table(output: pathlib.Path, split: str) -> tuple[list[str], dict[str, list]]:
    """(keys, {field: values}) of a split's `<split>.samples`, decoded here with `zstandard`, `msgpack`
    and `struct` only, after checking its size and sha256 against the manifest's record."""
    entry = read_manifest(output)["tables"]["sample_tables"][split]
    data = (output / entry["file"]).read_bytes()
    assert (entry["file"], len(data), hashlib.sha256(data).hexdigest()) == (f"{split}.samples", entry["bytes"], entry["sha256"])
    import zstandard

    table = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(data), raw=False)
    assert (table["format"], table["split"]) == ("wdsprep-samples/1", split)
    ends = struct.unpack(f"<{table['count']}Q", table["key_ends"])
    keys = [table["keys"][a:b].decode() for a, b in zip((0, *ends[:-1]), ends)]
    fields = {}
    for name, column in table["fields"].items():
        if "codes" in column:
            codes = struct.unpack(f"<{table['count']}I", column["codes"])
            fields[name] = [column["values"][code] for code in codes]
        else:
            letter = {"<i8": "q", "|b1": "?", "<f8": "d"}[column["dtype"]]
            fields[name] = list(struct.unpack(f"<{table['count']}{letter}", column["data"]))
    assert sorted(fields) == entry["fields"], split
    return keys, fields


def _dtype_of(value: Any) -> str:
    return "|b1" if isinstance(value, bool) else "<i8" if isinstance(value, int) else "<f8"


def member_field(members: dict[str, bytes], path: str) -> Any:
    """A dotted path's value through a sample's msgpack member (`meta.episode`: member `meta.mp`),
    decoded with `msgpack`; ... when the sample has no such member (not checkable here)."""
    head, *rest = path.split(".")
    if f"{head}.mp" not in members or not rest:
        return ...
    value = msgpack.unpackb(members[f"{head}.mp"], raw=False)
    for part in rest:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _plant(copy: pathlib.Path, strays: tuple[str, ...]) -> list[tuple[str, str]]:
    """Create each stray entry in the input `copy` (a folder, or a zip archive: as members); returns
    (the folder it lies in, its name as a report shows it: a folder with a trailing `/`)."""
    planted = []
    for stray in strays:
        parent, name = os.path.split(stray.rstrip("/"))
        if copy.is_file():
            import zipfile

            with zipfile.ZipFile(copy, "a") as archive:
                archive.writestr(stray, b"not part of the dataset\n")
            planted.append((os.path.join(str(copy), parent), name))
            continue
        path = copy / stray
        path.parent.mkdir(parents=True, exist_ok=True)
        if stray.endswith("/"):
            path.mkdir()
            (path / "notes.txt").write_bytes(b"not part of the dataset\n")
            name += "/"
        else:
            path.write_bytes(b"not part of the dataset\n")
        planted.append((str(copy / parent) if parent else str(copy), name))
    return planted


def _in_copy(path: str, native: pathlib.Path, copy: pathlib.Path) -> pathlib.Path:
    """Where the input file `path` (as the plan of `native` names it) lies in `copy_input`'s copy."""
    return copy / pathlib.Path(path).relative_to(native) if native.is_dir() else copy


def _suffix(path: str) -> str:
    """`.nii.gz`, `.npy`, `.zip`...: what tells the kinds of input apart."""
    name = os.path.basename(path)
    return ".nii.gz" if name.endswith(".nii.gz") else os.path.splitext(name)[1] or name


def unit_of(shard_name: str) -> str:
    """`train-00003-01.tar` -> `train-00003`: the parts of one unit share this stem."""
    return shard_name.rsplit("-", 1)[0]


class SourceTests:
    """Subclass as `Test<Name>Conformance` and set `source`; override the hooks your source needs."""

    source: str = ""  # a built-in source id, or a plugin "package.module:OBJECT"
    convert_args: tuple[str, ...] = ()  # extra `wdsprep convert` options (keep several units per split)
    resume_stops: tuple[float, ...] = (0.1, 0.5, 0.9)  # where to stop the epoch, as fractions of it
    synth_seed: int = 0  # the default `make_input`: `synth(directory, synth_seed, synth_size)`
    synth_size: str = "small"
    # a `--shard-bytes` at which a unit of `make_rebalance_input`'s input outgrows the target, so that it
    # rolls over and its last two shards are balanced (for a source with `whole_units`: one its units
    # exceed, each still one shard); `rebalance_args`: further `convert` options for that conversion
    rebalance_shard_bytes: int = 0
    rebalance_args: tuple[str, ...] = ()

    # -- hooks -------------------------------------------------------------------------------
    def make_input(self, directory: pathlib.Path) -> pathlib.Path:
        """Write a small native input under `directory` (deterministically); return the path to
        convert. Default: the source's own `synth` with `synth_seed` and `synth_size`."""
        load_source(self.source).synth(str(directory), self.synth_seed, self.synth_size)
        return directory

    def corrupt_input(self, native: pathlib.Path) -> str:
        """Break one input item of the copy at `native`; return the file name (absolute path, or the
        path as the source reports it) that the one-line error must name."""
        raise NotImplementedError(f"{type(self).__name__}: corrupt_input is part of the contract")

    def bomb_input(self, native: pathlib.Path) -> Hostile:
        """Turn one input file of the copy at `native` into a bomb as a stranger would make it: a zip
        member, gzip file or compressed chunk that inflates to gigabytes, or a header that declares
        gigabytes the file does not hold. Return what it is (`Hostile`)."""
        raise NotImplementedError(f"{type(self).__name__}: bomb_input is part of the contract")

    def malformed_input(self, native: pathlib.Path) -> Hostile:
        """Plant one malformed object in the copy at `native` that would cost gigabytes or crash a
        careless reader (a structure nested through shared references, aliases, an object dtype made
        of raw bytes, a shape larger than the data). Return what it is (`Hostile`)."""
        raise NotImplementedError(f"{type(self).__name__}: malformed_input is part of the contract")

    def edit_input(self, native: pathlib.Path) -> tuple[pathlib.Path, bytes]:
        """One input file of the copy at `native` and new bytes of the same size for it, changing
        what at least one (not every) unit stores. Pick a file that feeds only units whose shards
        the edit changes (the suite's oracle is a fresh conversion: a file that also feeds a unit
        whose bytes stay the same would rightly rebuild that unit too)."""
        raise NotImplementedError(f"{type(self).__name__}: edit_input is part of the contract")

    def make_rebalance_input(self, directory: pathlib.Path) -> pathlib.Path:
        """The input for the roll-over and balance test (default: `make_input`). A source whose size
        estimates are at or above what it writes never rolls over on ordinary data: give it data that
        compresses worse, or tiny samples whose tar headers outweigh them."""
        return self.make_input(directory)

    def plan_files(self, native: pathlib.Path) -> tuple[str, ...]:
        """Files (relative to the input folder) the source reads while planning but that feed no unit
        item, e.g. a split list or an index: `input_kinds` breaks each of them too. Default: none."""
        return ()

    def input_kinds(self, native: pathlib.Path) -> dict[str, Any]:
        """One input of each kind the source reads, by kind: a file path, or an (archive, member) pair
        for a zip member. Default: among the inputs `Source.inputs` names for the units of a plan of
        `native` (made with `convert_args`), one per file suffix, the one feeding the fewest units (a
        failure of one unit is one line); a zip archive's own kind besides its members'; and every
        `plan_files` entry."""
        source = load_source(self.source)
        core, own = convert_options_from(source_parser(self.source).parse_args([str(native), "unused", *self.convert_args]))
        plan = source.plan(str(native), PlanContext(own, core.replace(workers=1).checked()))
        feeds: dict[Any, set] = {}
        kinds: dict[str, list] = {}
        for unit in plan.units:
            for item in unit.items:
                for ref in source.inputs(item):
                    ref = tuple(ref) if isinstance(ref, (list, tuple)) else os.fspath(ref)
                    feeds.setdefault(ref, set()).add((unit.split, unit.index))
                    if isinstance(ref, tuple):
                        kinds.setdefault("zip archive", []).append(ref[0])
                        kinds.setdefault(f"zip member {_suffix(ref[1])}", []).append(ref)
                    else:
                        kinds.setdefault(f"file {_suffix(ref)}", []).append(ref)
        chosen = {kind: min(sorted(set(refs)), key=lambda ref: len(feeds.get(ref, ()))) for kind, refs in kinds.items()}
        root = native if native.is_dir() else native.parent
        chosen.update({f"plan file {name}": str(root / name) for name in self.plan_files(native)})
        return chosen

    def stray_entries(self, native: pathlib.Path) -> tuple[str, ...]:
        """Entries a user may leave in the input that the source does not take, as paths relative to
        the input folder (a folder ends in `/`; for a zip input, members of the archive). The suite
        plants each and expects it reported in the folder that holds it. Default: none (a source
        that reads its input through an index lists no folder), and that test is skipped."""
        return ()

    def break_file(self, path: pathlib.Path) -> None:
        """Damage one input file of a copy for the broken-input test. Default: cut it to half its
        size (a truncated download or copy); a source of line-based text overrides this."""
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) // 2)

    def stream(self, manifest: str, split: str, seed: int, epoch: int) -> Any:
        """The training pipeline to test resume on: an iterable with `state_dict()` and
        `load_state_dict()`. Default: `wdsprep.dataset` (raw shard samples); override to compose the
        source's reader stage."""
        import wdsprep

        return wdsprep.dataset(manifest, split, seed=seed, epoch=epoch, shuffle_buffer=4)

    def sample_id(self, sample: dict) -> Any:
        """What identifies a streamed training sample (default its `__key__`)."""
        return sample["__key__"]

    # -- fixtures ----------------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def native(cls, tmp_path_factory) -> pathlib.Path:
        """The small native input, written once per class; tests that change it work on a copy."""
        return cls().make_input(tmp_path_factory.mktemp(f"{cls()._name()}-native"))

    @pytest.fixture(scope="class")
    @classmethod
    def converted(cls, native, tmp_path_factory) -> pathlib.Path:
        """The input converted once with `--workers 1`: the output folder."""
        output = tmp_path_factory.mktemp(f"{cls()._name()}-out") / "shards"
        cls().convert(native, output)
        return output

    @pytest.fixture(scope="class")
    @classmethod
    def hostile_reads(cls, converted, tmp_path_factory) -> dict:
        """Every kind of hostile member planted in a dataset of one converted sample (`hostile.plant_all`),
        each read by every reader in one child process after the clean conversion (`measured.run_readers`):
        {"planted": {kind: hostile.Planted}, "baseline": {reader: read}, "results": {kind: {reader: read}}}."""
        from .measured import run_readers  # here, not at import: its child runs that module as __main__

        planted = hostile.plant_all(converted, tmp_path_factory.mktemp(f"{cls()._name()}-hostile"))
        split = next(iter(planted.values())).split
        found, status, err = run_readers((str(converted), split), {kind: (where.folder, split) for kind, where in planted.items()})
        assert status == 0 and found, f"the readers' child died (status {status}):\n{err}"
        return {"planted": planted, **found}

    def _name(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.source)[:40]

    def convert(self, native: pathlib.Path, output: pathlib.Path, *extra: str) -> str:
        status, _, err = run_cli("convert", self.source, native, output, *self.convert_args, *extra, "--quiet")
        assert status == 0, f"wdsprep convert {self.source} failed ({status}):\n{err}"
        return err

    def copy_input(self, native: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
        """A copy of the input (files, links kept as links) at `target`, mirrored where `native`
        points: the input may be a file (an archive) or a folder."""
        if native.is_dir():
            shutil.copytree(native, target, symlinks=True)
        else:
            target.mkdir(parents=True)
            target = target / native.name
            shutil.copy2(native, target)
        return target

    # -- the contract ------------------------------------------------------------------------
    def test_the_same_input_made_again_elsewhere_gives_the_same_shards(self, converted, tmp_path):
        again = self.make_input(tmp_path / "elsewhere")
        output = tmp_path / "out"
        self.convert(again, output)
        assert_same_shards(converted, output, "a second input made with the same seed, at another path")

    def test_shard_bytes_do_not_depend_on_workers(self, native, converted, tmp_path):
        output = tmp_path / "out"
        self.convert(native, output, "--workers", "2")
        assert_same_shards(converted, output, "--workers 2")

    def test_manifest_tells_the_truth_about_its_shards(self, converted):
        assert assert_rows_index_their_shards(converted) == len(shard_bytes(converted))
        splits = read_manifest(converted)["splits"]
        listed = [row["name"] for entry in splits.values() for row in entry["shards"]]
        assert sorted(listed) == sorted(shard_bytes(converted)), "manifest rows vs. .tar files on disk"
        assert len(listed) == len(set(listed))
        for split, entry in splits.items():
            rows = entry["shards"]
            assert rows, f"split {split} lists no shard"
            assert entry["samples"] == sum(row["samples"] for row in rows), split
            assert entry["bytes"] == sum(row["bytes"] for row in rows), split
            for row in rows:
                path = converted / row["name"]
                data = path.read_bytes()
                assert row["bytes"] == len(data), row["name"]
                assert row["sha256"] == hashlib.sha256(data).hexdigest(), row["name"]
                samples = tar_samples(path)
                assert row["samples"] == len(samples), row["name"]
                keys = [key for key, _ in samples]
                assert len(keys) == len(set(keys)), f"{row['name']}: a sample's members are not adjacent"
                for key, members in samples:
                    assert "." not in key.rsplit("/", 1)[-1], f"{row['name']}: key {key!r} holds a dot"
                    names = [member.name for member in members]
                    assert names == sorted(names), f"{row['name']}: members of {key} not sorted"
                    for member in members:
                        assert member.isfile(), member.name
                        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (0, 0, 0, "", ""), member.name
                        assert not member.pax_headers, member.name

    def test_the_sample_table_lists_every_sample_with_the_sources_index_fields(self, converted):
        """Each split's `<split>.samples` (read with msgpack alone): the keys of the split's shards in
        manifest order (tarfile), and the source's default index fields (`Source.index_fields`), each
        held by some split; a field read through a msgpack member (`meta.x`) has the member's value."""
        source = load_source(self.source)
        manifest = read_manifest(converted)
        assert sorted(manifest["tables"]["sample_tables"]) == sorted(manifest["splits"])
        seen: set[str] = set()
        for split, entry in manifest["splits"].items():
            keys, fields = read_sample_table(converted, split)
            samples = []
            for row in entry["shards"]:
                with tarfile.open(converted / row["name"]) as archive:
                    for key, members in tar_samples(converted / row["name"]):
                        samples.append((key, {m.name.partition(".")[2]: archive.extractfile(m).read() for m in members}))
            assert keys == [key for key, _ in samples], f"{split}: table keys vs. the shards' samples"
            assert set(fields) <= set(source.index_fields), split
            seen |= set(fields)
            for name, values in fields.items():
                for (key, members), value in zip(samples, values, strict=True):
                    expected = member_field(members, name)
                    if expected is ...:
                        continue
                    if expected is None:
                        expected = "" if isinstance(value, str) else MISSING[_dtype_of(value)]
                    assert value == expected or (value != value and expected != expected), (split, key, name)
        assert seen == set(source.index_fields), f"default index fields no split holds: {set(source.index_fields) - seen}"

    def test_every_shard_carries_its_index_when_units_roll_over_and_rebalance(self, tmp_path):
        """The shards a conversion writes when a unit outgrows `--shard-bytes` (it rolls over, and its
        last two shards are balanced) each end with their index, and every row's index fields match
        the shard's bytes (recomputed with tarfile + xxhash); the same bytes with `--workers 2`; every
        sample streams once."""
        import wdsprep

        assert self.rebalance_shard_bytes, f"{type(self).__name__}: set rebalance_shard_bytes (part of the contract)"
        native = self.make_rebalance_input(tmp_path / "native")
        output, again = tmp_path / "out", tmp_path / "again"
        options = ("--shard-bytes", str(self.rebalance_shard_bytes), *self.rebalance_args)
        self.convert(native, output, *options)
        names = sorted(shard_bytes(output))
        assert assert_rows_index_their_shards(output) == len(names)
        if load_source(self.source).whole_units:
            assert all(name.endswith("-00.tar") for name in names), "a whole unit rolled over"
            assert any(len(data) > self.rebalance_shard_bytes for data in shard_bytes(output).values()), \
                "no unit outgrew rebalance_shard_bytes"
        else:
            assert any(not name.endswith("-00.tar") for name in names), "no unit rolled over at rebalance_shard_bytes"
            assert balanced_units(output, self.rebalance_shard_bytes), "no unit's last two shards were balanced"
        self.convert(native, again, *options, "--workers", "2")
        assert_same_shards(output, again, "--workers 2, rolled over and balanced")
        assert shard_rows(output) == shard_rows(again)
        for split, entry in read_manifest(output)["splits"].items():
            want = sorted(key for row in entry["shards"] for key, _ in tar_samples(output / row["name"]))
            got = [sample["__key__"] for sample in wdsprep.dataset(str(output / "manifest.json"), split, seed=1, epoch=0)]
            assert sorted(got) == want, split

    def test_verify_accepts_the_output_and_names_a_damaged_shard(self, converted, tmp_path):
        status, out, err = run_cli("verify", converted, "--quiet")
        assert status == 0, out + err
        damaged = tmp_path / "damaged"
        shutil.copytree(converted, damaged)
        victim = max(damaged.glob("*.tar"), key=lambda path: path.stat().st_size)
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
        status, out, err = run_cli("verify", damaged, "--quiet")
        assert status == 1, out + err
        assert victim.name in err and sum(victim.name in line for line in err.splitlines()) == 1, err

    def test_streaming_gives_every_shard_sample_once_per_epoch(self, converted):
        import wdsprep

        for split, entry in read_manifest(converted)["splits"].items():
            want = sorted(key for row in entry["shards"] for key, _ in tar_samples(converted / row["name"]))
            for epoch in (0, 1):
                got = [sample["__key__"] for sample in wdsprep.dataset(str(converted / "manifest.json"), split, seed=7, epoch=epoch)]
                assert sorted(got) == want, f"{split}, epoch {epoch}"

    def test_streaming_resumes_exactly_mid_epoch(self, converted):
        manifest_path = str(converted / "manifest.json")
        split = max(read_manifest(converted)["splits"].items(), key=lambda item: item[1]["samples"])[0]
        full = [self.sample_id(sample) for sample in self.stream(manifest_path, split, 3, 1)]
        assert len(full) >= 3, f"split {split} streams {len(full)} samples: too few to stop in the middle"
        for stop in sorted({max(1, min(len(full) - 1, int(len(full) * f))) for f in self.resume_stops}):
            first = self.stream(manifest_path, split, 3, 1)
            iterator = iter(first)
            head = [self.sample_id(next(iterator)) for _ in range(stop)]
            state = first.state_dict()
            resumed = self.stream(manifest_path, split, 3, 1)
            resumed.load_state_dict(state)
            tail = [self.sample_id(sample) for sample in resumed]
            assert len(head) + len(tail) == len(full), f"stopped after {stop}"
            assert head + tail == full, f"stopped after {stop}"

    def test_bad_input_is_one_line_naming_the_file(self, native, tmp_path):
        copy = self.copy_input(native, tmp_path / "input")
        named = self.corrupt_input(copy)
        output = tmp_path / "out"
        line = failing_convert([self.source, str(copy), str(output), *self.convert_args], str(output))
        assert line.startswith("wdsprep: error: ") and str(named) in line, line

    @pytest.mark.parametrize("plant", ["bomb_input", "malformed_input"])
    def test_a_hostile_input_is_refused_in_bounded_reads_and_memory(self, native, tmp_path, plant):
        from .measured import run_measured  # here, not at import: its child runs that module as __main__

        copy = self.copy_input(native, tmp_path / "input")
        hostile = getattr(self, plant)(copy)
        assert hostile.expands_to >= HOSTILE_MIN_BYTES, f"{plant}: expands to {hostile.expands_to} bytes only"
        output = tmp_path / "out"
        counts, status, err = run_measured(["convert", self.source, copy, output, *self.convert_args, "--workers", "1", "--quiet"])
        assert status == 0 and counts, f"the conversion died (status {status}):\n{err}"
        bound = hostile.expands_to // 4
        work = counts["read_bytes"] + counts["inflated_bytes"]
        assert work < bound, f"read and inflated {work} bytes of a {plant} that expands to {hostile.expands_to}:\n{err}"
        assert counts["rss_growth"] < bound, f"memory grew {counts['rss_growth']} bytes on a {plant} of {hostile.expands_to}:\n{err}"
        lines = err.strip().splitlines()
        assert counts["status"] == 1 and len(lines) == 1, f"exit {counts['status']}:\n{err}"
        assert lines[0].startswith("wdsprep: error: ") and hostile.named in lines[0], lines[0]
        left = sorted(os.listdir(output)) if output.is_dir() else []
        assert not [name for name in left if name == "manifest.json" or name.endswith(".tmp")], left

    @pytest.mark.parametrize("kind", hostile.KINDS)
    def test_a_hostile_member_is_one_line_from_every_reader_in_bounded_memory(self, hostile_reads, kind):
        clean = {reader: read for reader, read in hostile_reads["baseline"].items() if read["status"] != 0}
        assert not clean, f"a reader fails on the clean conversion: {clean}"
        planted = hostile_reads["planted"][kind]
        rule = hostile.MEMBERS[kind].refusal if kind in hostile.MEMBERS else hostile.TAR_REFUSAL
        wrong = []
        for reader, read in hostile_reads["results"][kind].items():
            line, growth = read["error"], read["rss_growth"]
            api = reader in ("dataset", "MapDataset")
            if not (read["status"] == 1 and (line.startswith("ShardError: ") if api else "Traceback" not in line)
                    and planted.shard in line and planted.member in line and re.search(rule, line)
                    and growth < HOSTILE_READ_BYTES):
                wrong.append(f"{reader}: status {read['status']}, memory +{growth >> 20} MB:\n{line}")
        assert not wrong, f"{kind} ({planted.member}):\n" + "\n".join(wrong)

    def test_a_broken_input_of_each_kind_is_one_line_naming_it(self, native, tmp_path):
        kinds = self.input_kinds(native)
        assert kinds, "input_kinds found nothing to break"
        unnamed = []
        for number, (kind, ref) in enumerate(sorted(kinds.items())):
            copy = self.copy_input(native, tmp_path / f"input{number}")
            root = copy if native.is_dir() else copy.parent
            path = _in_copy(ref[0] if isinstance(ref, tuple) else ref, native, copy)
            if isinstance(ref, tuple):  # a zip member: its deflate stream corrupted, the archive intact
                corrupt_zip_member(str(path), ref[1])
                names = (ref[1],)
            else:
                self.break_file(path)
                names = (str(path), str(path.relative_to(root)))
            output = tmp_path / f"out{number}"
            line = failing_convert([self.source, str(copy), str(output), *self.convert_args], str(output))
            if not any(name in line for name in names):
                unnamed.append(f"{kind} ({names[0]}): {line}")
        assert not unnamed, "errors that do not name the broken file:\n" + "\n".join(unnamed)

    def test_entries_the_source_does_not_take_are_reported_and_change_no_shard(self, native, converted, tmp_path):
        strays = self.stray_entries(native)
        if not strays:
            pytest.skip(f"{type(self).__name__} declares no stray_entries: its source lists no folder")
        copy = self.copy_input(native, tmp_path / "input")
        planted = _plant(copy, strays)
        output = tmp_path / "out"
        status, _, err = run_cli("convert", self.source, copy, output, *self.convert_args, "--quiet")
        assert status == 0, err
        problems = read_manifest(output).get("problems", [])
        for folder, name in planted:
            assert any(p["item"] == folder and name in p["message"] for p in problems), (folder, name, problems)
            assert any(folder in line and name in line for line in err.splitlines()), (folder, name, err)
        assert all(line.startswith(("wdsprep: warning: ", "  ")) for line in err.splitlines()), err
        assert shard_bytes(output) == shard_bytes(converted), "a stray entry changed the shards"

    def test_skip_mode_reports_the_bad_item_and_converts_the_rest(self, native, converted, tmp_path):
        copy = self.copy_input(native, tmp_path / "input")
        named = self.corrupt_input(copy)
        output = tmp_path / "out"
        self.convert(copy, output, "--on-error", "skip")
        manifest = read_manifest(output)
        problems = manifest.get("problems", [])
        emptied = [p for p in problems if re.fullmatch(r"split '([^']*)': every item was skipped; .*", p["message"])]
        for note in emptied:  # a split that held only the bad item is named as left out, and is
            assert note["message"].split("'")[1] not in manifest["splits"], note
        problems = [p for p in problems if p not in emptied]
        assert len(problems) == 1, problems
        assert str(named) in problems[0]["item"] + " " + problems[0]["message"], problems
        clean, skipped = shard_bytes(converted), shard_bytes(output)
        unchanged = [name for name in skipped if clean.get(name) == skipped[name]]
        assert unchanged, "no shard of the skip-mode output equals the clean conversion's: the rest was not converted alike"
        assert len(unchanged) < len(clean), "every shard as in the clean conversion: the bad item was not skipped"
        status, out, err = run_cli("verify", output, "--quiet")
        assert status == 0, out + err

    def test_an_unchanged_rerun_rebuilds_nothing(self, native, converted, tmp_path):
        output = tmp_path / "out"
        shutil.copytree(converted, output)
        before = shard_identities(str(output))
        self.convert(native, output)
        assert rewritten_shards(before, str(output)) == []
        assert read_manifest(output)["timing"]["units_built"] == 0

    def test_an_equal_size_edit_rebuilds_exactly_the_units_it_changes(self, native, tmp_path):
        copy = self.copy_input(native, tmp_path / "input")
        incremental = tmp_path / "incremental"
        self.convert(copy, incremental)  # here: units record where their inputs lie
        path, data = self.edit_input(copy)
        overwrite_keeping_size(str(path), data, restore_mtime=True)  # the hard case: size and mtime as before
        fresh = tmp_path / "fresh"
        self.convert(copy, fresh)  # the oracle: a conversion of the edited input from scratch
        old, new = shard_bytes(incremental), shard_bytes(fresh)
        changed_units = {unit_of(name) for name in set(old) | set(new) if old.get(name) != new.get(name)}
        assert changed_units, "edit_input changed no shard"
        assert {unit_of(name) for name in new} - changed_units, "edit_input changed every unit"
        before = shard_identities(str(incremental))
        self.convert(copy, incremental)
        rebuilt = rewritten_shards(before, str(incremental))
        assert rebuilt == sorted(name for name in new if unit_of(name) in changed_units)
        assert shard_bytes(incremental) == new
        assert shard_rows(incremental) == shard_rows(fresh)
        assert read_manifest(incremental)["timing"]["units_built"] == len(changed_units)


__all__ = ["HOSTILE_MIN_BYTES", "HOSTILE_READ_BYTES", "Hostile", "SourceTests", "assert_rows_index_their_shards", "assert_same_shards", "balanced_units", "failing_convert", "run_cli", "read_manifest",
           "shard_bytes", "shard_rows", "tar_samples", "unit_of"]
