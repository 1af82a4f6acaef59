"""Choosing the next token from the LM's logits: greedy, temperature, top-k, top-p.

Each filter takes logits `[..., V]` and returns logits of the same shape in which the removed
entries are `-inf` (so a following softmax gives them probability exactly 0). They compose:
`sample_next` applies temperature, then top-k (a hard cut of the long tail), then top-p on what
is left (a cut that adapts to the model's confidence), then samples.

`SamplingOptions` is the one value every family's generation takes (lm.generate).

Ties are broken deterministically everywhere: among equal logits the LOWER token id ranks first.
This matches `torch.argmax` (first maximal index), so `top_k=1` is exactly greedy decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


def _rank_order(logits: torch.Tensor) -> torch.Tensor:
    """Indices `[..., V]` sorting `logits` best first; equal logits keep ascending token id."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices


def _keep_mask_from_sorted(keep_sorted: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Scatter a keep-mask given in ranked order back to token-id order."""
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the `k` highest logits along the last dim, set the rest to -inf.

    logits: `[..., V]`. Exactly `min(k, V)` entries survive per row; ties at the cut keep the
    lower token ids. `k >= V` returns an unchanged copy.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top-k must be an integer >= 1, got {k!r}")
    vocab = logits.shape[-1]
    if k >= vocab:
        return logits.clone()
    # The k-th largest value, found without a sort, is the threshold. Without a tie at it, the k
    # logits >= it are the answer; with one, everything above it, then the lowest-id ties at it
    # until k are kept.
    kth = torch.kthvalue(logits, vocab - k + 1, dim=-1, keepdim=True).values
    keep = logits >= kth
    if bool((keep.sum(dim=-1) == k).all()):  # no tie at the cut (the usual case): the threshold is the answer
        return logits.masked_fill(~keep, NEG_INF)
    above = logits > kth
    at_kth = logits == kth
    room = k - above.sum(dim=-1, keepdim=True)
    keep = above | (at_kth & (at_kth.cumsum(dim=-1) <= room))
    return logits.masked_fill(~keep, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of top tokens whose probabilities sum to at least `p`.

    logits: `[..., V]`; p in (0, 1]. Tokens are ranked by probability (ties: lower id first) and
    a token is kept while the mass of the tokens ranked above it is still below `p`, so the most
    probable token always survives and the kept mass is >= p. The probabilities are accumulated
    in float64 so hand-computed boundaries (e.g. 0.5 + 0.3 vs p = 0.8) behave as on paper up to
    float64 rounding. `p == 1` keeps everything.
    """
    p = float(p)
    if not (0.0 < p <= 1.0):
        raise ValueError(f"top-p must be in (0, 1], got {p}")
    if p == 1.0:
        return logits.clone()
    order = _rank_order(logits)
    probs = torch.softmax(logits.double(), dim=-1).gather(-1, order)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    keep_sorted = mass_before < p
    keep_sorted[..., 0] = True
    keep = _keep_mask_from_sorted(keep_sorted, order)
    return logits.masked_fill(~keep, NEG_INF)


DEFAULT_CFG_SCALE = 3.0  # the guidance scale with a text or speaker given, when none is asked for


def _scale(value, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"the {what} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SamplingOptions:
    """How every LM family draws its codes, validated once: greedy (argmax), or sampling at
    `temperature` after top-k then top-p (None: off); `seed` makes the draws reproducible (None:
    torch's global RNG). A conditioned LM's classifier-free guidance scales (lm.guidance): `cfg_scale`
    (None: DEFAULT_CFG_SCALE with a text or speaker, else 1) and the speaker's own `speaker_cfg_scale`
    (None: the same as cfg_scale). ValueError in one line for an impossible request."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    greedy: bool = False
    seed: int | None = None
    cfg_scale: float | None = None
    speaker_cfg_scale: float | None = None

    def __post_init__(self) -> None:
        if not self.greedy and not (self.temperature > 0):
            raise ValueError(f"temperature must be > 0 when sampling (got {self.temperature}); use --greedy for "
                             "argmax decoding")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise ValueError(f"top-k must be an integer >= 1, got {self.top_k!r}")
        if self.top_p is not None and not (0.0 < float(self.top_p) <= 1.0):
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        object.__setattr__(self, "cfg_scale", _scale(self.cfg_scale, "guidance scale (cfg)"))
        object.__setattr__(self, "speaker_cfg_scale", _scale(self.speaker_cfg_scale, "speaker guidance scale"))

    def guidance_scales(self, condition_given: bool) -> tuple[float, float]:
        """(text scale s, speaker scale s_v) with the defaults filled in."""
        scale = self.cfg_scale if self.cfg_scale is not None else DEFAULT_CFG_SCALE if condition_given else 1.0
        return scale, scale if self.speaker_cfg_scale is None else self.speaker_cfg_scale

    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """A torch.Generator on `device` seeded with `seed` (None without one: torch's global RNG)."""
        if self.seed is None:
            return None
        g = torch.Generator(device=device)
        g.manual_seed(self.seed)
        return g

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """`sample_next` with these options (validated once, when they were made): logits [..., V] -> ids [...]."""
        if self.greedy:
            return logits.argmax(dim=-1)
        return draw(filter_logits(logits, self.temperature, self.top_k, self.top_p), generator)


def filter_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Temperature, then top-k, then top-p: the logits `sample_next` draws from. Shape `[..., V]`.

    The row maximum is subtracted before dividing by the temperature, so a tiny temperature sends
    the other logits towards -inf instead of overflowing the best one to +inf (no NaN).
    """
    logits = logits.float()
    logits = logits - logits.amax(dim=-1, keepdim=True)
    if temperature != 1.0:  # x / 1 == x exactly: skip the pass
        logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return logits


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick one token per row of `logits [..., V]`; returns int64 ids `[...]`.

    greedy: argmax (first maximal id), ignoring temperature and the filters.
    Otherwise sample from softmax(filter_logits(logits / temperature)); top_k=None and
    top_p=None (or 1) disable those filters. `generator` makes the draw reproducible.
    """
    return SamplingOptions(temperature, top_k, top_p, greedy).sample(logits, generator)


def draw(filtered: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id per row of softmax(filtered): filtered logits [..., V] (`filter_logits`) -> int64 ids [...].

    torch.multinomial(probs, 1)'s own algorithm for one draw, argmax(p / q) with q ~ Exp(1) drawn for every
    entry from `generator` (the same ids from the same generator state; tests/test_decode_step.py), without
    its checks of the input: softmax of logits whose maximum is 0 has finite probabilities summing to >= 1.
    ValueError if a row's largest logit is NaN or infinite (a broken model), as multinomial would raise."""
    if not bool(torch.isfinite(filtered.amax(dim=-1)).all()):
        raise ValueError("the model gave NaN or infinite logits: its weights are broken or overflowed")
    probs = torch.softmax(filtered, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    q = torch.empty_like(flat).exponential_(1, generator=generator)
    return flat.div_(q).argmax(dim=-1).reshape(probs.shape[:-1])
