"""Hostile frames, forged as a stranger would (pickle's own `__reduce__`, or opcodes written out): each
is one InputError naming the frame, in bounded memory (tracemalloc peak), never a crash. The 1.5 GiB
zip bomb and the nested pickle through `wdsprep convert` are in the conformance suite."""
import io
import struct
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from tests.timeouts import SUBPROCESS
from wdsprep.errors import InputError
from wdsprep.sources.minecraft.native import MAX_FRAME_BYTES, load_frame
from wdsprep.sources.minecraft.synth import synth

from .minecraft_testdata import (_object_npy_header, forged_array, forged_frame, frame_bytes, nested_action_frame,
                                 object_dtype_from_bytes_frame)

MEMBER = "data/creative:3/000003.npy"  # synth seed 5 makes creative:3, :99 and :119
GOOD = {"action": np.array([0, 1, 0]), "voxel": np.full((3, 3, 3), "air")}
PLAIN_INT64 = (3, "<", None, None, None, -1, -1, 0)  # np.dtype("i8").__reduce__()[2]


def refusal(data: bytes) -> str:
    with pytest.raises(InputError) as caught:
        load_frame(MEMBER, data)
    message = str(caught.value)
    assert message.startswith(f"{MEMBER}: ") and "\n" not in message, message
    return message


def refusal_and_peak(data: bytes) -> tuple[str, int]:
    """`refusal(data)` and the peak of what Python and numpy allocated meanwhile (tracemalloc)."""
    tracemalloc.start()
    try:
        return refusal(data), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_object_dtype_made_of_raw_bytes_is_one_line_not_a_segfault(tmp_path):
    """The frame whose dtype state claims "no objects" for an object dtype crashed `wdsprep convert`
    with SIGSEGV (its raw bytes dereferenced as a PyObject pointer); run in a child process."""
    synth(str(tmp_path / "native"), seed=5, layout="flat", episodes=3, side=9)
    (tmp_path / "native" / MEMBER).write_bytes(object_dtype_from_bytes_frame())
    child = subprocess.run([sys.executable, "-m", "wdsprep", "convert", "minecraft", str(tmp_path / "native"),
                            str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, timeout=SUBPROCESS)
    assert child.returncode == 1, (child.returncode, child.stderr[-2000:])
    assert child.stderr.splitlines() == [
        f"wdsprep: error: {MEMBER}: cannot unpickle: dtype 'O8' with a state that is not a plain dtype's: "
        "(3, '|', None, None, None, -1, -1, 0)"]
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("what, frame, rule", [
    ("an object voxel made of bytes, the state of a plain object dtype",
     lambda: forged_frame({**GOOD, "voxel": forged_array((1, 1, 1), ("O8", False, True), (3, "|", None, None, None, -1, -1, 63), b"\x41" * 8)}),
     "an object array whose items are not a list of its size"),
    ("an int64 dtype whose state claims objects (flags 63)",
     lambda: forged_frame({**GOOD, "action": forged_array((3,), ("i8", False, True), (3, "<", None, None, None, -1, -1, 63), bytes(24))}),
     "dtype 'i8' with a state that is not a plain dtype's"),
    ("a structured (void) dtype",
     lambda: forged_frame({**GOOD, "action": forged_array((1,), ("V16", False, True), PLAIN_INT64, bytes(16))}),
     "dtype 'V16' is not a plain numeric, bool or string dtype"),
    ("a datetime dtype", lambda: forged_frame({**GOOD, "action": np.zeros(3, "M8[s]")}),
     "dtype 'M8' is not a plain numeric"),
    ("an array declaring more elements than its bytes",
     lambda: forged_frame({**GOOD, "action": forged_array((10**9,), ("i8", False, True), PLAIN_INT64, bytes(24))}),
     "an array of shape (1000000000,) and dtype int64 from 24 bytes (it needs 8000000000)"),
])
def test_forged_arrays_and_dtypes_are_refused(what, frame, rule):
    assert rule in refusal(frame()), what


def test_an_object_scalar_is_refused():
    from numpy._core.multiarray import scalar

    from .minecraft_testdata import _Reduced

    forged = _Reduced(scalar, (_Reduced(np.dtype, ("O8", False, True), (3, "|", None, None, None, -1, -1, 63)), b"\x41" * 8))
    assert "a scalar of an object dtype" in refusal(forged_frame({**GOOD, "extra": forged}))


def test_bytes_after_the_pickle_are_refused():
    """A valid frame followed by zeros (the small version of the bomb) was read as if they were not there."""
    assert "1048576 bytes after the pickle's end" in refusal(frame_bytes(GOOD) + bytes(1 << 20))
    assert "1 bytes after the pickle's end" in refusal(frame_bytes(GOOD) + b".")


def test_a_structure_shared_20_deep_is_refused_before_it_is_expanded():
    """20 levels of [x, x] (2**20 leaves from a few hundred bytes; 26 levels cost 22 s and 2.1 GB, in
    the conformance suite's child process): refused by counting the pickle's graph, the peak
    allocation stays a few megabytes, far below the 8 MiB the leaves take as int64 alone."""
    data = nested_action_frame(20)
    assert len(data) < 1000
    message, peak = refusal_and_peak(data)
    assert "holds more than 300000 objects once its shared references are expanded" in message
    assert peak < 4 << 20, peak


def _nested(depth: int) -> list:
    nested: list = [0]
    for _ in range(depth - 1):
        nested = [nested]
    return nested


def test_a_deep_structure_of_few_objects_is_refused_by_its_depth():
    """Depth alone: lists nested 28 and 40 deep (29 and 41 objects, nothing shared: the object and
    byte counts are far from their limits) under an extra key of an otherwise good frame, which the
    frame's checks never look at, and a list nested 100,000 deep (opcodes written out: 100,000
    objects, under the 300,000 limit) are refused by the depth limit (32 levels, the frame's own
    included) before anything is built; the same frame with the list nested 27 deep loads."""
    assert len(_nested(28)) == 1 and str(_nested(3)) == "[[[0]]]"
    for depth in (28, 40):
        message = refusal(frame_bytes({**GOOD, "notes": _nested(depth)}))
        assert "nested deeper than 32 levels" in message, message
    deep = 100_000
    message, peak = refusal_and_peak(_opcodes(b"]" * deep, b"a" * (deep - 1)))
    assert "nested deeper than 32 levels" in message, message
    assert peak < 256 << 20, peak
    # 32 levels: the frame's own four (the object array's reduce, its state, its list of items, the
    # dict), 27 lists and the 0 they end in
    frame = load_frame(MEMBER, frame_bytes({**GOOD, "notes": _nested(27)}))
    assert frame.action.tolist() == [0, 1, 0]


def test_a_list_holding_itself_is_refused():
    looped: list = [0]
    looped.append(looped)
    assert "a structure that contains itself" in refusal(frame_bytes({**GOOD, "action": looped}))


def _opcodes(*parts: bytes) -> bytes:
    return _object_npy_header() + b"\x80\x04" + b"".join(parts) + b"."


def test_a_memo_index_out_of_order_is_refused_before_the_unpickler_allocates_for_it():
    """`LONG_BINPUT 2**32-1` makes CPython's unpickler grow its memo table to 2**33 entries (64 GiB)."""
    data = _opcodes(b"N", b"r" + struct.pack("<I", 2**32 - 1))
    assert "memo index 4294967295 out of order (the next is 0)" in refusal(data)


@pytest.mark.parametrize("parts, rule", [
    ((b"\x8c\x05numpy\x94\x8c\x05dtype\x94\x93\x94}b",), "an opcode needs a reduce on the stack"),  # BUILD on a global
    ((b"cos\nsystem\n",), "refusing to load os.system"),
    ((b"N\x94h\x05",), "memo index 5 never stored"),
    ((b"]N\x94",), "the pickle does not end with exactly one object"),
    ((b"(N\x81",), "opcode NEWOBJ"),
    ((b"\x8c\x01a\x94\x8c\x01b\x94\x93",), "refusing to load a.b"),
])
def test_opcodes_a_numpy_frame_never_holds_are_refused(parts, rule):
    message = refusal(_opcodes(*parts))
    assert rule in message, message


def test_a_pickle_of_many_small_objects_is_refused_in_bounded_memory():
    """Two million `None`s appended to a list (4 MB of opcodes) stop at the object limit: the scan's
    own graph stays bounded (tracemalloc peak)."""
    message, peak = refusal_and_peak(_opcodes(b"]", b"Na" * 2_000_000))
    assert "holds more than 300000 objects" in message
    assert peak < 128 << 20, peak


def test_a_frame_file_above_the_cap_is_refused_unread(tmp_path):
    """A frame file (a folder input) larger than MAX_FRAME_BYTES: one line, nothing read (a sparse file)."""
    synth(str(tmp_path / "native"), seed=5, layout="flat", episodes=3, side=9)
    path = tmp_path / "native" / MEMBER
    with open(path, "r+b") as handle:
        handle.truncate(MAX_FRAME_BYTES + 1)
    from wdsprep.conformance import failing_convert

    line = failing_convert(["minecraft", str(tmp_path / "native"), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line == (f"wdsprep: error: {MEMBER}: {MAX_FRAME_BYTES + 1} bytes, more than a frame may hold "
                    f"({MAX_FRAME_BYTES} bytes; a real 21**3 frame is 408 KB)")


def test_every_protocol_numpy_writes_loads_exactly():
    """np.save's own frames at protocols 3-5 (5: arrays by `_frombuffer`), Fortran and C order, with
    numpy scalars and an object array of names: the same values as numpy's own unpickler gives."""
    frame = {"action": np.array([2, 0, 1], dtype=np.int32), "voxel": np.asfortranarray(np.arange(8).reshape(2, 2, 2).astype(str)),
             "scalar": np.float32(1.5), "names": np.array(["air", "stone"], dtype=object), "flags": np.array([True, False])}
    for protocol in (3, 4, 5):
        data = forged_frame(frame, protocol=protocol)
        expected = np.load(io.BytesIO(data), allow_pickle=True).item()
        from wdsprep.sources.minecraft.native import _unpickle_npy

        got = _unpickle_npy(data)
        assert sorted(got) == sorted(expected)
        for key in expected:
            assert type(got[key]) is type(expected[key]), key
            assert np.array_equal(got[key], expected[key]) and np.asarray(got[key]).dtype == np.asarray(expected[key]).dtype, key
        assert got["voxel"].flags.f_contiguous and got["voxel"].flags.writeable
