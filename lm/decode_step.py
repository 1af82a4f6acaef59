"""One cached decoding step of an AR LM, the hot loop of generation (lm.ar_decode): tokens [B, N_c, 1]
-> logits [B, N_c, 1, n_outputs], the next position after what the KV cache holds.

It runs the kernels `MultiCodebookLM.forward(tokens, cache=cache)` runs, in the same order on the same
shapes, so the logits are the same bit for bit (tests/test_decode_step.py), but without the cost around
them: no per-call checks of the ids (the decoder feeds back its own), RoPE angles read from a table
instead of computed each step, queries and keys rotated in one pass, norms and linear layers called
without their module wrappers, no dropout calls (generation runs in eval mode), and the cache's keys and
values written in place without dtype round trips. Anything it does not know (a mixture of experts, a
norm or position kind of its own) goes through the block's own modules, which is the same arithmetic.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lm.kv_cache import CrossMemory, KVCache
from lm.layers import Block, LayerNorm, RMSNorm
from lm.rope import apply_rotary


def _norm(module: nn.Module, x: Tensor) -> Tensor:
    """`module(x)` for the norms of lm.layers, called without the module wrapper."""
    if type(module) is RMSNorm:
        return F.rms_norm(x, module.weight.shape, module.weight, module.eps)
    if type(module) is LayerNorm:
        return F.layer_norm(x, module.weight.shape, module.weight, module.bias, module.eps)
    return module(x)


def _linear(module: nn.Module, x: Tensor) -> Tensor:
    """`module(x)`: F.linear for an nn.Linear (what its forward calls), else the module (Int8Linear)."""
    if type(module) is nn.Linear:
        return F.linear(x, module.weight, module.bias)
    return module(x)


def _self_attention(block: Block, x: Tensor, rope: tuple[Tensor, Tensor] | None, cache: KVCache) -> Tensor:
    """The block's attention over one new position x [B, 1, d] with the cache -> [B, 1, d] (before the residual)."""
    attn = block.attn
    b = x.shape[0]
    heads = _linear(attn.qkv, x).view(b, 1, -1, attn.head_dim).transpose(1, 2)  # [B, H + 2 H_kv, 1, Dh]
    n_qk = attn.n_heads + attn.n_kv_heads
    qk = heads[:, :n_qk] if rope is None else apply_rotary(heads[:, :n_qk], *rope)  # q and k rotated at once
    q, k = qk.split([attn.n_heads, attn.n_kv_heads], dim=1)
    k, v = cache.update(attn.layer_idx, k, heads[:, n_qk:])
    y = F.scaled_dot_product_attention(q, k, v, enable_gqa=attn.n_kv_heads != attn.n_heads)  # [B, H, 1, Dh]
    return _linear(attn.out, y.transpose(1, 2).reshape(b, 1, -1))


def _ffn(ffn: nn.Module, x: Tensor) -> Tensor:
    """The block's feed-forward sublayer on x [B, 1, d] (SwiGLU unwrapped; any other kind: its module)."""
    if type(ffn).__name__ == "SwiGLU":
        return _linear(ffn.w3, F.silu(_linear(ffn.w1, x)) * _linear(ffn.w2, x))
    return ffn(x)


def _block(block: Block, h: Tensor, rope: tuple[Tensor, Tensor] | None, cache: KVCache,
           memory: CrossMemory | None) -> Tensor:
    """Block.forward for one cached position: O = H + MHA(Norm(H)); [C = O + XA(Norm(O))]; O + FFN(Norm(O))."""
    o = h + _self_attention(block, _norm(block.attn_norm, h), rope, cache)
    if block.cross_attn is not None:
        k, v = memory.kv[block.layer_idx]
        o = o + block.cross_attn(_norm(block.cross_norm, o), k, v, memory.mask)
    return o + _ffn(block.ffn, _norm(block.ffn_norm, o))


def can_step(model, cache: KVCache | None, memory: CrossMemory | None) -> bool:
    """Whether `decode_step` applies: an eval-mode model, a cache with room for one more position (or a
    ring), and a conditioned LM's cross-attention keys and values already computed (`cross_memory`)."""
    if cache is None or model.training or (model.rope is None and cache.length + 1 > model.config.max_seq_len):
        return False
    if cache.length + 1 > cache.max_len and not cache.ring:
        return False
    return model.condition_encoder is None or (memory is not None and memory.kv is not None)


def decode_step(model, tokens: Tensor, cache: KVCache, memory: CrossMemory | None = None) -> Tensor:
    """tokens [B, N_c, 1] (the decoder's own ids) -> logits [B, N_c, 1, n_outputs], equal to
    `model(tokens, cache=cache, memory=memory)`; falls back to that call where `can_step` says no."""
    if not can_step(model, cache, memory):
        return model(tokens, cache=cache, memory=memory)
    positions, _ = cache.begin(1)
    h = model.embed(tokens)
    if memory is not None and memory.voice is not None:
        h = h + memory.voice.to(h.dtype)[:, None, :]
    rope = None
    if model.pos_embedding is not None:
        h = h + model.pos_embedding(positions)
    else:
        rope = model.rope.cos_sin_at(cache.length - 1, h.dtype)
    for block in model.blocks:
        h = _block(block, h, rope, cache, memory)
    return model.logits(_norm(model.final_norm, h))
