"""Transformer building blocks, term by term as the seeds write them (docs/theory.md, seeds 000-002).

Shapes: B batch, S positions, d = d_model, H query heads, H_kv key/value heads, Dh = d / H.

* LayerNorm / RMSNorm act on each position's feature vector only (seeds 000 / 002).
* SinusoidalPositions / LearnedPositions are additive encodings H = E + P (seed 000);
  lm.rope's RotaryEmbedding rotates queries and keys inside attention instead (seed 002).
* Attention: scores q.k / sqrt(Dh), causal -inf mask, softmax, weighted values, heads
  concatenated and projected by W_O (seed 001), through F.scaled_dot_product_attention;
  grouped-query attention when H_kv < H (each K/V head serves H / H_kv query heads).
* CrossAttention: queries from the decoder rows, keys and values from the encoder output, no
  causal mask over the source (seed 000, encoder-decoder); only padding of the source is masked.
* FeedForward: phi(u W1 + b1) W2 + b2 (seed 000) or SwiGLU (Swish(x W1) * (x W2)) W3 (seed 001);
  with LMConfig.n_experts, a top-k routed mixture of them (lm.moe, seed 001's mixture of experts).
* Block: pre-norm, Z = O + FFN(Norm(O)) with O = H + MHA(Norm(H)) (seed 000); a conditioned
  decoder block inserts C = O + XA(Norm(O), memory) between the two, Z = C + FFN(Norm(C)), as
  MusicGen's decoder layers do.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from lm.config import LMConfig
from lm.kv_cache import CrossMemory, KVCache
from lm.rope import apply_rotary


# ---- normalisation ------------------------------------------------------------------------------
class LayerNorm(nn.Module):
    """gamma * (h - mu) / sqrt(sigma^2 + eps) + beta, mu and sigma^2 over the last (feature) axis only.

    [..., d] -> [..., d]. A constant vector has sigma^2 = 0 and maps to beta (docs/theory.md, seed 000).
    """

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))  # gamma
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None  # beta

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """w * h / sqrt(mean(h^2) + eps) over the last axis: LayerNorm with mu = 0 and no shift
    (docs/theory.md, seed 002). [..., d] -> [..., d]."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def make_norm(cfg: LMConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        # beta always: "a learned scale and shift" (docs/theory.md, seed 000)
        return LayerNorm(cfg.d_model, cfg.norm_eps)
    return RMSNorm(cfg.d_model, cfg.norm_eps)


# ---- positions ----------------------------------------------------------------------------------
class SinusoidalPositions(nn.Module):
    """Fixed additive encoding: P[i, 2m] = sin(i / 10000^(2m/d)), P[i, 2m+1] = cos(i / 10000^(2m/d)).

    positions [S] long -> [S, d].
    """

    def __init__(self, d: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if d % 2:
            raise ValueError(f"the sinusoidal encoding needs an even width, got {d}")
        i = torch.arange(max_len, dtype=torch.float64)[:, None]
        angle = i / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # [max_len, d/2]
        table = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # interleave: 2m sin, 2m+1 cos
        self.register_buffer("table", table.float(), persistent=False)
        self.max_len = max_len

    def forward(self, positions: Tensor) -> Tensor:
        return self.table[positions]


class LearnedPositions(nn.Module):
    """One learned row per position up to max_len (E_pos; docs/theory.md, seed 001). positions [S] long -> [S, d]."""

    def __init__(self, d: int, max_len: int):
        super().__init__()
        self.table = nn.Embedding(max_len, d)
        self.max_len = max_len

    def forward(self, positions: Tensor) -> Tensor:
        return self.table(positions)


# ---- attention ----------------------------------------------------------------------------------
class Attention(nn.Module):
    """Multi-head causal self-attention with optional grouped-query K/V heads and a KV cache.

    x [B, S, d] -> [B, S, d]. W_Q, W_K, W_V are fused into one `qkv` projection of width
    (H + 2 H_kv) Dh; W_O (`out`) maps the concatenated heads [B, S, H Dh = d] back to d.
    """

    def __init__(self, cfg: LMConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (self.n_heads + 2 * self.n_kv_heads) * self.head_dim, bias=cfg.bias)
        self.out = nn.Linear(self.n_heads * self.head_dim, cfg.d_model, bias=cfg.bias)
        self.attn_dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None, cache: KVCache | None = None,
                mask: Tensor | None = None) -> Tensor:
        """rope: (cos, sin) [S, Dh] for the S positions of x, or None.
        mask: [S, K] (or [B, 1, S | 1, K]) bool, True = may attend, or None for the plain causal
        mask (K = S) or, with a cache, for "every returned key is visible". A given mask replaces
        the causal one (the condition encoder passes only its padding mask: no causal mask there).
        """
        b, s, _ = x.shape
        heads = self.qkv(x).view(b, s, -1, self.head_dim).transpose(1, 2)  # [B, H + 2 H_kv, S, Dh]
        q, k, v = heads.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)  # keys are cached already rotated
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        causal = cache is None and mask is None
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal,
            dropout_p=self.attn_dropout if self.training else 0.0,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )  # [B, H, S, Dh]; softmax(q k^T / sqrt(Dh) + mask) v
        y = y.transpose(1, 2).reshape(b, s, -1)  # concatenate the heads: [B, S, H Dh]
        return self.resid_dropout(self.out(y))


class CrossAttention(nn.Module):
    """Multi-head cross-attention: queries from the decoder rows x, keys and values from the
    encoder output (seed 000), every real source position visible to every query (no causal mask
    over the source, no positions: the encoder put them into its output). GQA as in `Attention`.

    W_Q is `q` (d -> H Dh), W_K and W_V are fused into `kv` (d -> 2 H_kv Dh), W_O is `out`.
    """

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q = nn.Linear(cfg.d_model, self.n_heads * self.head_dim, bias=cfg.bias)
        self.kv = nn.Linear(cfg.d_model, 2 * self.n_kv_heads * self.head_dim, bias=cfg.bias)
        self.out = nn.Linear(self.n_heads * self.head_dim, cfg.d_model, bias=cfg.bias)
        self.attn_dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.record_heads = 0  # > 0: the next forwards keep the first record_heads heads' weights (lm.alignment)
        self.recorded: Tensor | None = None  # those weights [B, record_heads, S, M]
        self.focus: Tensor | None = None  # [B, F, M] bool: the source the first focus_heads heads' last F
        self.focus_heads = 0  # query rows may see (lm.alignment.ReadingWindow, at generation)

    def keys_values(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output [B, M, d] -> keys, values [B, H_kv, M, Dh] (computed once per sequence when generating)."""
        k, v = self.kv(states).chunk(2, dim=-1)
        return (rearrange(k, "b m (h d) -> b h m d", d=self.head_dim),
                rearrange(v, "b m (h d) -> b h m d", d=self.head_dim))

    def forward(self, x: Tensor, k: Tensor, v: Tensor, source_mask: Tensor) -> Tensor:
        """x [B, S, d], k/v [B, H_kv, M, Dh], source_mask [B, M] bool (True = real) -> [B, S, d]."""
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, S, Dh]
        mask = source_mask[:, None, None, :]
        if self.focus is not None and self.focus_heads:
            n = q.shape[2]
            focus = self.focus[:, -n:]  # [B, F, M], F <= S: the last rows'
            mask = mask.expand(-1, self.n_heads, n, -1).clone()
            mask[:, :self.focus_heads, n - focus.shape[1]:] &= focus[:, None]
        if self.record_heads:
            y = self._attend_recording(q, k.to(q.dtype), v.to(q.dtype), mask)
        else:
            y = F.scaled_dot_product_attention(
                q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
                dropout_p=self.attn_dropout if self.training else 0.0,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )  # [B, H, S, Dh]: softmax(q k^T / sqrt(Dh) + source padding mask) v
        return self.resid_dropout(self.out(y.transpose(1, 2).reshape(b, s, -1)))  # heads concatenated: [B, S, H Dh]

    def _attend_recording(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """The same attention (mask [B, 1 or H, 1 or S, M]) with its weights written out, keeping heads
        [:record_heads] in `recorded`."""
        group = self.n_heads // self.n_kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # [B, H, S, M]
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        self.recorded = weights[:, :self.record_heads]
        return F.dropout(weights, self.attn_dropout, self.training) @ v


# ---- feed-forward -------------------------------------------------------------------------------
class FeedForward(nn.Module):
    """phi(u W1 + b1) W2 + b2 applied to every position, phi = ReLU or GELU. [B, S, d] -> [B, S, d]."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)
        self.act = nn.ReLU() if cfg.ffn == "relu" else nn.GELU()
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.w2(self.act(self.w1(x))))


class SwiGLU(nn.Module):
    """(Swish(x W1 + b1) * (x W2 + b2)) W3 + b3 with Swish = SiLU (beta = 1). [B, S, d] -> [B, S, d]."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)  # gate
        self.w2 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)  # value
        self.w3 = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)  # back to d
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.w3(F.silu(self.w1(x)) * self.w2(x)))


def make_ffn(cfg: LMConfig, dense: bool = False) -> nn.Module:
    """The FFN sublayer `cfg` asks for: SwiGLU or FeedForward, or with n_experts a mixture of them
    (lm.moe); dense=True builds one expert."""
    if cfg.n_experts and not dense:
        from lm.moe import MoEFeedForward  # lm.moe builds its experts with this function

        return MoEFeedForward(cfg, lambda c: make_ffn(c, dense=True))
    return SwiGLU(cfg) if cfg.ffn == "swiglu" else FeedForward(cfg)


# ---- block --------------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-norm transformer block: O = H + MHA(Norm(H)); Z = O + FFN(Norm(O)). [B, S, d] -> [B, S, d].

    cross=True (a conditioned decoder): O = H + MHA(Norm(H)); C = O + XA(Norm(O), memory);
    Z = C + FFN(Norm(C)), XA reading the encoder output `memory` (lm.kv_cache.CrossMemory).
    """

    def __init__(self, cfg: LMConfig, layer_idx: int, cross: bool = False):
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(cfg, layer_idx)
        self.cross_norm = make_norm(cfg) if cross else None
        self.cross_attn = CrossAttention(cfg) if cross else None
        self.ffn_norm = make_norm(cfg)
        self.ffn = make_ffn(cfg)

    def forward(self, h: Tensor, rope: tuple[Tensor, Tensor] | None = None, cache: KVCache | None = None,
                mask: Tensor | None = None, memory: CrossMemory | None = None) -> Tensor:
        o = h + self.attn(self.attn_norm(h), rope, cache, mask)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("a cross-attention block needs the condition encoder's output (memory)")
            if memory.kv is not None:
                k, v = memory.kv[self.layer_idx]
            else:
                k, v = self.cross_attn.keys_values(memory.states)
            o = o + self.cross_attn(self.cross_norm(o), k, v, memory.mask)
        return o + self.ffn(self.ffn_norm(o))


def residual_projections(block: Block) -> list[nn.Linear]:
    """The layers that write into the residual stream (scaled at init, GPT-2 style)."""
    ffns = getattr(block.ffn, "experts", [block.ffn])  # a mixture: every expert's output projection
    ffn_out = [ffn.w3 if isinstance(ffn, SwiGLU) else ffn.w2 for ffn in ffns]
    cross = [] if block.cross_attn is None else [block.cross_attn.out]
    return [block.attn.out, *cross, *ffn_out]


def init_std(n_layers: int, residual: bool) -> float:
    return 0.02 / math.sqrt(2 * n_layers) if residual else 0.02
