"""The codec table (`wdsprep.shards.codec.CODECS`): every registered extension is written by the
writer and read back by the reader, its bytes are what an independent library writes and reads
(numpy, zstandard, msgpack, json), and every place that lists codecs takes them from the table."""
import io
import json
import pathlib
import re
import tarfile
import zipfile

import msgpack
import numpy as np
import pytest
import zstandard

import wdsprep
from wdsprep.cli import main
from wdsprep.shards.codec import ARRAY_CODECS, CODECS, COLUMN_CODECS, Columns, Encoder, split_field
from wdsprep.shards.writer import ShardWriter

ROOT = pathlib.Path(__file__).resolve().parents[2]
ZSTD_LEVEL = 5


def npy_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def numpy_reads(data: bytes):
    return np.load(io.BytesIO(data), allow_pickle=False)


def npz_bytes(columns) -> bytes:
    """An .npz as the format states it: Python's zipfile, one stored `<name>.npy` (np.save) per column,
    dated 1980-01-01, made on Unix, mode 0644 (np.savez itself stamps the clock)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in columns.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.create_system, info.external_attr = 3, 0o644 << 16
            archive.writestr(info, npy_bytes(array))
    return buffer.getvalue()


def numpy_reads_npz(data: bytes) -> dict:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


# extension -> (what an independent library writes for a value, how it reads member bytes back).
# A codec added to the table without an entry here fails `test_every_extension_has_an_independent_oracle`.
ORACLES = {
    "npy": (npy_bytes, numpy_reads),
    "npy.zst": (lambda value: zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(npy_bytes(value)),
                lambda data: numpy_reads(zstandard.ZstdDecompressor().decompress(data))),
    "npz": (npz_bytes, numpy_reads_npz),
    "npz.zst": (lambda value: zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(npz_bytes(value)),
                lambda data: numpy_reads_npz(zstandard.ZstdDecompressor().decompress(data))),
    "mp": (lambda value: msgpack.packb(value, use_bin_type=True), lambda data: msgpack.unpackb(data, raw=False)),
    "json": (lambda value: json.dumps(value, sort_keys=True, separators=(",", ":")).encode(), json.loads),
}
VALUES = {  # a value of the kind each extension holds
    "npy": np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)),
    "npy.zst": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    "npz": Columns(origins=np.arange(6, dtype=np.float32).reshape(2, 3), hits=np.array([1, 0], np.uint8)),
    "npz.zst": Columns(ids=np.arange(5, dtype=np.int32), empty=np.zeros(0, np.int32),
                       grid=np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3))),
    "mp": {"label": 3, "name": "ü", "blob": b"\x00\x01", "shape": [2, 3]},
    "json": {"b": [1, 2.5, None], "a": "x"},
}


def same(got, expected):
    if isinstance(expected, Columns):
        assert isinstance(got, dict) and list(got) == list(expected)
        for name in expected:
            same(got[name], expected[name])
    elif isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    else:
        assert got == expected


def written_members(directory, fields_by_key: dict, codec: str) -> dict[str, bytes]:
    """Write one shard with the public writer; its members as Python's tarfile extracts them."""
    writer = ShardWriter(str(directory), "train-00000", shard_bytes=1 << 40, encoder=Encoder(codec, ZSTD_LEVEL))
    with writer:
        for key, fields in fields_by_key.items():
            writer.write(key, fields)
    with tarfile.open(directory / writer.rows[0].name) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if not m.name.startswith("__")}


def extension_of(member: str) -> str:
    """`k0.voxels.npy.zst` -> "npy.zst": everything after the key and the field (no dots in either)."""
    return member.split(".", 2)[2]


def test_every_extension_has_an_independent_oracle():
    assert set(ORACLES) == set(CODECS) == set(VALUES)


@pytest.mark.parametrize("codec", sorted(ARRAY_CODECS))
def test_every_registered_extension_is_written_and_read_back_like_the_libraries_do(tmp_path, codec):
    """Each extension named explicitly, plus an array and a dict named without one (what sources do)."""
    fields = {f"f{index}.{extension}": VALUES[extension] for index, extension in enumerate(sorted(CODECS))}
    fields["plain_array"] = VALUES["npy.zst"]
    fields["plain_columns"] = VALUES["npz.zst"]
    fields["plain_meta"] = VALUES["mp"]
    members = written_members(tmp_path, {"k0": fields}, codec)
    assert len(members) == len(fields)
    assert {extension_of(name) for name in members} == set(CODECS)  # every registered extension reachable
    implicit = {"plain_array": ARRAY_CODECS[codec], "plain_columns": COLUMN_CODECS[codec], "plain_meta": "mp"}
    for field, value in fields.items():
        extension = implicit.get(field) or field.split(".", 1)[1]
        data = members[f"k0.{field.split('.')[0]}.{extension}"]
        write, read = ORACLES[extension]
        assert data == write(value), (field, extension)  # the same bytes as before the table: the libraries' own
        same(read(data), value)
    decoded = wdsprep.decode_sample({"__key__": "k0", **{name.split(".", 1)[1]: data for name, data in members.items()}})
    assert sorted(decoded) == sorted(["__key__", *(field.split(".")[0] for field in fields)])
    for field, value in fields.items():
        same(decoded[field.split(".")[0]], value)


def test_bytes_values_are_member_data_except_for_msgpack(tmp_path):
    """Bytes given for an `.npy`/`.npy.zst`/`.json` field are stored as they are (already encoded);
    for a msgpack field they are a msgpack bin value."""
    ready = {"npy": npy_bytes(VALUES["npy"]), "npy.zst": ORACLES["npy.zst"][0](VALUES["npy.zst"]), "json": b'{"x":1}'}
    fields = {f"f{index}.{extension}": data for index, (extension, data) in enumerate(sorted(ready.items()))}
    fields["blob"] = b"\x93NUMPY raw"
    members = written_members(tmp_path, {"k0": fields}, "zstd")
    assert len(members) == len(fields)
    for field, data in fields.items():
        if "." in field:
            assert members[f"k0.{field}"] == data
    assert msgpack.unpackb(members["k0.blob.mp"]) == b"\x93NUMPY raw"


@pytest.mark.parametrize("extension", sorted(CODECS))
def test_the_reader_splits_every_extension_off_its_field(extension):
    assert split_field(f"voxels.{extension}") == ("voxels", extension)
    assert split_field(f"voxels.{extension}.bak") == (f"voxels.{extension}.bak", "")  # not a codec: kept as bytes


def test_an_unregistered_extension_is_refused_by_the_writer_and_passed_through_by_the_reader(tmp_path):
    """`.zst` alone was once a decoder no writer could produce; now nothing outside the table is either."""
    with pytest.raises(wdsprep.FormatError, match=r"sample 'k0', field 'x\.zst'"):
        written_members(tmp_path, {"k0": {"x.zst": b"\x28\xb5\x2f\xfd"}}, "zstd")
    raw = zstandard.ZstdCompressor().compress(b"abc")
    assert wdsprep.decode_sample({"x.zst": raw}) == {"x.zst": raw}


# ------------------------------------------------------------------------- lists taken from the table
def test_the_cli_codec_choices_are_the_table(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "generic", "in", "out", "--codec", "lz4"])
    err = capsys.readouterr().err
    assert f"--codec: invalid choice: 'lz4' (choose from {', '.join(map(repr, ARRAY_CODECS))})" in err


def test_a_pipeline_with_an_unknown_codec_is_one_line_naming_the_choices(tmp_path, capsys):
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "in").mkdir()
    spec = tmp_path / "pipelines" / "bad.toml"
    spec.write_text('source = "generic"\ninput = "in"\noutput = "out"\n[convert]\ncodec = "lz4"\n')
    assert main(["pipeline", str(spec), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"wdsprep: error: unknown codec 'lz4' (expected one of: {', '.join(ARRAY_CODECS)})"]
    assert not (tmp_path / "out").exists()


def test_the_documents_list_the_table():
    readme = (ROOT / "README.md").read_text()
    assert f"[--codec {'|'.join(ARRAY_CODECS)}]" in readme
    format_page = (ROOT / "docs" / "format.md").read_text()
    listed = re.search(r"Extensions: (.*?)\.\n", format_page, re.S).group(1)
    assert set(re.findall(r"`\.([a-z.]+)`", listed)) == set(CODECS)
    streaming = (ROOT / "docs" / "streaming.md").read_text()
    decoding = re.search(r"## Decoding\n(.*?)members", streaming, re.S).group(1)
    assert set(re.findall(r"`\.([a-z.]+)`", decoding)) == set(CODECS)
