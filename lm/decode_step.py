"""One cached decoding step of an AR LM, the hot loop of generation (lm.ar_decode): tokens [B, N_c, 1]
-> logits [B, N_c, 1, n_outputs], the next position after what the KV cache holds.

It runs the kernels `MultiCodebookLM.forward(tokens, cache=cache)` runs, in the same order on the same
shapes, so the logits are the same bit for bit (tests/test_decode_step.py), but without the cost around
them: no per-call checks of the ids (the decoder feeds back its own), RoPE angles read from a table
instead of computed each step, queries and keys rotated in one pass, norms and linear layers called
without their module wrappers (a float32 RMSNorm's ops called directly), no dropout calls (generation
runs in eval mode), and the cache's keys and values written in place without dtype round trips; in an
int8 LM, fbgemm called directly (its layers packed when the LM is loaded, `prepare`) and a SwiGLU's two
input matrices in one call (exact: see `_gate_and_value`). Anything it does not know (a mixture of experts, a
norm or position kind of its own) goes through the block's own modules, which is the same arithmetic.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lm.aligned_text import frames_at
from lm.kv_cache import CrossMemory, KVCache
from lm.layers import Block, LayerNorm, RMSNorm, SwiGLU
from lm.rope import apply_rotary
from rvqlm_core.int8_linear import Int8Linear, _full_range_activations


def _norm(module: nn.Module, x: Tensor) -> Tensor:
    """`module(x)` for the norms of lm.layers, called without the module wrapper. A float32 RMSNorm on the
    CPU runs the ops of ATen's CPU rms_norm itself (x^2 as x * x, the mean, + eps, rsqrt, two products):
    the same values bit for bit, without the wrapper's per-op checks and dispatch."""
    if type(module) is RMSNorm:
        w = module.weight
        if x.dtype == w.dtype == torch.float32 and x.device.type == "cpu":
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True).add_(module.eps)) * w
        return F.rms_norm(x, w.shape, w, module.eps)
    if type(module) is LayerNorm:
        return F.layer_norm(x, module.weight.shape, module.weight, module.bias, module.eps)
    return module(x)


def _linear(module: nn.Module, x: Tensor) -> Tensor:
    """`module(x)`: F.linear for an nn.Linear (what its forward calls), fbgemm's dynamic int8 linear for an
    Int8Linear already packed for it (what its forward calls), else the module."""
    kind = type(module)
    if kind is nn.Linear:
        return F.linear(x, module.weight, module.bias)
    if kind is Int8Linear and module._packed is not None and x.dtype == torch.float32:
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, module.in_features).contiguous(), module._packed,
                                               not _full_range_activations())
        return y.view(*x.shape[:-1], module.out_features)
    return module(x)


_FUSED: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _gate_and_value(ffn: nn.Module) -> Int8Linear | None:
    """An int8 SwiGLU's W1 and W2 as one Int8Linear of [2 d_ff, d] (made once, kept beside the module, not in
    it): one fbgemm call instead of two. The input is quantized once per call with the same scale either way,
    and each output is an exact int32 sum rescaled by its own row's scale, so both halves equal W1's and W2's
    outputs bit for bit. None where the layers are not packed int8 ones."""
    w1, w2 = ffn.w1, ffn.w2
    if type(w1) is not Int8Linear or type(w2) is not Int8Linear or w1._packed is None or w2._packed is None:
        return None
    kept = _FUSED.get(ffn)
    if kept is None or kept[0] is not w1 or kept[1] is not w2 or kept[2].weight.device != w1.weight.device:
        bias = None if w1.bias is None else torch.cat([w1.bias, w2.bias])
        fused = Int8Linear.from_pairs(torch.cat([w1.weight, w2.weight]), torch.cat([w1.weight_scale, w2.weight_scale]),
                                      bias)
        fused(torch.zeros(1, fused.in_features, device=w1.weight.device))  # packs it
        kept = _FUSED[ffn] = (w1, w2, fused)
    return kept[2]


def prepare(model: nn.Module) -> nn.Module:
    """Pack an int8 LM's layers for fbgemm and fuse its SwiGLU pairs (`_gate_and_value`) now, so that the
    first prefill and step do not (lm.trunk's loading calls it); a float LM is left as it is."""
    for module in model.modules():
        if type(module) is Int8Linear:
            module.pack()
    for module in model.modules():
        if type(module) is SwiGLU:
            _gate_and_value(module)
    return model


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
    if type(ffn) is not SwiGLU:
        return ffn(x)
    fused = _gate_and_value(ffn)
    if fused is None:
        return _linear(ffn.w3, F.silu(_linear(ffn.w1, x)) * _linear(ffn.w2, x))
    gate, value = _linear(fused, x).split(ffn.w1.out_features, dim=-1)
    return _linear(ffn.w3, F.silu(gate) * value)


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
    if memory is not None and memory.frames is not None:
        h = h + frames_at(memory.frames, positions).to(h.dtype)
    rope = None
    if model.pos_embedding is not None:
        h = h + model.pos_embedding(positions)
    else:
        rope = model.rope.cos_sin_at(cache.length - 1, h.dtype)
    for block in model.blocks:
        h = _block(block, h, rope, cache, memory)
    return model.logits(_norm(model.final_norm, h))
