"""MaskedLM: the masked-token family of the multi-codebook LM (docs/theory.md, seed 000: masked
language modeling with an encoder, no causal mask), trained level by level as SoundStorm does.

    tokens [B, N_c, T] ids (codes 0..|V|-1, mask |V| + 1, pad |V|; frames, no pattern)
      -> sum over codebooks of E_c[tokens[:, c]] (+ positions) -> pre-norm blocks WITHOUT a causal
         mask (padded frames are never keys) -> final norm -> head q: [B, T, |V|]

It is the trunk every family shares (lm.trunk: same embeddings, blocks, every norm / FFN / position
option, heads, condition encoder, folders) with LMConfig.family = "masked": the row an AR LM keeps for
bos is each codebook's learned mask token, and attention sees both sides.

Objective, per example (`draw_masking`): a level q; a prefix of frames that stays visible at every
level (what a prompt is at generation); after it, level q hidden at a ratio cos(pi/2 u), u ~ U(0, 1)
(at least one frame), the levels after q all hidden, the levels before q visible. The loss is the
mean of -ln P(x | visible) over the hidden positions of level q only (seed 000's statement);
padding is in neither the sum nor the count. Its losses are not the factors of a chain rule, so a
masked LM has no sequence likelihood and no token NLL (an AR LM's capabilities, which it lacks).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lm.conditioning import ConditionInputs
from lm.kv_cache import CrossMemory
from lm.trunk import LMLoss, LMTrunk


@dataclass
class Masking:
    """One masked batch. inputs [B, N_c, T] ids the model reads; hidden [B, T] bool: frames whose
    level-`level` code is a target; level [B] long: the level q of each row; prefix [B] long: frames
    visible at every level."""

    inputs: Tensor
    hidden: Tensor
    level: Tensor
    prefix: Tensor


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    return torch.rand(shape, generator=generator, device=device)


def draw_masking(codes: Tensor, frame_mask: Tensor, mask_id: int, pad_id: int,
                 generator: torch.Generator | None = None, *, level: int | None = None,
                 ratio: float | None = None, prefix_prob: float = 1.0) -> Masking:
    """SoundStorm's masking of codes [B, N_c, T] with frame_mask [B, T] (True = real frame, at row starts).

    level: fix q for every row (default: uniform over 0..N_c-1). ratio: fix the hidden share of
    level q (default: cos(pi/2 u)). prefix_prob: the chance a row keeps a visible prefix, of length
    uniform in 0..L-1 for L real frames (0: none). Draws come from `generator` in a fixed order."""
    b, n_c, t = codes.shape
    device = codes.device
    lengths = frame_mask.sum(dim=1)
    if bool((lengths < 1).any()):
        raise ValueError("every row needs at least one real frame to mask")
    if level is None:
        q = torch.randint(0, n_c, (b,), generator=generator, device=device)
    else:
        if not 0 <= level < n_c:
            raise ValueError(f"level must be in 0..{n_c - 1}, got {level}")
        q = torch.full((b,), level, dtype=torch.long, device=device)
    prefix = (_uniform((b,), generator, device) * lengths).long().clamp(max=lengths - 1)
    prefix = prefix.where(_uniform((b,), generator, device) < prefix_prob, 0)
    r = torch.cos(math.pi / 2 * _uniform((b,), generator, device)) if ratio is None else torch.full(
        (b,), float(ratio), device=device)
    free = lengths - prefix  # frames after the prefix, >= 1
    k = torch.ceil(r * free).long().clamp(min=1).minimum(free)
    frames = torch.arange(t, device=device)
    candidate = frame_mask & (frames[None, :] >= prefix[:, None])
    scores = _uniform((b, t), generator, device).masked_fill(~candidate, 2.0)
    rank = scores.argsort(dim=1).argsort(dim=1)
    hidden = rank < k[:, None]  # the k candidates with the lowest scores
    levels = torch.arange(n_c, device=device)[None, :, None]
    qq = q[:, None, None]
    masked = ((levels > qq) & candidate[:, None, :]) | ((levels == qq) & hidden[:, None, :])
    inputs = codes.long().masked_fill(masked, mask_id).masked_fill(~frame_mask[:, None, :], pad_id)
    return Masking(inputs=inputs, hidden=hidden, level=q, prefix=prefix)


class MaskedLM(LMTrunk):
    """A bidirectional multi-codebook transformer predicting masked codes (LMConfig.family = "masked").

    forward: tokens [B, N_c, T] -> logits [B, N_c, T, |V|] (or [B, 1, T, |V|] for one `level`).
    loss: codes [B, N_c, T] -> LMLoss over the hidden positions of each row's level (`draw_masking`).
    Generation: lm.generate.generate(model, ...), by iterative parallel decoding (lm.masked_generate).
    """

    family = "masked"

    @property
    def mask_id(self) -> int:
        """Each codebook's mask token: the embedding row |V| + 1 (an AR LM's bos row)."""
        return self.config.bos_id

    def forward(self, tokens: Tensor, memory: CrossMemory | None = None, frame_mask: Tensor | None = None,
                level: int | None = None, stretch: bool = False, start: int = 0) -> Tensor:
        """tokens [B, N_c, T] ids in 0..|V|+1 -> logits [B, N_c, T, |V|]; `level` q: head q only, [B, 1, T, |V|].
        frame_mask [B, T] bool: False frames (padding) are no key of any attention. memory: as the AR LM's.
        stretch: let a RoPE model read more than max_seq_len frames (distances it was never trained on).
        start: the clip frame of tokens[..., 0] (a later chunk of a long generation: where the aligned text is)."""
        h = self.hidden_states(tokens, memory, frame_mask, stretch, start)
        weights = self.head_weights()
        if level is not None:
            weights = weights[level:level + 1]
        return torch.einsum("btd,cvd->bctv", h, weights.to(h.dtype))

    def hidden_states(self, tokens: Tensor, memory: CrossMemory | None = None,
                      frame_mask: Tensor | None = None, stretch: bool = False, start: int = 0) -> Tensor:
        """tokens [B, N_c, T] -> the final-norm outputs [B, T, d] of the bidirectional blocks."""
        cfg = self.config
        if tokens.dim() != 3 or tokens.shape[1] != cfg.n_codebooks or tokens.shape[-1] == 0:
            raise ValueError(f"tokens must have shape [B, {cfg.n_codebooks}, T >= 1], got {tuple(tokens.shape)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be integer ids, got {tokens.dtype}")
        b, _, t = tokens.shape
        if t > cfg.max_seq_len and not (stretch and self.rope is not None):
            raise ValueError(f"{t} frames exceed the masked LM's context max_seq_len={cfg.max_seq_len}"
                             + (" (a RoPE model can be stretched past it)" if self.rope is not None else ""))
        if bool(((tokens < 0) | (tokens >= cfg.embedding_rows)).any()):
            raise ValueError(f"token ids must be in 0..{cfg.embedding_rows - 1} (codes 0..{cfg.codebook_size - 1}, "
                             f"pad {cfg.pad_id}, mask {self.mask_id})")
        memory = self._memory_for(b, memory)
        positions = torch.arange(t, device=tokens.device)
        if start and memory is not None and memory.frames is not None:  # the aligned text from frame `start` on
            memory = dataclasses.replace(memory, frames=memory.frames[:, start:])
        keys = torch.ones(1, t, dtype=torch.bool, device=tokens.device) if frame_mask is None else frame_mask
        mask = keys[:, None, None, :]  # [B | 1, 1, 1, T]: every query sees every real frame, both sides
        return self.trunk(tokens, positions, mask, None, memory)

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per frame: 6 x the block matrices plus the one head a row is scored by, and attention."""
        cfg = self.config
        s = cfg.max_seq_len if seq_len is None else seq_len
        matmul = sum(p.numel() for name, p in self.blocks.named_parameters()
                     if p.dim() == 2 and ".cross_attn.kv." not in name)
        return 6 * (matmul + cfg.n_outputs * cfg.d_model) + 12 * cfg.n_layers * cfg.d_model * s

    # ---- the objective ---------------------------------------------------------------------------
    def loss(self, codes: Tensor, frame_mask: Tensor | None = None, condition: ConditionInputs | None = None,
             ends: Tensor | None = None, *, generator: torch.Generator | None = None, level: int | None = None,
             ratio: float | None = None, prefix_prob: float = 1.0) -> LMLoss:
        """codes [B, N_c, T] in 0..|V|-1, frame_mask [B, T] (False = padding at row ends) -> LMLoss: the
        mean NLL over the hidden positions of each row's level; nll_sum / count [N_c] per level.
        generator, level, ratio, prefix_prob: the masking (`draw_masking`). condition: a conditioned
        LM's texts and speakers (null when None); `ends` must be None (a masked LM has no end id). An
        aligned-text LM's LMLoss also carries its duration loss where the condition has durations."""
        if ends is not None:
            raise ValueError("a masked LM has no end-of-audio target: pass ends=None")
        self._check_codes(codes, frame_mask)
        if frame_mask is None:
            frame_mask = torch.ones(codes.shape[0], codes.shape[-1], dtype=torch.bool, device=codes.device)
        m = draw_masking(codes, frame_mask, self.mask_id, self.config.pad_id, generator, level=level, ratio=ratio,
                         prefix_prob=prefix_prob)
        memory = None if condition is None else self.encode_condition(condition)
        h = self.hidden_states(m.inputs, memory, frame_mask if not bool(frame_mask.all()) else None)
        weights = self.head_weights()[m.level].to(h.dtype)  # [B, |V|, d]: each row's level's head
        logits = torch.bmm(h, weights.transpose(1, 2))  # [B, T, |V|]
        targets = codes.long().gather(1, m.level[:, None, None].expand(-1, 1, codes.shape[-1]))[:, 0]
        nll = F.cross_entropy(logits[m.hidden].float(), targets[m.hidden], reduction="none")
        n_c = self.config.n_codebooks
        row_level = m.level[:, None].expand_as(m.hidden)[m.hidden]
        nll_sum = torch.zeros(n_c, dtype=nll.dtype, device=nll.device).index_add(0, row_level, nll)
        count = torch.zeros(n_c, dtype=torch.long, device=nll.device).index_add(
            0, row_level, torch.ones_like(row_level))
        return LMLoss(loss=nll.sum() / count.sum().clamp(min=1), nll_sum=nll_sum, count=count,
                      duration=self.duration_loss(memory, condition))
