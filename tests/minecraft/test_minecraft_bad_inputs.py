"""An empty frame in a folder: one line naming the frame, exit 1, no output; a frame damaged anywhere
is a checked frame or one InputError naming it. (A corrupt deflate stream inside data.zip, and
--on-error skip, are in the conformance suite.)"""
from hypothesis import given, settings
from hypothesis import strategies as st

from wdsprep.errors import InputError
from wdsprep.sources.minecraft.native import load_frame
from wdsprep.sources.minecraft.synth import synth
from wdsprep.testing.edits import failing_convert

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
