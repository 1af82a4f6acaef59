"""Autoregressive generation of code frames with a MultiCodebookLM (docs/theory.md, seed 001:
decoding and the KV cache).

Generation walks the codebook pattern's steps left to right:

    step s:  input = bos (s = 0) or the ids placed at step s - 1   -> logits for step s [B, N_c, |V|]
             per codebook: a forced id where the pattern position is known (a prompt frame, or
             `pad` where the pattern marks the position invalid), else a sampled one.

The prompt's steps go through the model in one batched "prefill" pass; after it each step feeds one
position into a KV cache preallocated for the whole generation.

A conditioned LM reads a text and a speaker (lm.conditioning) through cross-attention whose keys
and values are computed once per sequence, with classifier-free guidance (lm.guidance), and stops
each row where codebook 0 chooses the end-of-audio id (lm.end_of_audio), or at max_new_frames.

Past the trained context (W = `max_seq_len` positions), `sink=True` (the default) keeps bos in view
as every training window does: a ring cache with a sink slot (RoPE, see lm.kv_cache), or a
recompute of the training window [bos] + the last W-1 inputs at positions 0..W-1 (additive
encodings). `sink=False` is the plain sliding window: a ring cache of the last W positions (RoPE;
equal to `model(x, window=W)`) or a recompute of the last W inputs. `use_cache=False` recomputes
the whole prefix (past the context: the window `sink` chooses) at every step: the reference the
cached path is tested against. Why the sink: docs/experiments.md, "language model".
"""

from __future__ import annotations

import time
from functools import partial
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
from torch import Tensor

from lm.alignment import reads_in_order
from lm.config import LMConfig
from lm.end_of_audio import EndTracker
from lm.guidance import ConditionedDecoder
from lm.kv_cache import KVCache
from lm.patterns import CodebookPattern
from lm.sampling import check_sampling_args, sample_next


class DecodableLM(Protocol):
    """What decoding uses of a model; `lm.model.MultiCodebookLM` is the one there is (its `generate`
    method calls this module, so this module names the model by what it uses instead of importing it)."""

    cfg: LMConfig
    pattern: CodebookPattern
    training: bool

    @property
    def device(self) -> torch.device: ...

    def __call__(self, tokens: Tensor, cache: KVCache | None = None, window: int | None = None) -> Tensor: ...

    def new_cache(self, batch_size: int, max_len: int | None = None, ring: bool = False,
                  dtype: torch.dtype | None = None, sink: bool = False) -> KVCache: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...


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


def check_prompt(model: DecodableLM, prompt_codes: Tensor) -> None:
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


def plan_generation(model: DecodableLM, prompt_codes: Tensor, max_new_frames: int) -> GenerationPlan:
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
    model: DecodableLM,
    plan: GenerationPlan,
    choose: Callable[[Tensor], Tensor],
    *,
    use_cache: bool = True,
    sink: bool = True,
) -> Iterator[DecodeStep]:
    """Fill `plan.seq` step by step from `plan.first_step` on, yielding each step's logits and ids.

    choose: logits [B, N_c, |V|] -> ids [B, N_c] (e.g. a partial of `sample_next`).
    sink: past the context, keep bos in view as in training (see the module docstring).
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
    cache = None
    if use_cache:
        ring = rope and n_steps > window
        cache = model.new_cache(seq.shape[0], max_len=min(n_steps, window), ring=ring, sink=ring and sink)

    for s in range(plan.first_step, n_steps):
        if cache is not None and (s < window or rope):
            # Prefill (the whole prompt at once) on the first step, one position afterwards.
            start = 0 if s == plan.first_step else s
            logits = model(inputs[..., start:s + 1], cache=cache)[:, :, -1]
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


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A torch.Generator on `device` seeded with `seed` (None: use torch's global RNG)."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def generate(
    model: DecodableLM,
    prompt_codes: Tensor | None,
    max_new_frames: int,
    *,
    text: str | Sequence[str | None] | None = None,
    speaker: str | Sequence[str | None] | None = None,
    cfg_scale: float | None = None,
    speaker_cfg_scale: float | None = None,
    monotonic: bool | None = None,
    return_lengths: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    batch_size: int = 1,
    use_cache: bool = True,
    sink: bool = True,
    progress: bool = False,
    frame_rate: float | None = None,
    on_frames: Callable[[Tensor, Tensor], None] | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Continue `prompt_codes` [B, N_c, T0] by `max_new_frames` frames -> codes [B, N_c, T0 + n].

    The prompt frames are copied, never sampled; `prompt_codes=None` starts from bos (B rows: a list
    of texts or speakers, else `batch_size`). Rows are independent samples of one batched pass:
    greedy, or sampling at `temperature` after top-k then top-p (lm.sampling), reproducible with
    `generator` or `seed`. `progress`: a tqdm bar with frames/s and, given `frame_rate`, the
    real-time factor (compute time / audio time). Past the context, `sink` keeps bos in view.

    A conditioned LM takes `text` and `speaker` (one per row or one for all; None: null), guidance scales
    (lm.guidance) `cfg_scale` (default 3 with a condition, else 1) and `speaker_cfg_scale` (default: the same)
    and `monotonic` (lm.alignment.ReadingWindow; default: on for an LM trained with guided attention).
    Its rows stop at the end-of-audio token: codes [B, N_c, longest row], 0 past each row's end;
    `return_lengths` also returns lengths [B] (frames, prompt included). An unconditioned LM refuses these.
    `on_frames(codes [B, N_c, n], ends [B])` gets the prompt's frames, then each frame once complete (0 past
    a row's end; ends: the row lengths known so far, prompt included), for `rvqlm generate --stream`.
    """
    check_sampling_args(temperature, top_k, top_p, greedy)
    cfg, device = model.config, model.device
    _refuse_conditions(cfg, text, speaker, cfg_scale, speaker_cfg_scale, monotonic)
    if prompt_codes is None:
        prompt_codes = torch.zeros(_rows_asked(text, speaker, batch_size), cfg.n_codebooks, 0, dtype=torch.long)
    plan = plan_generation(model, prompt_codes.to(device), max_new_frames)
    generator = generator if generator is not None else make_generator(seed, device)
    choose = partial(sample_next, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy, generator=generator)
    was_training, _ = model.training, model.eval()
    bar = _ProgressBar(max_new_frames, progress, frame_rate)
    try:
        with torch.inference_mode():
            decoder = model if cfg.condition is None else _bind_conditions(
                model, text, speaker, (cfg_scale, speaker_cfg_scale), monotonic, plan)
            _decode(decoder, plan, choose, bar, use_cache=use_cache, sink=sink, on_frames=on_frames)
    finally:
        bar.close()
        model.train(was_training)
    codes, lengths = _frames_of(model, plan)
    return (codes, lengths) if return_lengths else codes


def _frames_of(model: DecodableLM, plan: GenerationPlan) -> tuple[Tensor, Tensor]:
    """The filled plan -> codes [B, N_c, T] (0 past a row's end) and each row's length [B] in frames."""
    codes = model.pattern.revert(plan.seq)
    if plan.end is None:
        return codes, torch.full((codes.shape[0],), codes.shape[-1], dtype=torch.long, device=codes.device)
    return plan.end.trim(codes), plan.end.ends.clone()


def _refuse_conditions(cfg, *conditions) -> None:
    """Refuse any condition (text, speaker, cfg_scale, speaker_cfg_scale, monotonic) for an unconditioned LM
    (ValueError)."""
    if cfg.condition is None and any(x is not None for x in conditions):
        raise ValueError("this LM is not conditioned (no condition encoder): text, speaker, cfg_scale, speaker_cfg_scale, "
                         "monotonic need an LM trained with LMConfig.condition; allowed here: a prompt and the sampling "
                         "options")


def _bind_conditions(model, text, speaker, scales: tuple[float | None, float | None], monotonic: bool | None,
                     plan: GenerationPlan) -> ConditionedDecoder:
    """A conditioned LM bound to one condition per row of the plan (scales: cfg_scale, default 3 with a
    condition, and speaker_cfg_scale, default cfg_scale; monotonic reading: default on where the LM was
    trained with guided attention)."""
    given = text is not None or speaker is not None
    scale = scales[0] if scales[0] is not None else 3.0 if given else 1.0
    return ConditionedDecoder(model, model.condition_inputs(text, speaker, plan.seq.shape[0]), scale,
                              reads_in_order(model.config, monotonic), speaker_scale=scales[1])


def _rows_asked(text, speaker, batch_size: int) -> int:
    """The number of rows to generate without a prompt: a list of texts or speakers gives it, else batch_size."""
    for values in (text, speaker):
        if values is not None and not isinstance(values, str):
            return len(list(values))
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return batch_size


def _decode(model: DecodableLM, plan: GenerationPlan, choose: Callable[[Tensor], Tensor], bar: "_ProgressBar",
            use_cache: bool, sink: bool, on_frames: Callable[[Tensor, Tensor], None] | None = None) -> None:
    """Run `iter_decode` to its end, counting finished frames on the progress bar and handing them
    to `on_frames` (see `generate`)."""
    delays = model.pattern.delays()
    done, total = plan.prompt_frames, plan.prompt_frames + plan.new_frames
    emit = partial(_emit_frames, plan, delays, on_frames) if on_frames is not None else lambda start, stop: None
    emit(0, done)
    for step in iter_decode(model, plan, choose, use_cache=use_cache, sink=sink):
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


class _ProgressBar:
    """tqdm over generated frames showing frames/s and the real-time factor; a no-op when disabled."""

    def __init__(self, total: int, enabled: bool, frame_rate: float | None):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="frame", desc="generate", dynamic_ncols=True)
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
