"""A corrupt deflate stream inside data.zip and an empty frame: one line naming the file, exit 1,
no output; with --on-error skip the bad frame is reported and the rest converted."""
import shutil
import zipfile

from wdsprep.conversion import convert
from wdsprep.sources.minecraft.synth import synth
from wdsprep.testing.edits import failing_convert

MEMBER = "data/creative:3/000003.npy"  # synth seed 5 makes creative:3, :99 and :119


def _zip_with_corrupt_member(tmp_path):
    synth(str(tmp_path / "native"), seed=5, layout="flat", episodes=3, side=9)
    archive = str(tmp_path / "data.zip")
    shutil.make_archive(archive[:-4], "zip", tmp_path / "native")
    with zipfile.ZipFile(archive) as handle:
        info = handle.getinfo(MEMBER)
    assert info.compress_type == zipfile.ZIP_DEFLATED
    data = bytearray(open(archive, "rb").read())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for offset in range(8, 40):  # inside the deflate stream, not the local header
        data[start + offset] ^= 0x5A
    open(archive, "wb").write(bytes(data))
    return archive


def test_a_corrupt_deflate_stream_names_the_zip_and_the_member(tmp_path):
    archive = _zip_with_corrupt_member(tmp_path)
    line = failing_convert(["minecraft", archive, str(tmp_path / "out")], str(tmp_path / "out"))
    assert line.startswith(f"wdsprep: error: {archive}: member {MEMBER}: corrupt or unreadable (")


def test_skip_mode_reports_the_corrupt_member_and_converts_the_rest(tmp_path):
    archive = _zip_with_corrupt_member(tmp_path)
    manifest = convert("minecraft", archive, str(tmp_path / "out"), on_error="skip")
    assert [problem["item"] for problem in manifest.problems] == [MEMBER]
    assert manifest.samples("train") > 0


def test_an_empty_frame_is_named(tmp_path):
    synth(str(tmp_path / "native"), seed=5, layout="flat", episodes=3, side=9)
    (tmp_path / "native" / MEMBER).write_bytes(b"")
    line = failing_convert(["minecraft", str(tmp_path / "native"), str(tmp_path / "out")], str(tmp_path / "out"))
    assert line == f"wdsprep: error: {MEMBER}: empty file (0 bytes), expected a frame .npy"
