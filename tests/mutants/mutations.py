"""The planted bugs of issue #13, one `Mutation` each: a file, the exact snippet(s) to replace, and the
test paths that must catch it. Snippets must occur exactly once in the file; when the code moves on,
`run.py` says "snippet not found" for the entry instead of passing silently: re-target that entry.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    id: str
    bug: str
    file: str
    edits: tuple  # ((old, new), ...) applied in order, each old snippet exactly once in the file
    tests: tuple  # test paths (folders or files) run against the mutated copy


PLAN = "src/wdsprep/stream/plan.py"
DATASET = "src/wdsprep/stream/dataset.py"
CORE = ("tests/core",)

MUTATIONS = [
    # -- the stream plan
    Mutation("seed-epoch-mixed", "seed and epoch mixed: (s, e+1) == (s+1, e)", PLAN,
             (("np.random.PCG64([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED])",
               "np.random.PCG64([(seed + epoch) & 0xFFFFFFFF, 0x5EED])"),), CORE),
    Mutation("deal-by-shard-count", "shards dealt by shard count instead of sample count", PLAN,
             (("totals[slot] += counts[shard]", "totals[slot] += 1"),), CORE),
    Mutation("last-rank-starved", "the last rank never gets a shard", PLAN,
             (("slot = min(range(slots), key=lambda s: (totals[s], s))",
               "slot = min(range(max(slots - 1, 1)), key=lambda s: (totals[s], s))"),), CORE),
    Mutation("drop-one-too-many", "equalize='drop' drops one sample too many", PLAN,
             (("return _take(mine, min(totals))", "return _take(mine, min(totals) - 1)"),), CORE),
    Mutation("pad-one-too-many", "equalize='pad' pads one sample too many", PLAN,
             (("return mine + _cycle(source, target - own)", "return mine + _cycle(source, target - own + 1)"),), CORE),
    Mutation("pad-from-global-order", "padding taken from the global order, not the rank's own samples", PLAN,
             (("source = mine if own else _pieces(order, counts)", "source = _pieces(order, counts)"),), CORE),
    Mutation("state-after-resume", "the state saved after a resume is wrong (positions restart at 0)", DATASET,
             (("counter.pulled = resume.skip", "counter.pulled = 0"),), CORE),
    Mutation("short-shard-silent", "a shard shorter than its manifest row is not reported", DATASET,
             (("if self.check_counts and got < expected:", "if False:"),), CORE),
    Mutation("buffer-ignores-epoch", "the shuffle buffer ignores the epoch", DATASET,
             (("np.random.PCG64([self.seed, self.epoch, *worker_key, block])",
               "np.random.PCG64([self.seed, *worker_key, block])"),), CORE),
    Mutation("state-other-seed", "load_state_dict accepts a state from another seed", DATASET,
             (('for name in ("seed", "world_size", "split", "shards"):', 'for name in ("world_size", "split", "shards"):'),), CORE),
    # -- the format
    Mutation("checksum-unchecked", "tar header checksum not checked", "src/wdsprep/shards/tarformat.py",
             (("        if checksum != computed:\n            raise ShardError(url, \"corrupt tar header (checksum mismatch)\")",
               "        if False:\n            raise ShardError(url, \"corrupt tar header (checksum mismatch)\")"),), CORE),
    Mutation("seek-past-truncation", "skipping seeks past the end of a truncated shard", "src/wdsprep/shards/tarformat.py",
             (("if end > length:", "if False:"),), CORE),
    Mutation("npy-zst-truncation-silent", "a truncated .npy.zst is returned silently", "src/wdsprep/shards/codec.py",
             (('                raise FormatError(f"truncated .npy.zst data ({filled} of {len(view)} bytes)")',
               "                break"),), CORE),
    Mutation("fortran-read-as-c", "Fortran-order .npy read in C order", "src/wdsprep/shards/codec.py",
             (('return array.reshape(shape, order="F" if fortran else "C")', 'return array.reshape(shape, order="C")'),
              ('array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")', 'array = np.empty(shape, dtype=dtype, order="C")')),
             CORE),
    Mutation("size-bound-without-end-blocks", "the shard size bound ignores the end blocks", "src/wdsprep/shards/writer.py",
             (("self._size + sample_size + len(tarformat.END_OF_ARCHIVE) > self.shard_bytes",
               "self._size + sample_size > self.shard_bytes"),), CORE),
    # -- conversion
    Mutation("old-manifest-visible", "the old manifest stays visible during a re-run", "src/wdsprep/conversion.py",
             (("        store.delete(MANIFEST_NAME)  # about to change: never leave a manifest that may lie",
               "        pass"),), CORE),
    Mutation("stale-shards-kept", "stale shards are never removed", "src/wdsprep/conversion.py",
             (("    _remove_stale_shards(store, splits)\n", "    pass\n"),), CORE),
    # -- upload
    Mutation("upload-retries-one-short", "upload retries off by one (one attempt too few)", "src/wdsprep/upload.py",
             (("for attempt in range(retries + 1):", "for attempt in range(retries):"),), ("tests/objectstore",)),
    Mutation("upload-retries-one-extra", "upload retries off by one (one attempt too many)", "src/wdsprep/upload.py",
             (("for attempt in range(retries + 1):", "for attempt in range(retries + 2):"),
              ("        if attempt < retries:\n", "        if attempt < retries + 1:\n")), ("tests/objectstore",)),
    Mutation("upload-no-hash-check", "no hash check after upload", "src/wdsprep/upload.py",
             (('            if got == row["sha256"]:', "            if True:"),), ("tests/objectstore",)),
    Mutation("upload-file-not-atomic", "a non-atomic file:// upload (written in place)", "src/wdsprep/upload.py",
             (('    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")',
               "    tmp = os.path.join(directory, name)\n    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)"),
              ("        if os.path.exists(tmp):\n            os.unlink(tmp)", "        if False:\n            os.unlink(tmp)")),
             ("tests/objectstore",)),
    # -- the timing-free concurrency test (not in #13's list: checks the rewritten test bites)
    Mutation("fetch-one-at-a-time", "rawnind fetch ignores --concurrency (one download at a time)",
             "src/wdsprep/sources/rawnind/fetch.py",
             (("for _ in range(self.options.concurrency):", "for _ in range(1):"),),
             ("tests/rawnind/test_rawnind_fetch.py",)),
]
