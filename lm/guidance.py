"""Decoding a conditioned LM with classifier-free guidance (as MusicGen does).

`ConditionedDecoder` stands where `lm.generate` expects a model: it encodes the conditions and
computes every block's cross-attention keys and values once, then each call feeds the decoder
only tokens. With guidance scale s != 1 the B rows run as one batched forward of 2B rows, the
conditional ones and the same tokens under the null conditions, and the logits are

    logits = uncond + s * (cond - uncond)

so s = 1 is the conditional model (no unconditional rows are run), s = 0 the unconditional one,
s > 1 pushes away from the unconditional distribution. The self-attention KV cache holds 2B rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lm.alignment import ReadingWindow
from lm.conditioning import ConditionInputs
from lm.kv_cache import KVCache


class ConditionedDecoder:
    """A conditioned MultiCodebookLM with its conditions bound: tokens [B, N_c, S] -> (guided)
    logits [B, N_c, S, n_outputs]. Build it in eval mode (no condition dropout)."""

    def __init__(self, model: Any, inputs: ConditionInputs, cfg_scale: float = 1.0, reading: bool = False):
        scale = float(cfg_scale)
        if not scale >= 0 or scale == float("inf"):
            raise ValueError(f"the guidance scale (cfg) must be a finite number >= 0, got {cfg_scale!r}")
        self.model = model
        self.scale = scale
        self.guided = scale != 1.0
        self.batch_size = len(inputs)
        if self.guided:  # rows 0..B-1 conditional, B..2B-1 the null conditions
            inputs = inputs.cat(model.condition_encoder.null_inputs(len(inputs)))
        self.memory = model.cross_memory(inputs)
        self.reading = ReadingWindow(model, self.memory) if reading else None  # monotonic reading (lm.alignment)

    # what lm.generate reads of a model
    @property
    def cfg(self):
        return self.model.cfg

    @property
    def pattern(self):
        return self.model.pattern

    @property
    def training(self) -> bool:
        return self.model.training

    @property
    def device(self) -> torch.device:
        return self.model.device

    def eval(self) -> Any:
        return self.model.eval()

    def train(self, mode: bool = True) -> Any:
        return self.model.train(mode)

    def new_cache(self, batch_size: int, max_len: int | None = None, ring: bool = False,
                  dtype: torch.dtype | None = None, sink: bool = False) -> KVCache:
        rows = 2 * batch_size if self.guided else batch_size
        return self.model.new_cache(rows, max_len=max_len, ring=ring, dtype=dtype, sink=sink)

    def __call__(self, tokens: Tensor, cache: KVCache | None = None, window: int | None = None) -> Tensor:
        if tokens.shape[0] != self.batch_size:
            raise ValueError(f"the decoder was bound to {self.batch_size} conditions, "
                             f"the tokens have {tokens.shape[0]} rows")
        if self.reading is not None:
            self.reading.before(tokens.shape[-1])
        if not self.guided:
            logits = self.model(tokens, cache=cache, window=window, memory=self.memory)
        else:
            cond, uncond = self.model(torch.cat([tokens, tokens]), cache=cache, window=window,
                                      memory=self.memory).chunk(2)
            logits = uncond + self.scale * (cond - uncond)
        return logits if self.reading is None else self.reading.after(logits)
