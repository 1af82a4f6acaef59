"""An LM run folder takes one run at a time: `RunFolderLock`, a callback every `rvqlm train-lm`
run carries, holds the folder's writer lock (rvqlm_core.folder_lock) on global rank 0 from the
start of fit to its end, so a second run writing the same checkpoints is refused in one line."""

from __future__ import annotations

import contextlib

import lightning.pytorch as pl

from rvqlm_core.folder_lock import folder_lock


class RunFolderLock(pl.Callback):
    """Holds `trainer.default_root_dir`'s writer lock while this run's fit lasts."""

    def __init__(self) -> None:
        self._held = contextlib.ExitStack()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            self._held.enter_context(folder_lock(trainer.default_root_dir))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._held.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._held.close()
