"""The random generators' state (torch, Python, NumPy) as checkpoint-friendly plain values.

Training modules save it in their Lightning checkpoints (`on_save_checkpoint`) and put it back
when a resumed fit starts, so a resumed run draws the same dropout masks, quantizer-dropout
levels and so on as the uninterrupted one. Only tensors and plain types: checkpoints still load
with torch.load(weights_only=True).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def get_rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


class ResumesRngState:
    """Lightning hooks that save the RNG state in each checkpoint and put it back when a resumed
    fit starts training. Mix in before LightningModule; overrides call super()."""

    _rng_to_restore: dict[str, Any] | None = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = get_rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._rng_to_restore = checkpoint.get("rng_states")

    def on_train_start(self) -> None:
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
