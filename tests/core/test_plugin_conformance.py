"""A source defined outside the package (`plugin_source.py`, beside this file) against the source
conformance suite (wdsprep.conformance), loaded as a plugin `package.module:OBJECT` in this
process and in the pool's workers: one unit per split file; a value that is not an integer; one
value changed in place; a 2 GiB split file (a sparse file); a line of 50 million values."""
from wdsprep.conformance import Hostile, SourceTests


class TestPluginSourceConformance(SourceTests):
    source = "tests.core.plugin_source:SOURCE"
    convert_args = ("--shard-bytes", "64KB")  # one unit per split: the edited file feeds exactly its unit
    rebalance_shard_bytes = 64_000

    def corrupt_input(self, native):
        path = native / "train.txt"
        lines = path.read_text().splitlines()
        key, first, *rest = lines[5].split()
        lines[5] = " ".join([key, "x" * len(first), *rest])
        path.write_text("\n".join(lines) + "\n")
        return f"{path}:6"

    def bomb_input(self, native):
        path = native / "train.txt"
        with open(path, "r+b") as handle:
            handle.truncate(2 << 30)
        return Hostile(str(path), 2 << 30)

    def malformed_input(self, native):
        path = native / "train.txt"
        lines = path.read_bytes().splitlines(keepends=True)
        count = 50_000_000
        with open(path, "wb") as handle:
            handle.writelines(lines[:5])
            handle.write(b"train0005" + b" 12" * count + b"\n")  # 150 MB: a str of ~51 bytes per value once split
            handle.writelines(lines[6:])
        return Hostile(f"{path}:6", count * 59)

    def stray_entries(self, native):
        return ("notes.md", "train.txt.orig", "old/")

    def break_file(self, path):
        """Text lines cut anywhere stay lines: cut to half, then end on a value that is not an integer."""
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] + b" x\n")

    def edit_input(self, native):
        path = native / "valid.txt"
        lines = path.read_text().splitlines()
        key, first, *rest = lines[2].split()
        lines[2] = " ".join([key, first[:-1] + str((int(first[-1]) + 1) % 10), *rest])  # same length
        return path, ("\n".join(lines) + "\n").encode()
