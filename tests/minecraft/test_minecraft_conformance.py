"""minecraft against the source conformance suite (wdsprep.conformance): six synthetic
episodes as a data.zip like the real dump, about one episode a unit; a frame's deflate stream
corrupted; a frame's action changed in place; a frame that inflates to 1.5 GiB (a valid pickle, then
zeros), and one whose action is a list nested 27 deep through shared references."""
import zipfile

from wdsprep.sources.minecraft.synth import synth
from wdsprep.conformance import Hostile, SourceTests
from wdsprep.testing.edits import corrupt_zip_member, zeros, zip_with_member_replaced, zip_with_member_streamed

from .minecraft_testdata import edited_frame, make_episode_dir, nested_action_frame, zip_folder

BOMB_BYTES = 3 << 29  # 1.5 GiB: the 1.57 MB zip of issue 35


class TestMinecraftConformance(SourceTests):
    source = "minecraft"
    convert_args = ("--shard-bytes", "4000")
    rebalance_shard_bytes = 30_000
    rebalance_args = ("--window-frames", "4", "--window-overlap", "1")

    def make_rebalance_input(self, directory):
        """Frames of random blocks from 200 names: zstd makes far less of them than the 16x the
        source's size estimate assumes, so units overrun; short windows give several samples a unit."""
        names = tuple(f"block{i}" for i in range(200))
        for episode in range(4):
            make_episode_dir(directory / "native" / "data", f"creative:{episode + 10}", frames=20, side=9, seed=episode, names=names)
        return zip_folder(directory / "native", directory / "data.zip")

    def make_input(self, directory):
        synth(str(directory / "native"), seed=3, layout="flat", episodes=6, side=9)
        return zip_folder(directory / "native", directory / "data.zip")

    @staticmethod
    def _frame(archive, episode_index=2, frame=4):
        with zipfile.ZipFile(archive) as handle:
            episodes = sorted({name.split("/")[1] for name in handle.namelist() if name.count("/") == 2})
        return f"data/{episodes[episode_index]}/{frame:06d}.npy"

    def stray_entries(self, native):
        episode = self._frame(native).rpartition("/")[0]
        return ("data/README.md", f"{episode}/notes.txt", f"__MACOSX/{episode}/._000001.npy")

    def corrupt_input(self, native):
        member = self._frame(native)
        corrupt_zip_member(str(native), member)
        return member

    def bomb_input(self, native):
        member = self._frame(native)
        with zipfile.ZipFile(native) as handle:
            frame = handle.read(member)
        zip_with_member_streamed(str(native), member, [frame, *zeros(BOMB_BYTES - len(frame))])
        return Hostile(member, BOMB_BYTES)

    def malformed_input(self, native):
        member = self._frame(native)
        zip_with_member_streamed(str(native), member, [nested_action_frame(27)])
        return Hostile(member, 2**27 * 8)  # 2**27 leaves once expanded: 1 GiB as int64

    def edit_input(self, native):
        member = self._frame(native)
        with zipfile.ZipFile(native) as handle:
            data, _ = edited_frame(handle.read(member))
        return native, zip_with_member_replaced(str(native), member, data)

    def stream(self, manifest, split, seed, epoch):
        import wdsprep

        return wdsprep.dataset(manifest, split, seed=seed, epoch=epoch, shuffle_buffer=8).compose(
            wdsprep.minecraft.pairs(history_length=2))

    def sample_id(self, sample):
        return sample["episode"], sample["t"]
