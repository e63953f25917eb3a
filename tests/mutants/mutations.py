"""The planted bugs of issue #13, one `Mutation` each: the exact snippet(s) to replace in a file, and
the test paths that must catch it. Snippets must occur exactly once in the file. Where the code is
being rewritten, an entry lists `also` variants (the same bug in the new code, e.g. the sample-exact
stream plan of branch h3-distribution); `run.py` applies the first variant whose snippets all match,
and says "snippet not found" when none does, instead of passing silently: re-target that entry.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    label: str  # which code it targets ("main", "h3", ...)
    file: str
    edits: tuple  # ((old, new), ...) applied in order, each old snippet exactly once in the file


@dataclass(frozen=True)
class Mutation:
    id: str
    bug: str
    file: str
    edits: tuple
    tests: tuple  # test paths (folders or files) run against the mutated copy
    also: tuple = ()  # further Variants, tried in order after (file, edits)

    @property
    def variants(self) -> tuple:
        return (Variant("main", self.file, self.edits), *self.also)


PLAN = "src/wdsprep/stream/plan.py"
DATASET = "src/wdsprep/stream/dataset.py"
CORE = ("tests/core",)
# the most relevant file first (pytest -x stops at the first failure), then the whole folder
ORACLE = ("tests/core/test_plan_oracle.py", "tests/core")
FORMAT = ("tests/core/test_format_oracle.py", "tests/core")
CONVERSION = ("tests/core/test_conversion_oracle.py", "tests/core")
UPLOAD = ("tests/objectstore/test_upload_oracle.py", "tests/objectstore")

MUTATIONS = [
    # -- the stream plan
    Mutation("seed-epoch-mixed", "seed and epoch mixed: (s, e+1) == (s+1, e)", PLAN,
             (("np.random.PCG64([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED])",
               "np.random.PCG64([(seed + epoch) & 0xFFFFFFFF, 0x5EED])"),), ORACLE),
    Mutation("deal-by-shard-count", "shards dealt by shard count instead of sample count", PLAN,
             (("totals[slot] += counts[shard]", "totals[slot] += 1"),), ORACLE,
             also=(Variant("h3", PLAN, (("    total = len(sequence)\n    start, stop = share(total, world_size, rank)", "    total = len(sequence.pieces)\n    start, stop = share(total, world_size, rank)"),)),)),
    Mutation("last-rank-starved", "the last rank never gets a shard", PLAN,
             (("slot = min(range(slots), key=lambda s: (totals[s], s))",
               "slot = min(range(max(slots - 1, 1)), key=lambda s: (totals[s], s))"),), ORACLE,
             also=(Variant("h3", PLAN, (("    start, stop = share(total, world_size, rank)\n", "    start, stop = share(total, max(world_size - 1, 1), rank) if rank < world_size - 1 else (total, total)\n"),)),)),
    Mutation("drop-one-too-many", "equalize='drop' drops one sample too many", PLAN,
             (("return _take(mine, min(totals))", "return _take(mine, min(totals) - 1)"),), ORACLE,
             also=(Variant("h3", PLAN, (("return sequence.slice(start, stop - 1), start, stop - start - 1", "return sequence.slice(start, stop - 2), start, stop - start - 2"),)),)),
    Mutation("pad-one-too-many", "equalize='pad' pads one sample too many", PLAN,
             (("return mine + _cycle(source, target - own)", "return mine + _cycle(source, target - own + 1)"),), ORACLE,
             also=(Variant("h3", PLAN, (("return own + sequence.slice(start, start + 1), start, stop - start", "return own + sequence.slice(start, start + 2), start, stop - start"),)),)),
    Mutation("pad-from-global-order", "padding taken from the global order, not the rank's own samples", PLAN,
             (("source = mine if own else _pieces(order, counts)", "source = _pieces(order, counts)"),), ORACLE,
             also=(Variant("h3", PLAN, (("return own + sequence.slice(start, start + 1), start, stop - start", "return own + sequence.slice(0, 1), start, stop - start"),)),)),
    Mutation("state-after-resume", "the state saved after a resume is wrong (positions restart at 0)", DATASET,
             (("counter.pulled = resume.skip", "counter.pulled = 0"),), ORACLE),
    Mutation("short-shard-silent", "a shard shorter than its manifest row is not reported", DATASET,
             (("if self.check_counts and got < expected:", "if False:"),), FORMAT,
             also=(Variant("h1", "src/wdsprep/stream/read.py", (('    if "samples" in row and count != row["samples"]:', "    if False:"),)),)),
    Mutation("buffer-ignores-epoch", "the shuffle buffer ignores the epoch", DATASET,
             (("np.random.PCG64([self.seed, self.epoch, *worker_key, block])",
               "np.random.PCG64([self.seed, *worker_key, block])"),), ORACLE,
             also=(Variant("h3", PLAN, (("np.random.PCG64([seed, epoch, rank, worker, block])", "np.random.PCG64([seed, rank, worker, block])"),)),)),
    Mutation("state-other-seed", "load_state_dict accepts a state from another seed", DATASET,
             (('for name in ("seed", "world_size", "split", "shards"):', 'for name in ("world_size", "split", "shards"):'),), ORACLE,
             also=(Variant("h3", DATASET, (('for name in ("split", "seed", "dataset", "shuffle_shards", "shuffle_buffer", "equalize"):', 'for name in ("split", "dataset", "shuffle_shards", "shuffle_buffer", "equalize"):'),)),)),
    # -- the format
    Mutation("checksum-unchecked", "tar header checksum not checked", "src/wdsprep/shards/tarformat.py",
             (("        if checksum != computed:\n            raise ShardError(url, \"corrupt tar header (checksum mismatch)\")",
               "        if False:\n            raise ShardError(url, \"corrupt tar header (checksum mismatch)\")"),), FORMAT,
             also=(Variant("h1", "src/wdsprep/shards/tarformat.py", (("    if stored != _byte_sum(block) - sum(block[148:156]) + 256:", "    if False:"),)),)),
    Mutation("seek-past-truncation", "skipping seeks past the end of a truncated shard", "src/wdsprep/shards/tarformat.py",
             (("if end > length:", "if False:"),), FORMAT,
             also=(Variant("h1", "src/wdsprep/shards/tarformat.py", (("            if self.offset + count > self._stream_length():", "            if False:"),)),)),
    Mutation("npy-zst-truncation-silent", "a truncated .npy.zst is returned silently", "src/wdsprep/shards/codec.py",
             (('                raise FormatError(f"truncated .npy.zst data ({filled} of {len(view)} bytes)")',
               "                break"),), FORMAT,
             also=(Variant("h1", "src/wdsprep/shards/codec.py", (('            raise FormatError(f"truncated {what} ({filled} of {len(view)} bytes)")', "            break"),)),)),
    Mutation("fortran-read-as-c", "Fortran-order .npy read in C order", "src/wdsprep/shards/codec.py",
             (('return array.reshape(shape, order="F" if fortran else "C")', 'return array.reshape(shape, order="C")'),
              ('array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")', 'array = np.empty(shape, dtype=dtype, order="C")')),
             FORMAT,
             also=(Variant("h15", "src/wdsprep/shards/codec.py", (
                 ('parsed = (shape, dtype, offset, fortran, count * dtype.itemsize)',
                  'parsed = (shape, dtype, offset, False, count * dtype.itemsize)'),
                 ('array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")', 'array = np.empty(shape, dtype=dtype, order="C")'))),)),
    Mutation("size-bound-without-end-blocks", "the shard size bound ignores the end blocks", "src/wdsprep/shards/writer.py",
             (("self._size + sample_size + len(tarformat.END_OF_ARCHIVE) > self.shard_bytes",
               "self._size + sample_size > self.shard_bytes"),), FORMAT,
             also=(Variant("h1", "src/wdsprep/shards/writer.py", (("tail = self._index.bound + entry_bound + len(tarformat.END_OF_ARCHIVE)", "tail = self._index.bound + entry_bound"),)),)),
    # -- conversion
    Mutation("old-manifest-visible", "the old manifest stays visible during a re-run", "src/wdsprep/conversion.py",
             (("        store.delete(MANIFEST_NAME)  # about to change: never leave a manifest that may lie",
               "        pass"),), CONVERSION),
    Mutation("stale-shards-kept", "stale shards are never removed", "src/wdsprep/conversion.py",
             (("    _remove_stale_shards(store, splits)\n", "    pass\n"),), CONVERSION),
    # -- upload
    Mutation("upload-retries-one-short", "upload retries off by one (one attempt too few)", "src/wdsprep/upload.py",
             (("for attempt in range(retries + 1):", "for attempt in range(retries):"),), UPLOAD),
    Mutation("upload-retries-one-extra", "upload retries off by one (one attempt too many)", "src/wdsprep/upload.py",
             (("for attempt in range(retries + 1):", "for attempt in range(retries + 2):"),
              ("        if attempt < retries:\n", "        if attempt < retries + 1:\n")), UPLOAD),
    Mutation("upload-no-hash-check", "no hash check after upload", "src/wdsprep/upload.py",
             (('            if got == row["sha256"]:', "            if True:"),), UPLOAD),
    Mutation("upload-file-not-atomic", "a non-atomic file:// upload (written in place)", "src/wdsprep/upload.py",
             (('    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")',
               "    tmp = os.path.join(directory, name)\n    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)"),
              ("        if os.path.exists(tmp):\n            os.unlink(tmp)", "        if False:\n            os.unlink(tmp)")),
             UPLOAD,
             also=(Variant("storage", "src/wdsprep/storage/base.py", (
                 ('        temporary = os.path.join(self.staging_dir(), f".{name}.{secrets.token_hex(4)}.tmp")',
                  "        temporary = os.path.join(self.staging_dir(), name)"),
                 ("os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)\n            with os.fdopen(fd, \"wb\") as out",
                  "os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)\n            with os.fdopen(fd, \"wb\") as out"),
                 ("        except OSError as error:\n            remove_quietly(temporary)\n", "        except OSError as error:\n"))),)),
    # -- the source conformance suite (wdsprep.testing.conformance), through one source's subclass
    Mutation("codec-level-by-workers", "a pool worker compresses at another zstd level (bytes depend on --workers)",
             "src/wdsprep/conversion.py",
             (('    encoder = Encoder(options["codec"], options["zstd_level"])',
               '    import multiprocessing\n'
               '    encoder = Encoder(options["codec"], options["zstd_level"] + (multiprocessing.parent_process() is not None))'),),
             ("tests/voxels/test_voxels_conformance.py",)),
    Mutation("content-fingerprint-is-stat", "the content fingerprint of a file is its size and mtime only",
             "src/wdsprep/inputs.py",
             (("return [info.st_size, file_sha256(path)]", "return [info.st_size, info.st_mtime_ns]"),),
             ("tests/core/test_generic_conformance.py",)),  # generic: files fingerprinted by content
    # -- the timing-free concurrency test (not in #13's list: checks the rewritten test bites)
    Mutation("fetch-one-at-a-time", "rawnind fetch ignores --concurrency (one download at a time)",
             "src/wdsprep/sources/rawnind/fetch.py",
             (("for _ in range(self.options.concurrency):", "for _ in range(1):"),),
             ("tests/rawnind/test_rawnind_fetch.py",)),
    # -- issue 26: the remote read-ahead (stream/remote.py, storage/ranges.py, storage/http.py, storage/s3.py)
    Mutation("remote-piece-from-byte-0", "a piece that starts mid-shard is fetched from byte 0 (the bytes before it read and dropped)",
             "src/wdsprep/stream/remote.py",
             (("        return index.offsets[self.start], end", "        return 0, end"),),
             ("tests/objectstore/test_read_ahead.py",)),
    Mutation("remote-budget-ignored", "the read-ahead ignores its byte budget (fetches as far ahead as the link allows)",
             "src/wdsprep/stream/remote.py",
             (("if self.held == 0 or self.held + r.size <= self.budget or r.urgent:", "if True:"),),
             ("tests/objectstore/test_read_ahead.py",)),
    Mutation("remote-connections-unbounded", "the read-ahead opens twice max_connections requests at once",
             "src/wdsprep/stream/remote.py",
             (("for i in range(max_connections if self.jobs else 0)]", "for i in range(2 * max_connections if self.jobs else 0)]"),),
             ("tests/objectstore/test_read_ahead.py",)),
    Mutation("remote-one-connection", "the read-ahead sends one request at a time (nothing in parallel)",
             "src/wdsprep/stream/remote.py",
             (("for i in range(max_connections if self.jobs else 0)]", "for i in range(1 if self.jobs else 0)]"),),
             ("tests/objectstore/test_read_ahead.py",)),
    Mutation("remote-index-trusted", "the read-ahead trusts the index it fetched (not checked against the manifest row)",
             "src/wdsprep/stream/remote.py",
             (("    index = ShardIndex.from_tail(url, row, bytes(tail))",
               "    from ..shards.index import digest_text\n"
               "    index = ShardIndex.from_tail(url, {**row, \"index_digest\": digest_text(bytes(tail)[: row[\"index_bytes\"]])}, bytes(tail))"),),
             ("tests/core/test_integrity.py",)),
    Mutation("read-ahead-member-unchecked", "a member read from the read-ahead's blocks is yielded without its digest check",
             "src/wdsprep/stream/read.py",
             (("            if digest_of(span) != expected:\n", "            if False:\n"),),
             ("tests/core/test_integrity.py",)),
    Mutation("streamed-member-unchecked", "a member read from a sequential stream is yielded without its digest check",
             "src/wdsprep/stream/read.py",
             (("            if digest.intdigest() != expected:\n", "            if False:\n"),),
             ("tests/objectstore/test_read_ahead.py",)),
    Mutation("range-resumed-from-its-start", "a dropped range is re-requested from its start, not its first missing byte",
             "src/wdsprep/storage/ranges.py",
             (("body, total, etag = open_range(start + got, stop)", "body, total, etag = open_range(start, stop)"),),
             ("tests/objectstore/test_objectstore_stream.py", "tests/objectstore/test_read_ahead.py")),
    Mutation("range-rate-unchecked", "a ranged read that trickles is never cut (no minimum rate)",
             "src/wdsprep/storage/ranges.py",
             (("                    if arrived < MIN_RATE * waited:\n", "                    if False:\n"),),
             ("tests/objectstore/test_read_ahead.py",)),
    Mutation("range-size-unchecked", "a ranged response's total size is not compared with the manifest row",
             "src/wdsprep/storage/ranges.py",
             (("if self.total is not None and total is not None and total != self.total:", "if False:"),),
             ("tests/objectstore/test_read_ahead.py",)),
    Mutation("http-connection-not-reused", "an http body read to its end drops its connection (a new one per request)",
             "src/wdsprep/storage/http.py",
             (("            for _ in self._chunks:  # the end of the message (no more bytes): the pool keeps the connection\n                pass\n",
               "            pass\n"),),
             ("tests/objectstore/test_read_ahead.py",)),
    Mutation("s3-client-per-request", "a new S3 client (and connection pool) for every request",
             "src/wdsprep/storage/s3.py",
             (("    if held is not None and held[0] >= wanted:\n        return held[1]\n", ""),
              ("        if held is None or held[0] < wanted:\n", "        if True:\n")),
             ("tests/objectstore/test_read_ahead.py",)),
]
