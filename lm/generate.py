"""Generation, one front door for every LM family:

    from lm.generate import generate
    from lm.sampling import SamplingOptions
    codes = generate(model, prompt, n, sampling=SamplingOptions(top_k=250, seed=1))

continues prompt codes [B, N_c, T0] by n frames -> [B, N_c, T0 + n] with the model's family's decoding
(lm.families: "ar" step by step with a KV cache, lm.ar_decode; "masked" by iterative parallel
decoding, lm.masked_generate). A conditioned LM also takes condition=Condition(text, speaker)
(classifier-free guidance, lm.guidance); each family's own options come as its options dataclass
(lm.ar_decode.ARDecoding, lm.masked_generate.MaskedDecoding).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from lm.conditioning import Condition
from lm.sampling import SamplingOptions


@dataclass
class DecodeRequest:
    """What a family's decode gets from `generate`: prompt [B, N_c, T0] on the model's device, checked;
    new_frames; the sampling options and the generator they draw from; the condition (None: none);
    the family's options; a progress bar's wish and the codec's frame rate (for its real-time factor);
    on_frames (a streaming family's, see `generate`)."""

    prompt: Tensor
    new_frames: int
    sampling: SamplingOptions
    generator: torch.Generator | None
    condition: Condition | None
    options: Any
    progress: bool = False
    frame_rate: float | None = None
    on_frames: Callable[[Tensor, Tensor], None] | None = None


def check_prompt(model: Any, prompt_codes: Tensor) -> None:
    """Raise ValueError unless prompt_codes [B, N_c, T0] holds codes the model can be prompted with."""
    cfg = model.config
    if not isinstance(prompt_codes, Tensor) or prompt_codes.dim() != 3 or prompt_codes.shape[1] != cfg.n_codebooks:
        shape = tuple(prompt_codes.shape) if isinstance(prompt_codes, Tensor) else type(prompt_codes).__name__
        raise ValueError(f"prompt codes must have shape [B, {cfg.n_codebooks}, T0], got {shape}")
    if prompt_codes.is_floating_point() or prompt_codes.is_complex() or prompt_codes.dtype == torch.bool:
        raise ValueError(f"prompt codes must be integer ids, got {prompt_codes.dtype}")
    if prompt_codes.shape[0] < 1:
        raise ValueError("prompt codes must hold at least one sequence (B >= 1)")
    if prompt_codes.numel() and bool(((prompt_codes < 0) | (prompt_codes >= cfg.codebook_size)).any()):
        raise ValueError(f"prompt codes must be in 0..{cfg.codebook_size - 1} (the LM's codebook_size)")
    t0 = prompt_codes.shape[-1]
    if t0 > cfg.max_frames:
        raise ValueError(f"the prompt has {t0} frames but the LM's context holds at most {cfg.max_frames} "
                         f"(max_seq_len={cfg.max_seq_len} positions, {cfg.pattern} pattern over "
                         f"{cfg.n_codebooks} codebooks); use a shorter prompt")


BYTES_PER_CODE = 64  # what each generated code costs in the decoding's bookkeeping (codes, pattern layout,
# inputs, masks: a few int64 tensors of [B, N_c, T]), with room to spare


def free_memory(device: torch.device) -> int | None:
    """Bytes free on `device` (None where it cannot be told)."""
    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError, RuntimeError):
        return None


def longest_generation(model: Any, rows: int) -> int:
    """The most frames (prompt included) a generation of `rows` rows can hold in the free memory of the
    model's device (a very large number where that cannot be told)."""
    free = free_memory(model.device)
    return 2**62 if free is None else free // (BYTES_PER_CODE * rows * model.config.n_codebooks)


def generate(model: Any, prompt_codes: Tensor | None, max_new_frames: int, *,
             sampling: SamplingOptions = SamplingOptions(), condition: Condition | None = None, options: Any = None,
             generator: torch.Generator | None = None, batch_size: int = 1, progress: bool = False,
             frame_rate: float | None = None, on_frames: Callable[[Tensor, Tensor], None] | None = None,
             return_lengths: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Continue `prompt_codes` [B, N_c, T0] by `max_new_frames` frames -> codes [B, N_c, T0 + n].

    The prompt frames are copied, never sampled; `prompt_codes=None` starts from nothing (B rows: a list
    of texts or speakers in `condition`, else `batch_size`). Rows are independent samples of one batched
    pass, drawn as `sampling` says (reproducible with its seed, or with `generator`). `options`: the
    family's own (None: its defaults). `progress`: a tqdm bar (with `frame_rate`, the real-time factor).

    A conditioned LM that predicts its end of audio stops each row there: codes [B, N_c, longest row], 0
    past each row's end; `return_lengths` also returns lengths [B] (frames, prompt included).
    `on_frames(codes [B, N_c, n], ends [B])` (a streaming family's) gets the prompt's frames, then each
    frame once complete (0 past a row's end; ends: the row lengths known so far), for `rvqlm generate --stream`.
    """
    from lm.families import family_of

    family = family_of(model.config.family)
    if not isinstance(sampling, SamplingOptions):
        raise TypeError(f"sampling must be a SamplingOptions, got {type(sampling).__name__}")
    options_class = family.resolve("options")
    options = options_class() if options is None else options
    if not isinstance(options, options_class):
        raise TypeError(f"a {family.name!r} LM takes {options_class.__name__} options, got {type(options).__name__}")
    if on_frames is not None and not family.streams:
        raise ValueError(f"a {family.name!r} LM does not hand frames over as it makes them (no on_frames)")
    if prompt_codes is None:
        rows = (condition.rows() if condition is not None else None) or batch_size
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        prompt_codes = torch.zeros(rows, model.config.n_codebooks, 0, dtype=torch.long)
    check_prompt(model, prompt_codes)
    if isinstance(max_new_frames, bool) or not isinstance(max_new_frames, int) or max_new_frames < 0:
        raise ValueError(f"max_new_frames must be an integer >= 0, got {max_new_frames!r}")
    longest = longest_generation(model, prompt_codes.shape[0])
    if prompt_codes.shape[-1] + max_new_frames > longest:
        raise ValueError(f"{max_new_frames} new frames of {prompt_codes.shape[0]} row(s) would not fit in the free "
                         f"memory of {model.device}: at most {max(longest - prompt_codes.shape[-1], 0)} new frames")
    request = DecodeRequest(prompt_codes.to(model.device), max_new_frames, sampling,
                            generator if generator is not None else sampling.generator(model.device), condition,
                            options, progress, frame_rate, on_frames)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            codes, lengths = family.resolve("decode")(model, request)
    finally:
        model.train(was_training)
    return (codes, lengths) if return_lengths else codes


class ProgressBar:
    """tqdm over a family's decoding: frames/s and, given the frame rate, the real-time factor (or model calls
    with unit="call"); a no-op when disabled."""

    def __init__(self, total: int, enabled: bool, frame_rate: float | None = None, unit: str = "frame"):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=unit, desc="generate", dynamic_ncols=True)
        self.frame_rate = frame_rate
        self.start = time.perf_counter()
        self.count = 0
        self.last_postfix = 0.0

    def update(self, n: int) -> None:
        if self.bar is None or n <= 0:
            return
        self.count += n
        self.bar.update(n)
        now = time.perf_counter()
        if self.frame_rate and (now - self.last_postfix > 0.5 or self.count == self.bar.total):
            elapsed = now - self.start
            self.bar.set_postfix(rtf=f"{elapsed / (self.count / self.frame_rate):.3f}", refresh=False)
            self.last_postfix = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
