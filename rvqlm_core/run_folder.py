"""A training run's folder (`trainer.default_root_dir`: checkpoints/, logs/, pretrained/) holds one run.

A run that starts afresh is refused in a folder that already holds an earlier run's checkpoints or
exported model, so the earlier weights are never replaced without a word: resume the run
(`--ckpt_path last`) or say so (`--overwrite true`: the new run's pretrained/ replaces the earlier
one; Lightning keeps the earlier checkpoints and numbers the new ones, last-v1.ckpt). Temporary files a killed writer left behind
(`rvqlm_core.atomic.atomic_path` names them `.NAME.tmp-*`) are swept by the next run that holds
the folder (`sweep_temp_files`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable

CHECKPOINT_SUFFIX = ".ckpt"
EXPORT_FOLDER = "pretrained"


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
    """Remove the temporary files (`.NAME.tmp-*`) a killed writer left in `folder`; only for a caller that
    holds the folder (no other writer can be midway). Returns what it removed."""
    folder = Path(folder)
    removed = []
    for p in sorted(folder.glob(".*.tmp-*")) if folder.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):
            if p.is_file():
                p.unlink()
                removed.append(p)
    return removed
