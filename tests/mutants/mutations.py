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
    # -- issue 25: RawNIND equal to the legacy loaders (tests/rawnind/test_rawnind_upstream.py)
    Mutation("rawnind-odd-shift-rounded-even", "the clean target shifted by the shift rounded down to even",
             "src/wdsprep/sources/rawnind/read.py",
             (("x_source, x_starts, y_source = gt, [(y + dy, x + dx) for y, x in starts], y_capture",
               "x_source, x_starts, y_source = gt, [(y + dy - dy % 2, x + dx - dx % 2) for y, x in starts], y_capture"),),
             ("tests/rawnind/test_rawnind_upstream.py::test_registration_is_as_good_on_odd_shifts_as_on_even",)),
    Mutation("rawnind-loss-on-grey", "best_alignment_loss on the channel-mean grey image", "src/wdsprep/sources/rawnind/metadata.py",
             (("(dy, dx), alignment_loss = refine_alignment(gt_rgb, matched, estimate)",
               "(dy, dx), alignment_loss = refine_alignment(gt_rgb.mean(axis=0), matched.mean(axis=0), estimate)"),),
             ("tests/rawnind/test_rawnind_upstream.py::test_alignment_loss_and_filter_are_upstreams",)),
    Mutation("rawnind-clean-clean-dropped", "no clean-clean pairs", "src/wdsprep/sources/rawnind/metadata.py",
             (("for y_clean, count in ((True, clean_count), (False, noisy_count))",
               "for y_clean, count in ((False, noisy_count),)"),),
             ("tests/rawnind/test_rawnind_upstream.py::test_pair_lists_per_split_are_upstreams",)),
    Mutation("rawnind-first-reference-only", "only the first clean capture is a reference", "src/wdsprep/sources/rawnind/metadata.py",
             (("return [(gt, y_clean, y) for gt in range(clean_count)", "return [(gt, y_clean, y) for gt in range(min(clean_count, 1))"),),
             ("tests/rawnind/test_rawnind_upstream.py::test_pair_lists_per_split_are_upstreams",)),
    Mutation("rawnind-val-at-tile-centre", "the validation crop at the centre of the tile, not of the aligned pre-crop",
             "src/wdsprep/sources/rawnind/read.py",
             (("            y0, x0, height, width = aligned_precrop(sample[\"meta\"], n, pairing)\n            if crop_size == 0:\n                shape, origin",
               "            y0, x0, height, width = (0, 0, *sample[\"meta\"][\"tile_size\"])\n            if crop_size == 0:\n                shape, origin"),),
             ("tests/rawnind/test_rawnind_upstream.py::test_validation_and_test_crops_are_where_upstream_takes_them",)),
    Mutation("rawnind-precrop-stride", "pre-crops on a stride of 1024 (no overlap) instead of 1024 - 256",
             "src/wdsprep/sources/rawnind/convert.py",
             (("        x += PRECROP_RAW_SIZE - PRECROP_TRAIN_SIZE", "        x += PRECROP_RAW_SIZE"),),
             ("tests/rawnind/test_rawnind_upstream.py::test_validation_and_test_crops_are_where_upstream_takes_them",)),
    Mutation("rawnind-bilinear-target", "the clean target demosaiced bilinearly instead of with upstream's EA",
             "src/wdsprep/sources/rawnind/read.py",
             (("            rgb = demosaic_ea(mono, ea_scale(*(ranges[2:] if legacy else ranges[:2])))",
               "            from .raw import demosaic_padded\n            rgb = demosaic_padded(np.pad(mono.astype(np.float64), 1, mode=\"reflect\"))"),),
             ("tests/rawnind/test_rawnind_mosaic.py::test_rgb_input_reference",)),
    # -- issue #29: shards every common reader can open (plain arrays, one schema per split, the field table)
    Mutation("rays-column-left-out", "a per-ray column (view_ids) left out of the rays .npz",
             "src/wdsprep/sources/voxels/convert.py",
             (("    per_ray = list(RAY_FIELDS) + sorted(", "    per_ray = list(RAY_FIELDS[:-1]) + sorted("),),
             ("tests/voxels/test_voxels_convert.py",)),
    Mutation("packbits-table-wrong", "the field table states the wrong bit order for the packed voxels",
             "src/wdsprep/sources/voxels/convert.py",
             (('    "bitorder": "big",', '    "bitorder": "little",'),),
             ("tests/core/test_interop.py",)),
    Mutation("absent-column-other-dtype", "a ray file's absent face_ids/view_ids written as int64, not the declared int32",
             "src/wdsprep/sources/voxels/convert.py",
             (("else np.zeros(0, ABSENT_RAY_DTYPE)) for name in names", "else np.zeros(0, np.int64)) for name in names"),),
             ("tests/core/test_interop.py",)),
    Mutation("label-rank-varies", "a single 3-D label stored 3-D (the split's labels differ in rank)",
             "src/wdsprep/sources/deepreg/convert.py",
             (("            array = array[..., None]  # (X, Y, Z, 1)", "            pass  # (X, Y, Z, 1)"),),
             ("tests/core/test_interop.py",)),
    Mutation("ragged-offset-off-by-one", "the reader slices a ragged group at the previous volume's offset",
             "src/wdsprep/sources/deepreg/read.py",
             (("for shape in shapes[:position])", "for shape in shapes[:max(position - 1, 0)])"),),
             ("tests/core/test_interop.py",)),
    Mutation("zst-handler-unregistered", "`import wdsprep` leaves webdataset's .decode() without the .zst handler",
             "src/wdsprep/__init__.py",
             (("register_webdataset_decoder()  # plain", "# register_webdataset_decoder()  # plain"),),
             ("tests/core/test_interop.py",)),
    Mutation("field-table-merge-keeps-first", "the field table keeps the first sample's shape (a varying dimension looks fixed)",
             "src/wdsprep/shards/manifest.py",
             (("        merged[\"shape\"] = [x if x == y else None for x, y in zip(a[\"shape\"], b[\"shape\"])]",
               "        merged[\"shape\"] = list(a[\"shape\"])"),),
             ("tests/core/test_interop.py",)),
    # -- issue 28: `wdsprep show` (pictures checked by pixel, picks by seed, only the picked bytes fetched)
    Mutation("show-slice-transposed", "a mid-slice drawn transposed (rows and columns swapped)",
             "src/wdsprep/show/picture.py",
             (("    return np.take(volume, volume.shape[axis] // 2, axis=axis)",
               "    return np.take(volume, volume.shape[axis] // 2, axis=axis).T"),),
             ("tests/show/test_show_pictures.py",)),
    Mutation("show-slice-off-middle", "the mid-slice taken one off the middle", "src/wdsprep/show/picture.py",
             (("    return np.take(volume, volume.shape[axis] // 2, axis=axis)",
               "    return np.take(volume, volume.shape[axis] // 2 - 1, axis=axis)"),),
             ("tests/show/test_show_pictures.py",)),
    Mutation("show-pick-ignores-seed", "samples drawn without the seed (the same for every --seed)",
             "src/wdsprep/show/report.py",
             (("rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(split.encode())])",
               "rng = np.random.default_rng([0, zlib.crc32(split.encode())])"),),
             ("tests/show/test_show_fetch.py",)),
    Mutation("show-pick-first-n", "the first N samples shown instead of N drawn by the seed",
             "src/wdsprep/show/report.py",
             (("    return sorted(int(i) for i in rng.choice(total, size=min(count, total), replace=False))",
               "    return list(range(min(count, total)))"),),
             ("tests/show/test_show_fetch.py",)),
    Mutation("show-locate-off-by-one", "a split's sample number mapped to the wrong shard at a shard boundary",
             "src/wdsprep/show/report.py",
             (('shard = int(np.searchsorted(ends, number, side="right"))', 'shard = int(np.searchsorted(ends, number, side="left"))'),),
             ("tests/show/test_show_fetch.py",)),
    Mutation("show-label-not-outlined", "deepreg labels not outlined", "src/wdsprep/sources/deepreg/show.py",
             (("            cells[edge] = OUTLINE\n", "            pass\n"),),
             ("tests/show/test_show_pictures.py",)),
    Mutation("show-label-filled", "the label drawn filled instead of outlined", "src/wdsprep/show/picture.py",
             (("    return inside & ~interior", "    return inside"),),
             ("tests/show/test_show_pictures.py",)),
    Mutation("show-minecraft-bottom-block", "minecraft seen from below (the lowest solid block of a column)",
             "src/wdsprep/sources/minecraft/show.py",
             (("    top = height - 1 - np.argmax(solid[:, ::-1, :], axis=1)", "    top = np.argmax(solid, axis=1)"),),
             ("tests/show/test_show_pictures.py",)),
    Mutation("show-hits-wrong-axes", "ray hits drawn with their axes swapped", "src/wdsprep/sources/voxels/show.py",
             (("                          dots=found[:, 1:]))", "                          dots=found[:, :0:-1]))"),),
             ("tests/show/test_show_pictures.py",)),
    Mutation("show-reads-whole-shard", "a picked sample read by an open-ended request (the rest of the shard)",
             "src/wdsprep/storage/http.py",
             (('            request.add_header("Range", f"bytes={offset}-{max(end, offset + 1) - 1}")',
               '            request.add_header("Range", f"bytes={offset}-")'),),
             ("tests/show/test_show_fetch.py",)),
    Mutation("show-s3-reads-whole-shard", "a picked sample read from S3 by an open-ended request",
             "src/wdsprep/storage/s3.py",
             (('            kwargs["Range"] = f"bytes={offset}-{max(end, offset + 1) - 1}"',
               '            kwargs["Range"] = f"bytes={offset}-"'),),
             ("tests/show/test_show_fetch.py",)),
    Mutation("show-range-one-byte-long", "a bounded HTTP range asks for one byte past its end", "src/wdsprep/storage/http.py",
             (('            request.add_header("Range", f"bytes={offset}-{max(end, offset + 1) - 1}")',
               '            request.add_header("Range", f"bytes={offset}-{max(end, offset + 1)}")'),),
             ("tests/show/test_show_fetch.py",)),
    Mutation("show-split-count-wrong", "the page's per-split sample count is the number of shards",
             "src/wdsprep/show/report.py",
             (("""f'<td class=n data-count="split-samples">{sum(row["samples"] for row in rows)}</td>'""",
               """f'<td class=n data-count="split-samples">{len(rows)}</td>'"""),),
             ("tests/show/test_show_pictures.py", "tests/show/test_show_browser.py")),
    Mutation("show-no-pillow-traceback", "without Pillow, a traceback instead of the extra to install",
             "src/wdsprep/show/picture.py",
             (("    except ImportError:\n        raise ConfigError(", "    except KeyError:\n        raise ConfigError("),),
             ("tests/show/test_show_fetch.py",)),
]
