"""Lightning: DataModule + MidepochCheckpoint resume exactly where the checkpoint was taken."""
from __future__ import annotations

import os

import pytest
import torch

from .noisebase_testdata import shards

L = pytest.importorskip("lightning")

from wdsprep.sources.noisebase import MidepochCheckpoint, TrainingSampleDataModule  # noqa: E402

LOADER = dict(batch_size=2, val_split=0.2, num_workers=0, samples=1, buffers=["color"], seed=42)


class Interrupt(Exception):
    pass


class Recorder(L.LightningModule):
    def __init__(self, stop_at=None):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen = []
        self.stop_at = stop_at

    def training_step(self, batch, batch_idx):
        if self.stop_at == (self.current_epoch, batch_idx):
            raise Interrupt()
        self.seen.append((self.current_epoch, batch_idx, tuple(os.path.basename(f) for f in batch["file"]),
                          int(batch["frame_index"])))
        return self.layer(batch["color"].mean(dim=(2, 3, 4))).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(callbacks):
    # no default checkpointing: it would write ./checkpoints into the working tree
    checkpointing = any(isinstance(c, MidepochCheckpoint) for c in callbacks)
    return L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=callbacks, num_sanity_val_steps=0, limit_val_batches=0,
                     enable_checkpointing=checkpointing)


def test_midepoch_checkpoint_resumes_exactly(tmp_path_factory, tmp_path):
    url = shards(tmp_path_factory)
    whole = Recorder()
    _trainer([]).fit(whole, datamodule=TrainingSampleDataModule(url, **LOADER))
    assert len(whole.seen) == 16  # 2 epochs x 2 groups x 4 frames

    checkpoint = MidepochCheckpoint(dirpath=str(tmp_path), filename="last", every_n_train_steps=3,
                                    enable_version_counter=False, save_top_k=-1)
    first = Recorder(stop_at=(0, 6))
    with pytest.raises(Interrupt):
        _trainer([checkpoint]).fit(first, datamodule=TrainingSampleDataModule(url, **LOADER))
    path = tmp_path / "last.ckpt"
    assert path.exists() and not [p for p in os.listdir(tmp_path) if ".tmp" in p]
    saved = torch.load(path, weights_only=False)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"start_epoch_idx": 0, "start_sequence_idx": 2}]

    second = Recorder()
    resume = MidepochCheckpoint(dirpath=str(tmp_path), filename="last", every_n_train_steps=3,
                                enable_version_counter=False, save_top_k=-1)
    _trainer([resume]).fit(second, datamodule=TrainingSampleDataModule(url, **LOADER), ckpt_path=str(path))
    resumed = [item[2:] for item in first.seen[:4] + second.seen]
    assert resumed == [item[2:] for item in whole.seen]
    assert [item[:2] for item in second.seen][:4] == [(0, 4), (0, 5), (0, 6), (0, 7)]


def test_checkpoint_write_is_atomic(tmp_path):
    """A save that dies half-way leaves the previous checkpoint intact (Lightning's would not)."""

    class DyingTrainer:
        is_global_zero = True
        global_step = 7
        loggers = []

        class strategy:
            @staticmethod
            def barrier(name=None):
                pass

        def save_checkpoint(self, path, weights_only=False):
            with open(path, "wb") as handle:
                handle.write(b"half a checkpo")
            raise OSError("disk full")

    target = tmp_path / "last.ckpt"
    target.write_bytes(b"the previous, complete checkpoint")
    callback = MidepochCheckpoint(dirpath=str(tmp_path), filename="last", enable_version_counter=False)
    callback._save_checkpoint(DyingTrainer(), str(target))  # Lightning's request: only remembered
    callback._remove_checkpoint(DyingTrainer(), str(tmp_path / "older.ckpt"))  # deferred, not done
    assert callback._pending_removals == [str(tmp_path / "older.ckpt")]
    with pytest.raises(OSError):
        callback._write_pending(DyingTrainer())
    assert target.read_bytes() == b"the previous, complete checkpoint"
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]
