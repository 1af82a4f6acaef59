"""Autoregressive decoding, the "ar" family's (docs/theory.md, seed 001: decoding and the KV cache);
reached through lm.generate.generate.

Generation walks the codebook pattern's steps left to right:

    step s:  input = bos (s = 0) or the ids placed at step s - 1   -> logits for step s [B, N_c, |V|]
             per codebook: a forced id where the pattern position is known (a prompt frame, or
             `pad` where the pattern marks the position invalid), else a sampled one.

The prompt's steps go through the model in one batched "prefill" pass; after it each step feeds one
position into a KV cache preallocated for the whole generation.

A conditioned LM reads a text and a speaker (lm.conditioning) through cross-attention whose keys
and values are computed once per sequence, with classifier-free guidance (lm.guidance), and stops
each row where codebook 0 chooses the end-of-audio id (lm.end_of_audio), or at max_new_frames; an
aligned-text LM chooses it once its text's frames have run out (lm.aligned_text.AlignedEnd).

Past the trained context (W = `max_seq_len` positions), `sink=True` (the default) keeps bos in view
as every training window does: a ring cache with a sink slot (RoPE, see lm.kv_cache), or a
recompute of the training window [bos] + the last W-1 inputs at positions 0..W-1 (additive
encodings). `sink=False` is the plain sliding window: a ring cache of the last W positions (RoPE;
equal to `model(x, window=W)`) or a recompute of the last W inputs. `use_cache=False` recomputes
the whole prefix (past the context: the window `sink` chooses) at every step: the reference the
cached path is tested against. Why the sink: docs/experiments.md, "language model".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterator

import torch
from torch import Tensor

from lm.aligned_text import AlignedEnd
from lm.alignment import ReadingWindow, reads_in_order
from lm.end_of_audio import EndTracker
from lm.generate import DecodeRequest, ProgressBar, check_prompt
from lm.guidance import GuidedDecoder


@dataclass(frozen=True)
class ARDecoding:
    """The AR family's own decoding options. use_cache: a KV cache (False: recompute the prefix every
    step, the reference). sink: past the context keep bos in view (see the module docstring).
    monotonic: a conditioned LM reads its text in order (lm.alignment.ReadingWindow; None: on for an LM
    trained with guided attention). fast: cached steps through `decode_step` (False: through the model's
    forward, the reference it equals bit for bit; for benchmarks and tests)."""

    use_cache: bool = True
    sink: bool = True
    monotonic: bool | None = None
    fast: bool = True


@dataclass
class DecodeStep:
    """One pattern step: `logits` [B, N_c, |V|] the model gave for step `step`, `tokens` [B, N_c] the
    ids placed there (sampled, or forced where `forced` [N_c] is True)."""

    step: int
    logits: Tensor
    tokens: Tensor
    forced: Tensor


@dataclass
class GenerationPlan:
    """Everything fixed before the first step.

    seq [B, N_c, S]: the pattern sequence being filled; prompt codes and pad are in place already.
    forced [N_c, S] bool: positions whose id is known in advance (prompt frames, invalid slots).
    first_step: the first step with something to sample; steps before it are the prefill.
    end: a conditioned LM's end-of-audio bookkeeping (rows stop there); None: every row runs to the end.
    """

    seq: Tensor
    forced: Tensor
    first_step: int
    prompt_frames: int
    new_frames: int
    end: EndTracker | None = None

    @property
    def n_steps(self) -> int:
        return self.seq.shape[-1]


def plan_generation(model, prompt_codes: Tensor, max_new_frames: int) -> GenerationPlan:
    """Lay the prompt out in pattern space and mark what is forced. prompt_codes [B, N_c, T0]."""
    check_prompt(model, prompt_codes)
    if isinstance(max_new_frames, bool) or not isinstance(max_new_frames, int) or max_new_frames < 0:
        raise ValueError(f"max_new_frames must be an integer >= 0, got {max_new_frames!r}")
    cfg, pattern = model.config, model.pattern
    b, n_c, t0 = prompt_codes.shape
    total = t0 + max_new_frames
    codes = prompt_codes.new_zeros(b, n_c, total, dtype=torch.long)
    codes[..., :t0] = prompt_codes
    seq, valid = pattern.build(codes, None, cfg.pad_id)  # [B, N_c, S]
    steps = torch.arange(seq.shape[-1], device=seq.device)
    frame = steps[None, :] - torch.tensor(pattern.delays(), device=seq.device)[:, None]  # [N_c, S]
    forced = ~valid[0] | (frame < t0)
    unknown = (~forced).any(dim=0).nonzero()
    first_step = int(unknown[0]) if len(unknown) else seq.shape[-1]
    end = None if cfg.end_id is None else EndTracker(pattern, b, total, cfg.end_id, cfg.pad_id, seq.device)
    return GenerationPlan(seq=seq, forced=forced, first_step=first_step, prompt_frames=t0,
                          new_frames=max_new_frames, end=end)


def _model_inputs(plan: GenerationPlan, bos_id: int) -> Tensor:
    """[B, N_c, S] inputs: bos, then the sequence shifted right by one (input s = id at step s - 1)."""
    seq = plan.seq
    return torch.cat([torch.full_like(seq[..., :1], bos_id), seq[..., :-1]], dim=-1)


def fresh_window(inputs: Tensor, step: int, window: int) -> Tensor:
    """inputs [B, N_c, S] (bos at position 0) -> [B, N_c, min(step + 1, window)]: the inputs a training
    window ending at `step` holds, bos then the last window - 1 inputs up to `step` (positions 0..W-1)."""
    if step < window:
        return inputs[..., :step + 1]
    return torch.cat([inputs[..., :1], inputs[..., step + 2 - window:step + 1]], dim=-1)


def iter_decode(
    model,
    plan: GenerationPlan,
    choose: Callable[[Tensor], Tensor],
    *,
    use_cache: bool = True,
    sink: bool = True,
    fast: bool = True,
) -> Iterator[DecodeStep]:
    """Fill `plan.seq` step by step from `plan.first_step` on, yielding each step's logits and ids.

    model: an "ar" LM, or a GuidedDecoder binding one to its conditions (config, pattern, new_cache, call).
    choose: logits [B, N_c, |V|] -> ids [B, N_c] (e.g. a partial of `sample_next`).
    sink: past the context, keep bos in view as in training (see the module docstring).
    fast: each cached step after the prefill through `model.decode_step` (the same logits bit for bit at
    less cost; False: through the model's forward, the reference tests/test_decode_step.py compares with).
    With `plan.end`, only codebook 0 may choose the end id, positions past a row's end are pad,
    and decoding stops once every row has ended.
    Runs under the caller's grad mode; `generate` wraps it in inference_mode.
    """
    cfg = model.config
    seq, forced = plan.seq, plan.forced
    n_steps, window = plan.n_steps, cfg.max_seq_len
    if plan.first_step >= n_steps:
        return
    inputs = _model_inputs(plan, cfg.bos_id)  # kept in step with seq: inputs[..., s + 1] = seq[..., s]
    rope = model.config.pos == "rope"
    fast = fast and hasattr(model, "decode_step")
    cache = None
    if use_cache:
        ring = rope and n_steps > window
        cache = model.new_cache(seq.shape[0], max_len=min(n_steps, window), ring=ring, sink=ring and sink)

    for s in range(plan.first_step, n_steps):
        if cache is not None and (s < window or rope):
            # Prefill (the whole prompt at once) on the first step, one position afterwards.
            if s == plan.first_step or not fast:
                start = 0 if s == plan.first_step else s
                logits = model(inputs[..., start:s + 1], cache=cache)[:, :, -1]
            else:
                logits = model.decode_step(inputs[..., s:s + 1], cache)[:, :, -1]
        elif s < window:  # full recompute inside the context
            logits = model(inputs[..., :s + 1])[:, :, -1]
        elif sink:  # past the context: the window a training example would give, bos first
            logits = model(fresh_window(inputs, s, window))[:, :, -1]
        elif rope:  # past the context, no sink: sliding-window mask, the plain ring cache's exact twin
            logits = model(inputs[..., :s + 1], window=window)[:, :, -1]
        else:  # additive positions past the context, no sink: the last W inputs at positions 0..W-1
            logits = model(inputs[..., s + 1 - window:s + 1])[:, :, -1]
        end = plan.end
        chosen = choose(logits if end is None else end.mask_logits(logits))
        tokens = torch.where(forced[:, s], seq[..., s], chosen)
        if end is not None:
            tokens = end.place(s, tokens)
        seq[..., s] = tokens
        if s + 1 < n_steps:
            inputs[..., s + 1] = tokens
        yield DecodeStep(step=s, logits=logits, tokens=tokens, forced=forced[:, s])
        if end is not None and end.done(s):
            return


def decode(model, request: DecodeRequest) -> tuple[Tensor, Tensor]:
    """The AR family's decoding (lm.families): the request's prompt continued -> codes [B, N_c, T] (0 past
    a row's end) and lengths [B] in frames, prompt included."""
    options: ARDecoding = request.options
    if options.monotonic is not None and model.config.condition is None:
        raise ValueError("this LM is not conditioned: monotonic reading is for an LM trained with a text")
    plan = plan_generation(model, request.prompt, request.new_frames)
    choose = partial(request.sampling.sample, generator=request.generator)
    bar = ProgressBar(request.new_frames, request.progress, request.frame_rate)
    try:
        cond = model.config.condition
        reading = cond is not None and reads_in_order(model.config, options.monotonic)
        hook = ReadingWindow if reading else AlignedEnd if cond is not None and cond.alphabet else None
        decoder = GuidedDecoder(model, request.condition, request.sampling, plan.seq.shape[0], hook)
        _decode(decoder, plan, choose, bar, options, request.on_frames)
    finally:
        bar.close()
    return _frames_of(model, plan)


def _frames_of(model, plan: GenerationPlan) -> tuple[Tensor, Tensor]:
    """The filled plan -> codes [B, N_c, T] (0 past a row's end) and each row's length [B] in frames."""
    codes = model.pattern.revert(plan.seq)
    if plan.end is None:
        return codes, torch.full((codes.shape[0],), codes.shape[-1], dtype=torch.long, device=codes.device)
    return plan.end.trim(codes), plan.end.ends.clone()


def _decode(model, plan: GenerationPlan, choose: Callable[[Tensor], Tensor], bar: ProgressBar,
            options: ARDecoding, on_frames: Callable[[Tensor, Tensor], None] | None = None) -> None:
    """Run `iter_decode` to its end, counting finished frames on the progress bar and handing them
    to `on_frames` (see `generate`)."""
    delays = model.pattern.delays()
    done, total = plan.prompt_frames, plan.prompt_frames + plan.new_frames
    emit = partial(_emit_frames, plan, delays, on_frames) if on_frames is not None else lambda start, stop: None
    emit(0, done)
    for step in iter_decode(model, plan, choose, use_cache=options.use_cache, sink=options.sink, fast=options.fast):
        # Frame t is complete once its most delayed codebook is placed, at step t + max(delays).
        ready = min(step.step - max(delays) + 1, total)
        if ready > done:
            bar.update(ready - done)
            emit(done, ready)
            done = ready
    bar.update(total - done)
    emit(done, total if plan.end is None else int(plan.end.ends.max()))


def _emit_frames(plan: GenerationPlan, delays: list[int], on_frames: Callable[[Tensor, Tensor], None], start: int,
                 stop: int) -> None:
    """on_frames(frames start..stop-1 of plan.seq [B, N_c, stop - start], 0 past a row's end; ends [B])."""
    if stop <= start:
        return
    seq = plan.seq
    ends = (torch.full((seq.shape[0],), plan.prompt_frames + plan.new_frames, dtype=torch.long, device=seq.device)
            if plan.end is None else plan.end.ends.clone())
    codes = torch.stack([seq[:, k, start + d: stop + d] for k, d in enumerate(delays)], dim=1)
    past = torch.arange(start, stop, device=seq.device)[None, :] >= ends[:, None]
    on_frames(codes.masked_fill(past[:, None, :], 0), ends)
