"""Decoding a conditioned LM with classifier-free guidance (as MusicGen does).

`ConditionedDecoder` stands where `lm.generate` expects a model: it encodes the conditions and
computes every block's cross-attention keys and values once, then each call feeds the decoder
only tokens. With guidance scale s != 1 the B rows run as one batched forward of 2B rows, the
conditional ones and the same tokens under the null conditions, and the logits are

    logits = uncond + s * (cond - uncond)

so s = 1 is the conditional model (no unconditional rows are run), s = 0 the unconditional one,
s > 1 pushes away from the unconditional distribution. The self-attention KV cache holds 2B rows.

A speaker scale s_v of its own (multi-condition guidance, as in InstructPix2Pix and Audiobox) adds
B rows with the speaker alone (text null), 3B in all:

    logits = uncond + s_v * (speaker - uncond) + s * (cond - speaker)

which is the line above when s_v = s.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lm.alignment import ReadingWindow
from lm.conditioning import ConditionInputs
from lm.kv_cache import KVCache


def _scale(value, what: str) -> float:
    scale = float(value)
    if not scale >= 0 or scale == float("inf"):
        raise ValueError(f"the {what} must be a finite number >= 0, got {value!r}")
    return scale


class ConditionedDecoder:
    """A conditioned MultiCodebookLM with its conditions bound: tokens [B, N_c, S] -> (guided)
    logits [B, N_c, S, n_outputs]. Build it in eval mode (no condition dropout)."""

    def __init__(self, model: Any, inputs: ConditionInputs, cfg_scale: float = 1.0, reading: bool = False,
                 speaker_scale: float | None = None):
        self.model = model
        self.scale = _scale(cfg_scale, "guidance scale (cfg)")
        self.speaker_scale = self.scale if speaker_scale is None else _scale(speaker_scale, "speaker guidance scale")
        self.groups = 3 if self.speaker_scale != self.scale else 2 if self.scale != 1.0 else 1
        self.guided = self.groups > 1
        self.batch_size = len(inputs)
        null = model.condition_encoder.null_inputs(len(inputs))
        if self.groups == 3:  # rows 0..B-1 conditional, B..2B-1 the speaker alone, 2B..3B-1 the null conditions
            alone = inputs.nulled(model.config.condition.null_speaker, speaker=torch.zeros_like(inputs.speaker,
                                                                                              dtype=torch.bool))
            inputs = inputs.cat(alone).cat(null)
        elif self.groups == 2:  # rows 0..B-1 conditional, B..2B-1 the null conditions
            inputs = inputs.cat(null)
        self.memory = model.cross_memory(inputs)
        self.reading = ReadingWindow(model, self.memory) if reading else None  # monotonic reading (lm.alignment)

    # what lm.generate reads of a model
    @property
    def config(self):
        return self.model.config

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
        rows = self.groups * batch_size
        return self.model.new_cache(rows, max_len=max_len, ring=ring, dtype=dtype, sink=sink)

    def __call__(self, tokens: Tensor, cache: KVCache | None = None, window: int | None = None) -> Tensor:
        if tokens.shape[0] != self.batch_size:
            raise ValueError(f"the decoder was bound to {self.batch_size} conditions, "
                             f"the tokens have {tokens.shape[0]} rows")
        if self.reading is not None:
            self.reading.before(tokens.shape[-1])
        logits = self.model(torch.cat([tokens] * self.groups), cache=cache, window=window, memory=self.memory)
        if self.groups == 2:
            cond, uncond = logits.chunk(2)
            logits = uncond + self.scale * (cond - uncond)
        elif self.groups == 3:
            cond, alone, uncond = logits.chunk(3)
            logits = uncond + self.speaker_scale * (alone - uncond) + self.scale * (cond - alone)
        return logits if self.reading is None else self.reading.after(logits)
