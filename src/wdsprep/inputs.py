"""The one rule that says whether the native inputs of a conversion unit changed.

A source declares which inputs feed each of its plan items (`Source.inputs(item)`): local file
paths, or `(archive, member)` pairs for members of a zip archive. The driver fingerprints every
input with the rule below, once per input however many units share it (in `--workers` processes
when there are many: `unit_input_fingerprints`), and folds the fingerprints of a unit's inputs into
the unit's digest. A changed input therefore rebuilds exactly the units it
feeds, and nothing else.

- mode `content`: the size and sha256 of the bytes the source reads (a file, or a zip member's
  uncompressed bytes), at the cost of one more read of the input when planning. It does not depend
  on where the input lies, so the same data in another directory or layout has the same manifest
  `fingerprint` (the units are rebuilt all the same: their items name the paths);
- mode `stat`, a file: size, mtime_ns, ctime_ns and inode. The kernel sets ctime on every write and
  user space cannot set it back, so an in-place edit is seen even at equal size and a restored
  mtime; a chmod, a hard link or a copy also counts as a change (a needless rebuild, never a stale
  shard);
- mode `stat`, a zip member: its size and CRC-32 from the archive's central directory, a content
  checksum the archive carries already and that `zipfile` checks on every read of the member.

A source's default mode is its `fingerprint` attribute (`content` where the inputs are small or
read while planning anyway, `stat` where hashing would re-read the whole input); `wdsprep convert
--fingerprint content|stat` overrides it. An input that cannot be read is an `InputError` naming it.
"""
from __future__ import annotations

import hashlib
import os
import stat as stat_module
import zipfile
import zlib
from typing import Any, Iterable

from .errors import ConfigError, InputError
from .storage import file_sha256

MODES = ("content", "stat")


class InputFingerprints:
    """Fingerprints of native inputs under one mode, memoized per input."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise ConfigError(f"--fingerprint must be one of {', '.join(MODES)} (got {mode!r})")
        self.mode = mode
        self._files: dict[str, list] = {}
        self._members: dict[tuple[str, str], list] = {}
        self._archives: dict[str, zipfile.ZipFile] = {}

    def of(self, refs: Iterable[Any]) -> list:
        """The fingerprints of `refs`, in order (a ref: a path, or an (archive, member) pair)."""
        return [self._member(*ref) if isinstance(ref, (tuple, list)) else self._file(ref) for ref in refs]

    def _file(self, path: str) -> list:
        path = os.fspath(path)
        if path not in self._files:
            self._files[path] = self._compute(path)
        return self._files[path]

    def _compute(self, path: str) -> list:
        try:
            info = os.stat(path)
            if not stat_module.S_ISREG(info.st_mode):
                raise InputError(f"{path}: not a regular file")
            if self.mode == "content":
                return [info.st_size, file_sha256(path)]
            return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
        except FileNotFoundError:
            dangling = os.path.islink(path)
            raise InputError(f"{path}: {'dangling symbolic link' if dangling else 'no such file'}") from None
        except OSError as error:
            raise InputError(f"{path}: cannot read ({error.strerror or error})") from None

    def _member(self, archive: str, member: str) -> list:
        if (archive, member) not in self._members:
            self._members[archive, member] = self._compute_member(archive, member)
        return self._members[archive, member]

    def _compute_member(self, archive: str, member: str) -> list:
        try:
            if archive not in self._archives:
                self._archives[archive] = zipfile.ZipFile(archive)
            handle = self._archives[archive]
            info = handle.getinfo(member)  # the last of repeated names, as zipfile reads it
            if self.mode == "stat":
                return [info.file_size, info.CRC]
            digest = hashlib.sha256()
            with handle.open(info) as stream:  # checks the CRC-32 at the end
                while block := stream.read(1 << 20):
                    digest.update(block)
            return [info.file_size, digest.hexdigest()]
        except KeyError:
            raise InputError(f"{archive}: no member {member}") from None
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError) as error:
            # RuntimeError: an encrypted member; NotImplementedError: a compression zipfile lacks
            raise InputError(f"{archive}: member {member}: corrupt or unreadable ({error})") from None

    def close(self) -> None:
        for handle in self._archives.values():
            handle.close()
        self._archives.clear()


PARALLEL_INPUTS = 20_000  # fewer inputs are fingerprinted in the driver: starting processes would cost more
CHUNKS_PER_WORKER = 8  # consecutive units per task: a slow chunk (large files) does not hold the rest


def unit_input_fingerprints(source, units, mode: str, workers: int = 1) -> list[str]:
    """Per unit, a digest of the fingerprints of every input that feeds it. With `workers` > 1 and at
    least `PARALLEL_INPUTS` inputs, chunks of consecutive units are fingerprinted in that many
    processes (10^6 tiny files: one stat and one read each, serial in the driver before any unit was
    built); the digests, and the first unreadable input named, are the same either way."""
    refs = [[ref for item in unit.items for ref in source.inputs(item)] for unit in units]
    if workers <= 1 or sum(map(len, refs)) < PARALLEL_INPUTS:
        return fingerprint_units(refs, mode)
    from .executors import process_pool  # workers that leave Ctrl-C to the driver

    size = max(1, -(-len(refs) // (workers * CHUNKS_PER_WORKER)))
    chunks = [refs[start : start + size] for start in range(0, len(refs), size)]
    with process_pool(min(workers, len(chunks))) as pool:
        return [digest for digests in pool.map(fingerprint_units, chunks, [mode] * len(chunks)) for digest in digests]


def fingerprint_units(refs: list[list], mode: str) -> list[str]:
    """Per unit, the digest of its inputs' fingerprints (`refs`: each unit's inputs, in order); an
    input shared by several units is fingerprinted once."""
    fingerprints = InputFingerprints(mode)
    digests = []
    try:
        for unit_refs in refs:
            digest = hashlib.sha256(mode.encode())
            for entry in fingerprints.of(unit_refs):
                digest.update(repr(entry).encode() + b"\n")
            digests.append(digest.hexdigest())
    finally:
        fingerprints.close()
    return digests
