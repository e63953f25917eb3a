"""Lightning side of the noisebase loader (optional extra `lightning`).

`TrainingSampleDataModule` mirrors noisebase's Lightning loader: the train and validation
dataloaders are `TrainingSampleLoader`s whose epoch is Lightning's `current_epoch`, and Lightning's
distributed sampler is switched off (the loader splits sequences across ranks itself).

`MidepochCheckpoint` is noisebase's mid-epoch checkpoint callback with two safety fixes the spec
asks for: the file is written to a temporary name and renamed over the old one (a crash never
leaves a truncated checkpoint), and checkpoints Lightning wants to delete are only deleted after
the postponed save has happened (Lightning would otherwise delete the old one first).
"""
from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from .loader import TrainingSampleLoader


class TrainingSampleDataModule(L.LightningDataModule):
    """`TrainingSampleDataModule(manifest_url, **loader_args)`; `stage` is set per dataloader."""

    def __init__(self, manifest_url: str, **loader_args):
        super().__init__()
        self.manifest_url = manifest_url
        self.loader_args = {k: v for k, v in loader_args.items() if k not in ("stage", "get_epoch")}

    def setup(self, stage: str) -> None:
        # the loader splits sequences across ranks itself: no DistributedSampler
        self.trainer._accelerator_connector.use_distributed_sampler = False

    def _loader(self, stage: str) -> TrainingSampleLoader:
        return TrainingSampleLoader(self.manifest_url, stage=stage, get_epoch=lambda: self.trainer.current_epoch,
                                    **self.loader_args)

    def train_dataloader(self) -> TrainingSampleLoader:
        return self._loader("train")

    def val_dataloader(self) -> TrainingSampleLoader:
        return self._loader("val")


def _batch_sampler(trainer):
    loader = trainer.train_dataloader
    if isinstance(loader, (list, tuple)):
        loader = loader[0]
    elif isinstance(loader, dict):
        loader = next(iter(loader.values()))
    return loader.batch_sampler


class MidepochCheckpoint(ModelCheckpoint):
    """A `ModelCheckpoint` that saves mid-epoch only between sequences, atomically.

    Lightning asks for a checkpoint whenever its schedule says so; the save waits until the
    loader allows it (before the first frame of a new group of sequences, or at the end of the
    epoch) and then stores the loader's resume state in the checkpoint. Validation is not resumed
    (Lightning's validation metrics are not resumable either).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._pending_path: str | None = None
        self._pending_removals: list[str] = []

    # Lightning calls this when its schedule fires: only remember the path.
    def _save_checkpoint(self, trainer, filepath: str) -> None:
        self._pending_path = filepath

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        if self._pending_path is not None:
            self._pending_removals.append(filepath)  # never delete before the new one exists
        else:
            super()._remove_checkpoint(trainer, filepath)

    def _write_pending(self, trainer) -> None:
        filepath, self._pending_path = self._pending_path, None
        temporary = f"{filepath}.tmp-{os.getpid()}"
        try:
            trainer.save_checkpoint(temporary, self.save_weights_only)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        if trainer.is_global_zero:
            os.replace(temporary, filepath)  # atomic on one filesystem
        trainer.strategy.barrier("wdsprep-noisebase-checkpoint")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            from weakref import proxy

            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))
        removals, self._pending_removals = self._pending_removals, []
        for path in removals:
            if os.path.abspath(path) != os.path.abspath(filepath):
                super()._remove_checkpoint(trainer, path)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._pending_path is not None:
            sampler = _batch_sampler(trainer)
            if sampler.checkpoint(trainer.current_epoch, batch_idx):
                try:
                    self._write_pending(trainer)  # the loader's state goes in with it
                finally:
                    sampler.cached_state = {}

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._pending_path is not None:
            self._write_pending(trainer)  # between epochs no loader state is needed
