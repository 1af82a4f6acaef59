"""Which token files a run reads: the train / valid / test split of a folder, and how often each
training file is drawn."""

from __future__ import annotations

import fnmatch
import hashlib
import math
from typing import Literal, Sequence

SplitBy = Literal["prefix", "hash"]

SPLIT_NAMES = ("train", "valid", "test")


def hash_fraction(relpath: str) -> float:
    """A fixed number in [0, 1) for a relative path (first 8 bytes of its SHA-256)."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def select_split(relpaths: Sequence[str], split: str, split_by: SplitBy = "prefix",
                 valid_fraction: float = 0.1) -> list[int]:
    """Indices of the files (given by relative path) that belong to `split`, in input order.

    prefix: files under ``<split>/``. hash: ``valid`` = files whose path hash is below
    `valid_fraction`, ``train`` = the others (files under ``test/`` are in neither). Raises
    ValueError if the split is empty, naming what was looked for.
    """
    if split not in SPLIT_NAMES:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLIT_NAMES}")
    if split_by == "prefix":
        chosen = [i for i, p in enumerate(relpaths) if p.startswith(f"{split}/")]
        hint = (f"no token files under '{split}/' (split_by=prefix expects the corpus's own "
                "train/ valid/ test/ folders; use split_by=hash for other corpora)")
    elif split_by == "hash":
        if not 0.0 < valid_fraction < 1.0:
            raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
        if split == "test":
            raise ValueError("split_by=hash has only 'train' and 'valid' splits")
        in_valid = [not p.startswith("test/") and hash_fraction(p) < valid_fraction for p in relpaths]
        in_train = [not p.startswith("test/") and not v for p, v in zip(relpaths, in_valid)]
        chosen = [i for i, keep in enumerate(in_valid if split == "valid" else in_train) if keep]
        hint = (f"the '{split}' split is empty: {len(relpaths)} files, valid_fraction={valid_fraction} "
                "(use more files or a larger valid_fraction)")
    else:
        raise ValueError(f"split_by must be 'prefix' or 'hash', got {split_by!r}")
    if not chosen:
        raise ValueError(hint)
    return chosen


def file_weights(relpaths: Sequence[str], sample_weights: dict[str, float]) -> list[float] | None:
    """Each file's sampling weight: that of the first glob its relpath matches, else 1 (None: no globs).
    ValueError for a negative weight, a glob matching no file, or weights that leave nothing to draw."""
    if not sample_weights:
        return None
    for glob, weight in sample_weights.items():
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
            raise ValueError(f"data.sample_weights[{glob!r}] must be a number >= 0, got {weight!r}")
        if not any(fnmatch.fnmatchcase(r, glob) for r in relpaths):
            raise ValueError(f"data.sample_weights: {glob!r} matches no training file (paths look like "
                             f"{relpaths[0] if relpaths else 'nothing: no training files'!r})")
    weights = [next((float(w) for g, w in sample_weights.items() if fnmatch.fnmatchcase(r, g)), 1.0) for r in relpaths]
    if not any(weights):
        raise ValueError("data.sample_weights gives every training file weight 0")
    return weights
