"""An empty frame in a folder: one line naming the frame, exit 1, no output. (A corrupt deflate
stream inside data.zip, and --on-error skip, are in the conformance suite.)"""
from wdsprep.sources.minecraft.synth import synth
from wdsprep.testing.edits import failing_convert

MEMBER = "data/creative:3/000003.npy"  # synth seed 5 makes creative:3, :99 and :119


def test_an_empty_frame_is_named(tmp_path):
    synth(str(tmp_path / "native"), seed=5, layout="flat", episodes=3, side=9)
    (tmp_path / "native" / MEMBER).write_bytes(b"")
    line = failing_convert(["minecraft", str(tmp_path / "native"), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line == f"wdsprep: error: {MEMBER}: empty file (0 bytes), expected a frame .npy"
