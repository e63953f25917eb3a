"""Key files (`keys=PATH`, `--keys FILE`, a mix part's `keys = "..."`) are data from anywhere: read as
regular files only, bounded by what the split's keys can fill, as strict UTF-8, and no error shows
the file's text beyond a well-formed key (escaped, cut short).

Shards made by `wdsprep convert`; the keys a selection must keep come from the shards read with
`tarfile`; what a hostile file costs is counted in a child process (`wdsprep.conformance.measured`:
the bytes it read and its peak memory, its address space capped), never timed.
"""
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest

import wdsprep
from tests.timeouts import SUBPROCESS
from wdsprep.conformance import measured, run_cli
from wdsprep.errors import ConfigError

from .shardsets import converted_arrays

LONG_KEY = "a-key-of-sixty-characters-" + "x" * 34  # longer than an error shows of a key
SECRET = "root:$6$saltsalt$Zm9yIHlvdXIgZXllcyBvbmx5IC0gYSBoYXNoIG9mIGEgcGFzc3dvcmQ:19000:0:99999:7:::"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("key-files")
    converted_arrays(root, [f"k{i:02d}" for i in range(12)] + [LONG_KEY], 32, "--shard-bytes", "3KB", seed=11)
    return root


def tar_keys(directory: pathlib.Path) -> list[str]:
    """Every sample key of the split, in manifest order (shard names sort in that order)."""
    keys = []
    for path in sorted(directory.glob("train-*.tar")):
        with tarfile.open(path) as archive:
            keys += list(dict.fromkeys(m.name.split(".", 1)[0] for m in archive.getmembers() if not m.name.startswith("__")))
    return keys


def _one_line(error: BaseException) -> str:
    assert "\n" not in str(error), str(error)
    return str(error)


def test_a_key_file_selects_its_keys_whatever_its_blank_lines_and_line_ends(shards, tmp_path):
    keys = tar_keys(shards / "out")
    wanted = [keys[7], LONG_KEY, keys[2]]
    path = tmp_path / "keys.txt"
    path.write_bytes(f"\n  {wanted[0]}\r\n\n{wanted[1]}\t\n{wanted[2]}\n{wanted[0]}".encode())  # spaces, CRLF, a repeat
    expected = [key for key in keys if key in wanted]
    dataset = wdsprep.dataset(str(shards / "out"), "train", keys=str(path), shuffle_shards=False)
    assert [sample["__key__"] for sample in dataset] == expected
    assert wdsprep.MapDataset(shards / "out", "train", keys=path).keys() == expected
    status, out, err = run_cli("inspect", shards / "out", "--keys", path, "--samples", "0")
    assert status == 0, err
    assert f"train: 4 keys keeps 3 of {len(keys)} samples" in out  # four lines, one key twice


def test_the_first_line_of_a_stranger_file_is_never_shown(shards, tmp_path):
    """A file of secrets given as keys (in-process, `inspect --keys`, a mix file's part): one line
    naming the file, the line and its byte offset, and nothing of the line's text."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\ndaemon:*:19000:0:99999:7:::\n")
    expected = f"keys: line 1 of {secret} (byte 0) is longer than any key of split 'train' "
    with pytest.raises(ConfigError) as raised:
        wdsprep.dataset(str(shards / "out"), "train", keys=str(secret))
    assert _one_line(raised.value).startswith(expected)
    status, _, err = run_cli("inspect", shards / "out", "--keys", secret)
    assert status == 1 and err.splitlines() == [f"wdsprep: error: {raised.value}"]
    mix_file = tmp_path / "mix.toml"
    mix_file.write_text(f'[[part]]\nlocation = "{shards / "out"}"\nkeys = "shadow"\nweight = 1\n')
    with pytest.raises(ConfigError) as raised:
        wdsprep.mix(mix_file)
    assert str(mix_file) in _one_line(raised.value) and expected in str(raised.value)
    for error in (raised.value, err):
        shown = str(error).replace(str(tmp_path), "TMP")  # the test's own paths hold "root" (pytest-of-root)
        assert not any(part in shown for part in ("root", "saltsalt", "Zm9y", "19000", "daemon")), shown


def test_a_well_formed_key_the_split_lacks_is_shown_escaped_and_cut(shards, tmp_path):
    """A line that could be a key but is not one of the split's: named with its line, escaped (a
    terminal escape is not sent raw), cut to 40 characters; others are counted, not shown."""
    path = tmp_path / "keys.txt"
    near_miss = LONG_KEY[:-1] + "y"  # as long as the longest key, not in the split
    path.write_text(f"k03\n\n\x1b[31mred\n{near_miss}\nk99\n")
    with pytest.raises(ConfigError) as raised:
        wdsprep.dataset(str(shards / "out"), "train", keys=str(path))
    assert _one_line(raised.value) == (f"keys: '\\x1b[31mred' (line 3 of {path}) (and 2 more) not in split 'train' "
                                       f"of {shards / 'out' / 'manifest.json'}")
    path.write_text(f"{near_miss}\nk03\n")
    with pytest.raises(ConfigError) as raised:
        wdsprep.dataset(str(shards / "out"), "train", keys=str(path))
    assert _one_line(raised.value).startswith(f"keys: {near_miss[:40]!r}... (line 1 of {path}) not in split 'train'")
    assert near_miss not in str(raised.value)


@pytest.mark.parametrize("content, offset", [("k01\ncaf\xe9\n".encode("latin-1"), 7), (b"k01\n\xff\xfe\x00\x01", 4)])
def test_a_file_that_is_not_utf8_is_one_line_naming_the_byte(shards, tmp_path, content, offset):
    path = tmp_path / "keys.bin"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as raised:
        wdsprep.dataset(str(shards / "out"), "train", keys=str(path))
    assert _one_line(raised.value) == f"keys: the key file {path} is not UTF-8 text (byte {offset})"
    status, _, err = run_cli("inspect", shards / "out", "--keys", path)
    assert status == 1 and err == f"wdsprep: error: {raised.value}\n"


def test_a_line_that_is_not_a_key_is_named_by_its_place(shards, tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("k01\nk02\n../etc/passwd\n")
    with pytest.raises(ConfigError) as raised:
        wdsprep.MapDataset(shards / "out", "train", keys=path)
    assert _one_line(raised.value) == (f"keys: line 3 of {path} (byte 8) is not a sample key (a key has no '.', '/', "
                                       "'\\' or NUL and does not start with '__')")


def test_a_fifo_is_refused_without_waiting_for_a_writer(shards, tmp_path):
    """Nobody writes to the FIFO: a reader that opened it would wait forever (the child's hang guard)."""
    fifo = tmp_path / "keys.fifo"
    os.mkfifo(fifo)
    child = subprocess.run([sys.executable, "-m", "wdsprep", "inspect", str(shards / "out"), "--keys", str(fifo)],
                           capture_output=True, text=True, timeout=SUBPROCESS)
    assert (child.returncode, child.stderr) == (1, f"wdsprep: error: keys: cannot read the key file {fifo} "
                                                   "(a FIFO, not a regular file)\n")
    for directory in (tmp_path,):
        with pytest.raises(ConfigError, match=rf"^keys: cannot read the key file {directory} \(a directory, not a regular file\)$"):
            wdsprep.dataset(str(shards / "out"), "train", keys=str(directory))


@pytest.mark.parametrize("kind", ["device", "sparse"])
def test_an_endless_or_huge_file_is_refused_having_read_almost_nothing(shards, tmp_path, monkeypatch, kind):
    """`/dev/zero` (endless) and a sparse regular file of 4 GiB with no line end, as `inspect --keys`
    in a child process whose address space is capped at 2 GiB: one line, and what it read and its
    memory grew by are a small fraction of the file (a split of 13 keys fills under 64 KiB + 1 KiB)."""
    monkeypatch.setattr(measured, "ADDRESS_SPACE_LIMIT", 2 << 30)
    if kind == "device":
        path, expected = "/dev/zero", "keys: cannot read the key file /dev/zero (a character device, not a regular file)"
    else:
        path = tmp_path / "huge.txt"
        with open(path, "wb") as handle:
            handle.truncate(4 << 30)
        expected = (f"keys: the key file {path} holds more than the 13 keys of split 'train' fill "
                    f"(more than {13 * (len(LONG_KEY) + 2) + 65536} bytes: a key a line, the longest {len(LONG_KEY)} bytes)")
    counts, status, err = measured.run_measured(["inspect", shards / "out", "--keys", path, "--samples", "0"])
    assert status == 0 and counts["status"] == 1, err
    assert err == f"wdsprep: error: {expected}\n"
    assert counts["read_bytes"] < 16 << 20 and counts["rss_growth"] < 64 << 20, counts
