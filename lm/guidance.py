"""Classifier-free guidance (as MusicGen does), the one implementation every LM family decodes through.

`GuidedDecoder` binds a model to its conditions: it encodes them and computes every block's
cross-attention keys and values once, then each call feeds the model only tokens (and the
family's own forward arguments). With guidance scale s != 1 the B rows run as one batched forward
of 2B rows, the conditional ones and the same tokens under the null conditions, and the logits are

    logits = uncond + s * (cond - uncond)

so s = 1 is the conditional model (no unconditional rows are run), s = 0 the unconditional one,
s > 1 pushes away from the unconditional distribution. An AR LM's KV cache then holds 2B rows.

A speaker scale s_v of its own (multi-condition guidance, as in InstructPix2Pix and Audiobox) adds
B rows with the speaker alone (text null), 3B in all:

    logits = uncond + s_v * (speaker - uncond) + s * (cond - speaker)

which is the line above when s_v = s. An unconditioned LM is bound to nothing (one group, no memory).
The scales and their defaults: lm.sampling.SamplingOptions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lm.conditioning import Condition
from lm.kv_cache import KVCache
from lm.sampling import SamplingOptions


class GuidedDecoder:
    """A model with its conditions bound: decoder(tokens [B, ...], **forward_args) -> the model's
    (guided) logits for the B rows. Build it in eval mode (no condition dropout). `reading`: a hook
    with before(positions) / after(logits) around each call (lm.alignment.ReadingWindow)."""

    def __init__(self, model: Any, condition: Condition | None, sampling: SamplingOptions, batch_size: int,
                 reading: Any = None):
        self.model = model
        self.batch_size = batch_size
        self.memory = None
        self.groups = 1
        self.reading = None
        if model.config.condition is None:
            if (condition is not None and condition.given) or sampling.cfg_scale is not None \
                    or sampling.speaker_cfg_scale is not None:
                raise ValueError("this LM is not conditioned (no condition encoder): a text, a speaker and guidance "
                                 "scales need an LM trained with LMConfig.condition; allowed here: a prompt and the "
                                 "sampling options")
            return
        condition = condition or Condition()
        self.scale, self.speaker_scale = sampling.guidance_scales(condition.given)
        self.groups = 3 if self.speaker_scale != self.scale else 2 if self.scale != 1.0 else 1
        inputs = model.condition_inputs(condition.text, condition.speaker, batch_size, condition.durations)
        null = model.condition_encoder.null_inputs(batch_size)
        if self.groups == 3:  # rows 0..B-1 conditional, B..2B-1 the speaker alone, 2B..3B-1 the null conditions
            alone = inputs.nulled(model.config.condition.null_speaker,
                                  speaker=torch.zeros_like(inputs.speaker, dtype=torch.bool))
            inputs = inputs.cat(alone).cat(null)
        elif self.groups == 2:  # rows 0..B-1 conditional, B..2B-1 the null conditions
            inputs = inputs.cat(null)
        self.memory = model.cross_memory(inputs)
        self.reading = reading(model, self.memory) if reading is not None else None

    # what an AR decoding loop reads of a model
    @property
    def config(self):
        return self.model.config

    @property
    def pattern(self):
        return self.model.pattern

    @property
    def device(self) -> torch.device:
        return self.model.device

    def new_cache(self, batch_size: int, max_len: int | None = None, ring: bool = False,
                  dtype: torch.dtype | None = None, sink: bool = False) -> KVCache:
        return self.model.new_cache(self.groups * batch_size, max_len=max_len, ring=ring, dtype=dtype, sink=sink)

    def __call__(self, tokens: Tensor, **forward_args) -> Tensor:
        if tokens.shape[0] != self.batch_size:
            raise ValueError(f"the decoder was bound to {self.batch_size} conditions, "
                             f"the tokens have {tokens.shape[0]} rows")
        if self.memory is None:
            return self.model(tokens, **forward_args)
        if self.reading is not None:
            self.reading.before(tokens.shape[-1])
        if forward_args.get("frame_mask") is not None:  # [B, T]: one row per group's row
            forward_args = {**forward_args, "frame_mask": torch.cat([forward_args["frame_mask"]] * self.groups)}
        return self._guide(self.model(torch.cat([tokens] * self.groups), memory=self.memory, **forward_args))

    def decode_step(self, tokens: Tensor, cache: KVCache) -> Tensor:
        """An AR LM's cached step (MultiCodebookLM.decode_step) under the conditions: tokens [B, N_c, 1] ->
        the guided logits [B, N_c, 1, n_outputs], equal to `self(tokens, cache=cache)` (which a model without
        a decode_step of its own runs)."""
        if not hasattr(self.model, "decode_step"):
            return self(tokens, cache=cache)
        if self.memory is None:
            return self.model.decode_step(tokens, cache)
        if self.reading is not None:
            self.reading.before(1)
        rows = tokens if self.groups == 1 else torch.cat([tokens] * self.groups)
        return self._guide(self.model.decode_step(rows, cache, self.memory))

    def _guide(self, logits: Tensor) -> Tensor:
        """The model's logits over the groups' rows -> the guided logits of the B rows (see the module docstring)."""
        if self.groups == 2:
            cond, uncond = logits.chunk(2)
            logits = uncond + self.scale * (cond - uncond)
        elif self.groups == 3:
            cond, alone, uncond = logits.chunk(3)
            logits = uncond + self.speaker_scale * (alone - uncond) + self.scale * (cond - alone)
        return logits if self.reading is None else self.reading.after(logits)
