"""A training run's folder (`trainer.default_root_dir`: checkpoints/, logs/, pretrained/) holds one run.

A run that starts afresh is refused in a folder that already holds an earlier run's checkpoints or
exported model, so the earlier weights are never replaced without a word: resume the run
(`--ckpt_path last`) or say so (`--overwrite true`: the new run's pretrained/ replaces the earlier
one; Lightning keeps the earlier checkpoints and numbers the new ones, last-v1.ckpt).

Checkpoints are written atomically and read with one line for a file that is not one
(`AtomicCheckpointIO`, `ReadsCheckpointsClearly`); a run that holds the folder sweeps the temporary
files (`.NAME.tmp-*`) a killed writer left in it before its first checkpoint (`sweep_temp_files`), and
a run that ends before its first step takes the log folder it made with it (`ForgetsUnstartedLogs`).
A command line LightningCLI cannot parse is refused in one line naming the command's help
(`ShortParseErrors`), not with its ~90 lines of usage.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Iterable

import lightning.pytorch as pl
from lightning.pytorch.plugins.io import TorchCheckpointIO

from rvqlm_core.atomic import atomic_path

CHECKPOINT_SUFFIX = ".ckpt"
EXPORT_FOLDER = "pretrained"
#: --ckpt_path values Lightning resolves itself (not files)
LIGHTNING_CKPT_NAMES = ("last", "best", "hpc", "registry")


def earlier_run(run_dir: str | os.PathLike, checkpoint_dirs: Iterable[str | os.PathLike] = ()) -> list[str]:
    """What of an earlier run `run_dir` holds: its pretrained/ folder and the checkpoints in
    `checkpoint_dirs` (default: run_dir/checkpoints), as paths; [] for a fresh folder."""
    run_dir = Path(run_dir)
    found = [str(run_dir / EXPORT_FOLDER)] if (run_dir / EXPORT_FOLDER).exists() else []
    for folder in map(Path, checkpoint_dirs or [run_dir / "checkpoints"]):
        if folder.is_dir():
            found += sorted(str(p) for p in folder.glob(f"*{CHECKPOINT_SUFFIX}") if not p.name.startswith("."))
    return found


def check_new_run(run_dir: str | os.PathLike, checkpoint_dirs: Iterable[str | os.PathLike] = (),
                  ckpt_path: str | None = None, overwrite: bool = False) -> None:
    """ValueError in one line when a run without `ckpt_path` (one that starts afresh) would write into a
    folder holding an earlier run (`earlier_run`), unless `overwrite`."""
    if ckpt_path is not None or overwrite:
        return
    found = earlier_run(run_dir, checkpoint_dirs)
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ValueError(f"{run_dir} holds the run of an earlier train-lm ({shown}); resume it with --ckpt_path "
                         "last, start over in it with --overwrite true (its pretrained/ is then replaced), or give "
                         "another --trainer.default_root_dir")


def sweep_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files `atomic_path` names `.NAME.tmp-*` that a killed writer left in `folder`
    (kill -9 between the temporary file and its rename); only for a caller that holds the folder, so no
    other writer is midway. Returns what it removed."""
    folder = Path(folder)
    removed = []
    for p in sorted(folder.glob(".*.tmp-*")) if folder.is_dir() else []:
        if p.is_file():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed


class ForgetsUnstartedLogs(pl.Callback):
    """A run that ends in an error before its first step (refused by the folder lock, a bad checkpoint, a
    check at fit start) removes the log folders it made under `log_root` (logs/version_N holding at most
    its config), and log_root itself if it made it: a refused run leaves no empty logs/version_N."""

    def __init__(self, log_root: str) -> None:
        self.log_root = Path(log_root)
        self.had_root = self.log_root.exists()
        self.before = set(self.log_root.iterdir()) if self.had_root else set()

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        if trainer.global_step > 0 or not self.log_root.is_dir():
            return
        for folder in set(self.log_root.iterdir()) - self.before:
            if folder.is_dir() and all(p.name in ("config.yaml", "hparams.yaml") for p in folder.rglob("*")):
                shutil.rmtree(folder, ignore_errors=True)
        if not self.had_root and not any(self.log_root.iterdir()):
            self.log_root.rmdir()


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoints written to a temporary name and renamed (a kill never leaves half a file),
    and read with one line for a file that is not a checkpoint (`--ckpt_path in.wav`)."""

    def __init__(self) -> None:
        super().__init__()
        self._swept: set[Path] = set()

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        folder = Path(path).parent
        if folder not in self._swept:  # this run holds the folder (lm.run_lock): no other writer is midway
            sweep_temp_files(folder)
            self._swept.add(folder)
        with atomic_path(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)

    def load_checkpoint(self, path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            checkpoint = super().load_checkpoint(path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as e:  # torch's unpickler fails on other files in many ways (IndexError, EOFError, ...)
            raise not_a_checkpoint(path, e) from None
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise not_a_checkpoint(path, ValueError("no state_dict"))
        return checkpoint


class ReadsCheckpointsClearly:
    """A LightningCLI mixin: a --ckpt_path that is not a checkpoint is refused in one line. LightningCLI
    reads the file's hyperparameters itself (its `_parse_ckpt_path`), before any plugin is built."""

    def _parse_ckpt_path(self) -> None:
        path = self.config[self.config.subcommand].get("ckpt_path") if self.config.get("subcommand") else None
        local = path is not None and path.split(":")[0] not in LIGHTNING_CKPT_NAMES and "://" not in path
        if local and not Path(path).is_file():
            raise FileNotFoundError(f"--ckpt_path {path}: no such checkpoint file (or give last)")
        try:
            super()._parse_ckpt_path()
        except Exception as e:
            raise not_a_checkpoint(path, e) from None


def not_a_checkpoint(path, error: BaseException) -> ValueError:
    """The one line for a --ckpt_path torch cannot read as a checkpoint (torch's unpickler fails on other
    files in many ways: IndexError, EOFError, UnpicklingError, ...)."""
    reason = (str(error).strip().splitlines() or [""])[0][:200]
    return ValueError(f"{path} is not a checkpoint torch can read ({type(error).__name__}{': ' if reason else ''}"
                      f"{reason}); give --ckpt_path a .ckpt file of a train-lm run, or last")


class ShortParseErrors:
    """A LightningCLI mixin: a command line it cannot parse (a misspelt option, a value of the wrong type,
    a missing recipe) raises ValueError in one line, the parser's message and then `help_command`,
    instead of jsonargparse's usage (~90 lines) and a tip naming the subcommand (`rvqlm fit --help`)."""

    help_command = "--help"

    def init_parser(self, **kwargs: Any):
        return super().init_parser(**{**kwargs, "exit_on_error": False})

    def parse_arguments(self, parser, args) -> None:
        from jsonargparse import ArgumentError

        try:
            super().parse_arguments(parser, args)
        except ArgumentError as e:
            text = str(e).strip()
            if text.startswith("Call to compute_fn of link") and " failed: " in text:  # a linked value's own error
                text = text.rsplit(" failed: ", 1)[1]
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            message = " ".join(lines[:4]) + (" ..." if len(lines) > 4 else "")
            raise ValueError(f"{message}; see {self.help_command}") from None
