"""Tiny shard sets with exact per-shard sample counts, for the stream tests (written with the public
ShardWriter); small generic inputs converted by the command line (`converted_arrays`); flipping one
byte of each member of a shard set in turn, for the read paths' tests."""
import hashlib
import json
import os
import pathlib
import tarfile

import numpy as np

from wdsprep.errors import ShardError
from wdsprep.shards.codec import Encoder
from wdsprep.shards.manifest import Manifest
from wdsprep.shards.writer import ShardWriter
from wdsprep.conformance import read_manifest


def write_counted_shards(directory, counts, *, split="train", codec="zstd", tag="", pack_rows=None):
    """Shards holding exactly `counts[i]` samples each, plus their manifest; keys `s<shard>x<i>`
    (prefixed by `tag`). A count of 0 is an empty tar (end blocks only) listed with 0 samples. With
    `pack_rows` (codec "none"), the samples are packed (`--pack`), `pack_rows` to a block."""
    os.makedirs(directory, exist_ok=True)
    rows = []
    rng = np.random.default_rng(0)
    for shard, count in enumerate(counts):
        if count == 0:
            name, empty = f"{split}-{shard:05d}-00.tar", b"\0" * 1024
            (directory / name).write_bytes(empty)
            rows.append({"name": name, "samples": 0, "bytes": len(empty), "sha256": hashlib.sha256(empty).hexdigest(), "unit": shard})
            continue
        writer = ShardWriter(str(directory), f"{split}-{shard:05d}", shard_bytes=1 << 40, encoder=Encoder(codec),
                             pack=pack_rows is not None)
        if pack_rows is not None:  # a sample is 160 bytes of .npy and a ~12-byte .mp: the block closes at its pack_rows-th
            writer.block_bytes = 172 * pack_rows - 100
        with writer:
            for i in range(count):
                writer.write(f"{tag}s{shard:02d}x{i:02d}", {"value": rng.standard_normal(8).astype(np.float32), "meta": {"shard": shard, "i": i}})
        rows.extend(dict(row.as_dict(), unit=shard) for row in writer.rows)
    manifest = Manifest("test", {}, "fp", {split: rows})
    (directory / "manifest.json").write_bytes(manifest.dumps())
    return str(directory / "manifest.json")


def converted_arrays(root: pathlib.Path, keys, size: int, *convert_args, seed: int = 0) -> pathlib.Path:
    """`root/in`: a generic input of one float32 array of `size` random values per key (split
    train), converted by `wdsprep convert generic` (with `convert_args`) into `root/out`, returned."""
    from wdsprep.conformance import run_cli

    rng = np.random.default_rng(seed)
    (root / "in" / "train").mkdir(parents=True)
    for key in keys:
        np.save(root / "in" / "train" / f"{key}.array.npy", rng.standard_normal(size).astype(np.float32))
    status, _, err = run_cli("convert", "generic", root / "in", root / "out", "--quiet", *convert_args)
    assert status == 0, err
    return root / "out"


def keys_until_error(samples) -> tuple[list, BaseException | None]:
    """The `__key__` of each sample until a ShardError, and that error (None if none came)."""
    keys: list = []
    try:
        for sample in samples:
            keys.append(sample["__key__"])
    except ShardError as error:
        return keys, error
    return keys, None


def each_member_flipped(directory, pattern="*.tar", keep=None):
    """For each member of each sample of the shards `pattern` names in `directory`, in file order
    (as `tarfile` lists them; `__...__` members are not samples): flip the last byte of its data in
    place (no truncation, so a file a reader holds open stays readable), yield (shard path, sample
    key, member name), then put the byte back. `keep(key, member)` picks members (all by default)."""
    for path in sorted(pathlib.Path(directory).glob(pattern)):
        with tarfile.open(path) as archive:
            members = [m for m in archive.getmembers() if m.isfile() and m.size and not m.name.startswith("__")]
        for member in members:
            key, _, name = member.name.partition(".")
            if keep is not None and not keep(key, name):
                continue
            at = member.offset_data + member.size - 1
            with open(path, "r+b") as handle:
                handle.seek(at)
                byte = handle.read(1)[0]
                handle.seek(at)
                handle.write(bytes([byte ^ 0x01]))
            try:
                yield path, key, name
            finally:
                with open(path, "r+b") as handle:
                    handle.seek(at)
                    handle.write(bytes([byte]))


def same_until_error(items, expected, same) -> tuple[int, BaseException | None]:
    """Compare each item with the next of `expected` (`same(item, reference)` asserts) until a
    ShardError: (items that came and matched, that error or None)."""
    count = 0
    try:
        for item, reference in zip(items, expected):
            same(item, reference)
            count += 1
    except ShardError as error:
        return count, error
    return count, None


INDEX_FIELDS = ("index_offset", "index_bytes", "index_digest")


def make_older(output: pathlib.Path) -> None:
    """Turn a conversion into what an older wdsprep wrote: shards without their index member, no
    sample tables (nor their keys in `_units.json`), no shard tables."""
    manifest = read_manifest(output)
    for split in manifest["tables"].pop("sample_tables", {}):
        (output / f"{split}.samples").unlink()
    for split in manifest["tables"].pop("shard_tables", {}):
        (output / f"{split}.shards").unlink()
    older: dict[str, dict] = {}
    for entry in manifest["splits"].values():
        for row in entry["shards"]:
            path = output / row["name"]
            data = path.read_bytes()[: row["index_offset"]] + bytes(1024)
            path.write_bytes(data)
            for name in INDEX_FIELDS:
                del row[name]
            row.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
            older[row["name"]] = row
        entry["bytes"] = sum(row["bytes"] for row in entry["shards"])
    manifest["totals"]["bytes"] = sum(entry["bytes"] for entry in manifest["splits"].values())
    (output / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    head, records = journal_records(output)
    for record in records:
        record["rows"] = [{key: value for key, value in older[row["name"]].items() if key != "unit_digest"} for row in record["rows"]]
        record.pop("samples", None)
    write_older_journal(output, head, records)


ROW_COLUMNS = ("name", "samples", "bytes", "sha256", "index_offset", "index_bytes", "index_digest")


def journal_records(output: pathlib.Path) -> tuple[dict, list[dict]]:
    """`_units.json`'s head and its unit records as a wdsprep before issue 40 wrote them (one object per
    line: split, index, digest, rows, problems, tables, input_bytes, samples), read by hand from the
    compact lines its docstring describes (shards/journal.py)."""
    lines = (output / "_units.json").read_text().splitlines()
    head, records = json.loads(lines[0]), []
    if "format" not in head:  # written so already (make_older)
        return head, [json.loads(line) for line in lines[1:]]
    for line in lines[1:]:
        record = json.loads(line)
        split, index, input_bytes = record["u"]
        rows = []
        for part, row in enumerate(record["r"]):
            if isinstance(row, list):
                row = dict(zip(ROW_COLUMNS, row), unit=index)
                row["name"] = row["name"] or f"{split}-{index:05d}-{part:02d}.tar"
            rows.append(row)
        samples = {"keys": record["s"][0], "fields": record["s"][1]} if "s" in record else None
        records.append({"split": split, "index": index, "digest": record["d"], "rows": rows, "problems": record.get("p", []),
                        "tables": record.get("t", {}), "input_bytes": input_bytes, "samples": samples})
    return head, records


def write_older_journal(output: pathlib.Path, head: dict, records: list[dict]) -> None:
    """`_units.json` as a wdsprep before issue 40 wrote it: the config alone on the first line, then one
    record object per line."""
    lines = [json.dumps({"config": head["config"]}, sort_keys=True), *(json.dumps(r, sort_keys=True) for r in records)]
    (output / "_units.json").write_text("\n".join(lines) + "\n")
