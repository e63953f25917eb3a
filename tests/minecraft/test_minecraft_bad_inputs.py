"""An empty frame in a folder: one line naming the frame, exit 1, no output; a frame damaged anywhere
is a checked frame or one InputError naming it. (A corrupt deflate stream inside data.zip, and
--on-error skip, are in the conformance suite.)"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdsprep.errors import InputError
from wdsprep.sources.minecraft.native import load_frame
from wdsprep.sources.minecraft.synth import synth
from wdsprep.conformance import failing_convert

from .minecraft_testdata import zip_folder

MEMBER = "data/creative:3/000003.npy"  # synth seed 5 makes creative:3, :99 and :119


def test_an_empty_frame_is_named(tmp_path):
    synth(str(tmp_path / "native"), seed=5, layout="flat", episodes=3, side=9)
    (tmp_path / "native" / MEMBER).write_bytes(b"")
    line = failing_convert(["minecraft", str(tmp_path / "native"), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line == f"wdsprep: error: {MEMBER}: empty file (0 bytes), expected a frame .npy"


def _frame_bytes():
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, {"action": np.array([0, 1, 0]), "voxel": np.full((3, 3, 3), "air")}, allow_pickle=True)
    return buffer.getvalue()


FRAME = _frame_bytes()


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_a_damaged_frame_loads_or_is_one_input_error_naming_it(edits, cut):
    """Bytes changed anywhere in a pickled frame, or the frame cut short: `load_frame` returns a
    checked frame or raises InputError naming it, whatever numpy's header parser or the unpickler meets."""
    data = bytearray(FRAME)
    for position, value in edits:
        data[position % len(data)] = value
    if cut is not None:
        data = data[: cut % len(data)]
    try:
        load_frame("creative:1/000004.npy", bytes(data))
    except InputError as error:
        assert str(error).startswith("creative:1/000004.npy: "), error


@pytest.mark.parametrize("flag, rule", [
    ("encrypted", "is encrypted, password required"),
    ("unknown method", "That compression method is not supported"),
])
def test_a_zip_member_zipfile_cannot_read_is_one_line_naming_archive_and_member(tmp_path, flag, rule):
    """zipfile raises RuntimeError (encrypted) and NotImplementedError (a compression it lacks),
    besides BadZipFile: each is the one line naming the archive and the member."""
    import struct
    import zipfile

    synth(str(tmp_path / "native"), seed=5, layout="flat", episodes=3, side=9)
    archive = zip_folder(tmp_path / "native", tmp_path / "data.zip")
    with zipfile.ZipFile(archive) as handle:
        info = handle.getinfo(MEMBER)
    data = bytearray(archive.read_bytes())
    central = data.find(b"PK\x01\x02")  # the member's entry in the central directory (its name at +46)
    while data[central + 46: central + 46 + len(MEMBER)] != MEMBER.encode():
        central = data.find(b"PK\x01\x02", central + 4)
    if flag == "encrypted":  # general-purpose flag bit 0, in the local header and the directory entry
        data[info.header_offset + 6] |= 1
        data[central + 8] |= 1
    else:  # compression method 99 (AES, which zipfile does not implement)
        data[info.header_offset + 8: info.header_offset + 10] = struct.pack("<H", 99)
        data[central + 10: central + 12] = struct.pack("<H", 99)
    archive.write_bytes(bytes(data))
    line = failing_convert(["minecraft", str(archive), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {archive}: member {MEMBER}: ") and rule in line, line
