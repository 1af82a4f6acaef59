"""Iterative parallel decoding of a MaskedLM (MaskGIT's, level by level as SoundStorm decodes RVQ codes),
the "masked" family's; reached through lm.generate.generate with MaskedDecoding options.

Every frame after the prompt starts masked at every level. Level q = 0, 1, ... gets S_q steps;
at each step the model reads the whole window once, a code is sampled at every still-hidden
position of level q (temperature, top-k, top-p: lm.sampling), the most confident of them are
kept (confidence: the sampled code's log-probability) and the others stay masked. How many stay
masked after step i of n hidden frames is n cos(pi/2 (i + 1) / S_q) (the cosine schedule of
training, at least one code fixed per step, none left after the last: `unmask_schedule`). Prompt
frames are never changed, and levels finer than q stay masked until their turn, as in training.
MaskGIT's choice temperature tau ranks by confidence + tau (1 - (i + 1) / S_q) g, g Gumbel noise
from the same generator (zero at a level's last step; tau = 0 draws nothing: plain confidence).

A RoPE model decodes a clip of up to ONE_PASS_STRETCH x its context in one window by default (at
distances it was never trained on: fewer calls, and better speech as measured); a longer clip, or
any clip of a model with other positions, is made in chunks of its context (or of `window` frames):
each later chunk sees the last `context` frames made so far as its prompt and fills the rest of its
window, so the number of sequential model calls is chunks x sum(S_q).

A conditioned masked LM reads a text and a speaker with classifier-free guidance (lm.guidance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from lm.generate import DecodeRequest, ProgressBar
from lm.guidance import GuidedDecoder
from lm.sampling import SamplingOptions, draw, filter_logits

DEFAULT_STEPS = (8, 2, 1, 1, 1, 1, 1, 1)
DEFAULT_CHOICE_TEMPERATURE = 4.5
ONE_PASS_STRETCH = 2.1  # the longest one-pass window measured: 3 s + 10 s = 650 frames over a 320-frame context


def steps_per_level(steps: Sequence[int] | str | None, n_codebooks: int) -> list[int]:
    """Steps for each of the N_c levels: the given ones (a list, or "16,4,2,1"), the levels after them
    1 step each; None: DEFAULT_STEPS. ValueError in one line for an empty list, a count < 1, or more
    entries than levels."""
    if steps is None:
        steps = DEFAULT_STEPS[:n_codebooks]
    if isinstance(steps, str):
        try:
            steps = [int(s) for s in steps.split(",")] if steps.strip() else []
        except ValueError:
            raise ValueError(f"steps must be comma-separated integers such as 16,4,2,1, got {steps!r}") from None
    steps = list(steps)
    if not steps:
        raise ValueError("steps must name at least one level's step count, e.g. 16,4,2,1")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps):
        raise ValueError(f"every level needs at least 1 step, got {steps}")
    if len(steps) > n_codebooks:
        raise ValueError(f"{len(steps)} step counts for a model of {n_codebooks} levels (codebooks): give at most "
                         f"{n_codebooks}")
    return steps + [1] * (n_codebooks - len(steps))


def unmask_schedule(n: int, steps: int) -> list[int]:
    """How many of n hidden codes each of `steps` steps fixes: after step i, floor(n cos(pi/2 (i+1)/steps))
    stay hidden, but every step fixes at least one while any is hidden and the last step fixes the rest."""
    fixed, hidden = [], n
    for i in range(steps):
        target = 0 if i == steps - 1 else math.floor(n * math.cos(math.pi / 2 * (i + 1) / steps))
        target = max(min(target, hidden - 1), 0)
        fixed.append(hidden - target)
        hidden = target
    return fixed


@dataclass
class MaskedStep:
    """One decoding step: `chunk`, `level`, `step` (within the level), `fixed` codes fixed in each row,
    `hidden` [B, W] bool the positions of the level still masked after it, `start` the chunk's first frame."""

    chunk: int
    level: int
    step: int
    fixed: int
    hidden: Tensor
    start: int


def chunk_starts(prompt_frames: int, total: int, window: int, context: int) -> list[tuple[int, int, int]]:
    """The chunks of a continuation: (first frame of the window, frames known in it, window end)."""
    chunks, done = [], prompt_frames
    while done < total:
        start = 0 if total <= window else max(0, done - context)
        end = min(start + window, total)
        chunks.append((start, done - start, end))
        done = end
    return chunks


def iter_masked_decode(model, codes: Tensor, prompt_frames: int, steps: list[int], choose, decoder: GuidedDecoder,
                       context: int, window: int, stretch: bool = False,
                       lengths: Tensor | None = None) -> Iterator[MaskedStep]:
    """Fill codes [B, N_c, T] (prompt frames in place) chunk by chunk, level by level; yields every step.
    lengths [B]: each row's frames (None: all T); frames past a row's length are no key of its attention."""
    b, n_c, total = codes.shape
    for c, (start, known, end) in enumerate(chunk_starts(prompt_frames, total, window, context)):
        tokens = codes[..., start:end].clone()
        tokens[..., known:] = model.mask_id
        frame_mask = None
        if lengths is not None and bool((lengths < end).any()):
            frame_mask = torch.arange(start, end, device=codes.device)[None, :] < lengths[:, None]
            frame_mask |= ~frame_mask.any(dim=1, keepdim=True)  # a row ended before this chunk: left as it is
        for q in range(n_c):
            hidden = torch.zeros(b, end - start, dtype=torch.bool, device=codes.device)
            hidden[:, known:] = True
            for i, n_fix in enumerate(unmask_schedule(end - start - known, steps[q])):
                logits = decoder(tokens, level=q, stretch=stretch, start=start,
                                 frame_mask=frame_mask)[:, 0, known:]  # [B, n, |V|]
                sampled, confidence = choose(logits, 1.0 - (i + 1) / steps[q])
                confidence = confidence.masked_fill(~hidden[:, known:], -math.inf)
                keep = confidence.topk(n_fix, dim=1).indices + known  # [B, n_fix], frames of the window
                tokens[:, q].scatter_(1, keep, sampled.gather(1, keep - known))
                hidden.scatter_(1, keep, False)
                yield MaskedStep(chunk=c, level=q, step=i, fixed=n_fix, hidden=hidden.clone(), start=start)
        codes[..., start + known:end] = tokens[..., known:]


def _chooser(sampling: SamplingOptions, generator: torch.Generator | None, choice_temperature: float = 0.0):
    """(logits [B, n, |V|], anneal) -> (codes [B, n], confidence [B, n]): the code's log-probability where it
    was drawn, plus choice_temperature x anneal x Gumbel noise (drawn only when that scale is > 0)."""
    def choose(logits: Tensor, anneal: float = 0.0) -> tuple[Tensor, Tensor]:
        if sampling.greedy:
            filtered, codes = logits.float(), logits.argmax(dim=-1)
        else:  # filtered once, for the draw and the confidence alike
            filtered = filter_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
            codes = draw(filtered, generator)
        confidence = filtered.log_softmax(dim=-1).gather(-1, codes[..., None])[..., 0]
        return codes, with_choice_noise(confidence, choice_temperature * anneal, generator)
    return choose


def with_choice_noise(confidence: Tensor, scale: float, generator: torch.Generator | None) -> Tensor:
    """confidence [...] + scale x Gumbel noise (MaskGIT's choice temperature); drawn only when scale > 0."""
    if scale <= 0:
        return confidence
    u = torch.rand(confidence.shape, generator=generator, device=confidence.device)
    return confidence + scale * -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))


def check_choice_temperature(tau) -> float:
    """tau as a float (None: DEFAULT_CHOICE_TEMPERATURE); ValueError in one line unless a finite number >= 0."""
    if tau is None:
        return DEFAULT_CHOICE_TEMPERATURE
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not (0 <= tau < math.inf):
        raise ValueError(f"the choice temperature must be a finite number >= 0 (0: keep the most confident codes), "
                         f"got {tau!r}")
    return float(tau)


@dataclass(frozen=True)
class MaskedDecoding:
    """The masked family's own decoding options. steps: per level (`steps_per_level`; None: 8, 2, 1, ...).
    choice_temperature: MaskGIT's Gumbel noise on the confidence that ranks which codes a step keeps
    (annealed to 0 by each level's last step; None: DEFAULT_CHOICE_TEMPERATURE, 0: the most confident).
    window: frames per model pass (None: `default_window`; past max_frames only for RoPE). context:
    frames of the past a later chunk sees (None: half a window). on_step: called with each MaskedStep."""

    steps: Sequence[int] | str | None = None
    choice_temperature: float | None = None
    window: int | None = None
    context: int | None = None
    on_step: Callable[[MaskedStep], None] | None = None

    def __post_init__(self) -> None:
        check_choice_temperature(self.choice_temperature)


def decode(model, request: DecodeRequest) -> tuple[Tensor, Tensor]:
    """The masked family's decoding (lm.families): the request's prompt [B, N_c, T0] continued by its
    new frames -> codes [B, N_c, T0 + n], the prompt copied unchanged, and lengths [B] (all T0 + n).
    An aligned-text LM says each row's text in the frames its durations fill (at most T0 + n): codes
    [B, N_c, longest row], 0 past each row's length."""
    options: MaskedDecoding = request.options
    cfg, prompt, device = model.config, request.prompt, model.device
    level_steps = steps_per_level(options.steps, cfg.n_codebooks)
    b, _, t0 = prompt.shape
    total = t0 + request.new_frames
    decoder = GuidedDecoder(model, request.condition, request.sampling, b)
    lengths = torch.full((b,), total, dtype=torch.long, device=device)
    said = None if decoder.memory is None or decoder.memory.frames is None else decoder.memory.frame_len[:b]
    if said is not None and bool((said > 0).any()):  # aligned text: the text's frames, at most the asked ones
        total = min(total, max(t0 + 1, int(said.max())))
        lengths = torch.where(said > 0, said.clamp(t0 + 1, total), total)
    window = _window(cfg, options.window, total)
    context = window // 2 if options.context is None else options.context
    if not 0 <= context < window:
        raise ValueError(f"context must be in 0..{window - 1} frames (the window is {window}), got {context}")
    codes = torch.zeros(b, cfg.n_codebooks, total, dtype=torch.long, device=device)
    codes[..., :t0] = prompt
    bar = ProgressBar(len(chunk_starts(t0, total, window, context)) * sum(level_steps), request.progress, unit="call")
    try:
        choose = _chooser(request.sampling, request.generator, check_choice_temperature(options.choice_temperature))
        for step in iter_masked_decode(model, codes, t0, level_steps, choose, decoder, context, window,
                                       stretch=window > cfg.max_frames, lengths=lengths):
            if options.on_step is not None:
                options.on_step(step)
            bar.update(1)
    finally:
        bar.close()
    return codes * (torch.arange(total, device=device) < lengths[:, None, None]), lengths


def default_window(cfg, total_frames: int) -> int:
    """Frames per pass when none is given: the whole clip (prompt + continuation) for a RoPE model when
    it is at most ONE_PASS_STRETCH x max_frames, else max_frames."""
    if cfg.pos == "rope" and total_frames <= int(ONE_PASS_STRETCH * cfg.max_frames):
        return max(total_frames, cfg.max_frames)
    return cfg.max_frames


def _window(cfg, window: int | None, total_frames: int) -> int:
    """Frames per pass: `default_window` when None; past max_frames only with RoPE (ValueError naming the limit)."""
    if window is None:
        return default_window(cfg, total_frames)
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an integer >= 2 frames, got {window!r}")
    if window > cfg.max_frames and cfg.pos != "rope":
        raise ValueError(f"window {window} is past the context ({cfg.max_frames} frames) of a model with {cfg.pos} "
                         "positions; only a RoPE model can be stretched")
    return window


def model_calls(prompt_frames: int, new_frames: int, window: int, steps: list[int], context: int | None = None) -> int:
    """Sequential model calls masked decoding makes for this request (chunks x sum of the steps)."""
    context = window // 2 if context is None else context
    return len(chunk_starts(prompt_frames, prompt_frames + new_frames, window, context)) * sum(steps)
