"""KV cache (lm/kv_cache.py): cached decoding equals full forwards, in the linear, plain ring (sliding window)
and sink ring (bos kept in view past the window, at its training distance) modes.

Tolerance: fp32 logits agree to 1e-5 absolute (the cached and full passes sum the same terms in a
different order; observed differences are ~1e-7).
"""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

from lm import KVCache, LMConfig, MultiCodebookLM
from lm.rope import apply_rotary

ATOL = 1e-5


def tiny(**overrides) -> LMConfig:
    base = dict(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    base.update(overrides)
    return LMConfig(**base)


def random_tokens(cfg: LMConfig, batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, cfg.embedding_rows, (batch, cfg.n_codebooks, length))


def decode(model: MultiCodebookLM, tokens: torch.Tensor, cache: KVCache, chunks: list[int]) -> torch.Tensor:
    """Feed tokens [B, N_c, S] through the cache in chunks of the given sizes -> logits [B, N_c, S, |V|]."""
    out, start = [], 0
    for n in chunks:
        out.append(model(tokens[..., start:start + n], cache=cache))
        start += n
    assert start == tokens.shape[-1]
    return torch.cat(out, dim=2)


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "learned"])
@pytest.mark.parametrize("variant", [dict(), dict(n_kv_heads=None, norm="layernorm", ffn="gelu", bias=True)])
def test_cached_step_by_step_logits_equal_full_forward(pos, variant):
    """Seed 001 (KV cache): reusing stored keys/values and computing only the new token's q, k, v gives the same
    next-token distributions as the full forward over the same sequence (compared: all logits, atol 1e-5)."""
    cfg = tiny(pos=pos, **variant)
    model = MultiCodebookLM(cfg).eval()
    tokens = random_tokens(cfg, 2, 20)
    with torch.no_grad():
        full = model(tokens)
        one_by_one = decode(model, tokens, model.new_cache(2, 32), [1] * 20)
        prefill_then_steps = decode(model, tokens, model.new_cache(2, 20), [7, 1, 1, 5, 1, 1, 1, 1, 1, 1])
    torch.testing.assert_close(one_by_one, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(prefill_then_steps, full, atol=ATOL, rtol=0)


def test_cache_is_preallocated_and_written_in_place():
    """Issue 5: the cache is allocated once for the whole generation, not grown with torch.cat every step."""
    cfg = tiny()
    model = MultiCodebookLM(cfg).eval()
    cache = model.new_cache(2, 16)
    assert cache.keys.shape == (cfg.n_layers, 2, cfg.kv_heads, 16, cfg.head_dim)
    ptr_k, ptr_v = cache.keys.data_ptr(), cache.values.data_ptr()
    with torch.no_grad():
        decode(model, random_tokens(cfg, 2, 10), cache, [4] + [1] * 6)
    assert cache.keys.data_ptr() == ptr_k and cache.values.data_ptr() == ptr_v
    assert cache.length == 10
    assert cache.slot_pos.tolist() == list(range(10)) + [-1] * 6  # absolute positions; -1 = empty slot
    assert cache.keys[:, :, :, 10:].abs().sum() == 0  # nothing written past the used slots


def test_ring_cache_equals_sliding_window_full_forward():
    """Plain ring mode (RoPE, sink=False): each query sees its own and the previous window - 1 positions, keys cached already
    rotated at their absolute positions. Compared: every logit of a 2-layer model decoding 3.5 windows (in steps
    and in chunks that wrap) against one full forward with a sliding-window causal mask of the same width."""
    cfg = tiny(pos="rope", max_seq_len=16)
    model = MultiCodebookLM(cfg).eval()
    window = 8
    tokens = random_tokens(cfg, 2, 28)  # longer than max_seq_len too: the trained context is not a limit
    with torch.no_grad():
        full = model(tokens, window=window)
        steps = decode(model, tokens, model.new_cache(2, window, ring=True), [1] * 28)
        chunks = decode(model, tokens, model.new_cache(2, window, ring=True), [5, 1, 6, 1, 1, 11, 1, 2])
    torch.testing.assert_close(steps, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(chunks, full, atol=ATOL, rtol=0)
    # a window shorter than the sequence really changes the result (the ring is not a plain causal pass)
    assert not torch.allclose(model(tokens[..., :16]), full[..., :16, :], atol=1e-3)


def test_plain_ring_decode_past_the_window_matches_a_fresh_forward_over_the_last_window():
    """Plain ring (sink=False): RoPE makes scores depend on relative positions only (seed 002), so after the ring has slid far past the
    trained context (absolute positions up to 99 with max_seq_len 16), a 1-layer model's last-step logits equal a
    plain forward over just the last `window` tokens at positions 0..window-1. (With several layers the cached
    deeper keys also carry older context, which the sliding-window test above covers.)"""
    cfg = tiny(pos="rope", n_layers=1, max_seq_len=16)
    model = MultiCodebookLM(cfg).eval()
    window = 16
    tokens = random_tokens(cfg, 2, 100)
    cache = model.new_cache(2, window, ring=True)
    with torch.no_grad():
        for t in range(100):
            last = model(tokens[..., t:t + 1], cache=cache)
            if t in (window - 1, 57, 99):
                fresh = model(tokens[..., t + 1 - window:t + 1])[..., -1:, :]
                torch.testing.assert_close(last, fresh, atol=ATOL, rtol=0)
    assert cache.length == 100
    assert sorted(cache.slot_pos.tolist()) == list(range(100 - window, 100))


def with_bos(cfg: LMConfig, tokens: torch.Tensor) -> torch.Tensor:
    """tokens [B, N_c, S] with bos at position 0, as every sequence the model is trained on starts."""
    tokens = tokens.clone()
    tokens[..., 0] = cfg.bos_id
    return tokens


def fresh_window(tokens: torch.Tensor, p: int, window: int) -> torch.Tensor:
    """The training window ending at position p: [bos] + the last window - 1 tokens (all of them if shorter)."""
    return tokens[..., :p + 1] if p < window else torch.cat([tokens[..., :1], tokens[..., p + 2 - window:p + 1]], -1)


@pytest.mark.parametrize("n_kv_heads", [2, None])
def test_sink_decode_equals_a_fresh_training_window_at_every_step(n_kv_heads):
    """Sink ring (1 layer): every step, before and long after the window fills (positions up to 69, window 12),
    gives the logits of a plain full forward over [bos] + the last window - 1 tokens at positions 0..window-1,
    i.e. the input a fresh training window would get. Compared: all logits of each step, atol 1e-5."""
    cfg = tiny(pos="rope", n_layers=1, max_seq_len=16, n_kv_heads=n_kv_heads)
    model = MultiCodebookLM(cfg).eval()
    window, n = 12, 70
    tokens = with_bos(cfg, random_tokens(cfg, 2, n))
    cache = model.new_cache(2, window, ring=True, sink=True)
    with torch.no_grad():
        for p in range(n):
            step = model(tokens[..., p:p + 1], cache=cache)
            expected = model(fresh_window(tokens, p, window))[..., -1:, :]
            torch.testing.assert_close(step, expected, atol=ATOL, rtol=0, msg=lambda m: f"position {p}: {m}")
        # the sink really matters: the plain ring (bos out of view) gives other logits past the window
        plain = decode(model, tokens, model.new_cache(2, window, ring=True), [1] * n)
    assert not torch.allclose(plain[..., -1:, :], step, atol=1e-3)
    assert cache.slot_pos[0] == 0 and sorted(cache.slot_pos[1:].tolist()) == list(range(n - window + 1, n))


def sink_window_reference(model: MultiCodebookLM, tokens: torch.Tensor, window: int) -> torch.Tensor:
    """An independent, slow reimplementation of the sink ring's attention for any depth: at every layer the
    query at position p attends to the positions max(1, p-window+2)..p at their own RoPE positions and to
    position 0's key rotated to max(0, p-window+1). tokens [B, N_c, S] -> logits [B, N_c, S, |V|]."""
    cfg = model.config
    s = tokens.shape[-1]
    positions = torch.arange(s)
    cos, sin = model.rope.cos_sin(positions, torch.float32)
    sink_cos, sink_sin = model.rope.cos_sin((positions - window + 1).clamp(min=0), torch.float32)
    h = model.embed(tokens)
    for block in model.blocks:
        attn = block.attn
        q, k, v = attn.qkv(block.attn_norm(h)).split(
            [cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim], dim=-1)
        q, k, v = (rearrange(x, "b s (h d) -> b h s d", d=cfg.head_dim) for x in (q, k, v))
        k_sink_raw = k[:, :, :1]  # position 0's key, un-rotated
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        rep = cfg.n_heads // cfg.kv_heads
        k, v, k_sink_raw = (x.repeat_interleave(rep, dim=1) for x in (k, v, k_sink_raw))
        out = torch.empty_like(q)
        for p in range(s):
            lo = max(1, p - window + 2)
            sink_key = apply_rotary(k_sink_raw, sink_cos[p:p + 1], sink_sin[p:p + 1])  # [B, H, 1, Dh]
            keys = torch.cat([sink_key, k[:, :, lo:p + 1]], dim=2) if p > 0 else sink_key
            vals = torch.cat([v[:, :, :1], v[:, :, lo:p + 1]], dim=2) if p > 0 else v[:, :, :1]
            scores = (q[:, :, p:p + 1] @ keys.transpose(-1, -2)) / cfg.head_dim ** 0.5
            out[:, :, p:p + 1] = scores.softmax(-1) @ vals
        o = h + attn.out(rearrange(out, "b h s d -> b s (h d)"))
        h = o + block.ffn(block.ffn_norm(o))
    h = model.final_norm(h)
    return torch.einsum("bsd,cvd->bcsv", h, model.head_weights())


def test_sink_ring_equals_the_reference_with_several_layers_in_steps_and_chunks():
    """Sink ring, 3 layers with GQA: decoding 4 windows one position at a time, and in chunks that cross the
    window boundary (the model splits them), equals an independent reimplementation of the sink attention.
    Compared: all logits, atol 1e-5."""
    cfg = tiny(pos="rope", n_layers=3, max_seq_len=16)
    model = MultiCodebookLM(cfg).eval()
    window, n = 8, 32
    tokens = with_bos(cfg, random_tokens(cfg, 2, n))
    with torch.no_grad():
        expected = sink_window_reference(model, tokens, window)
        steps = decode(model, tokens, model.new_cache(2, window, ring=True, sink=True), [1] * n)
        chunks = decode(model, tokens, model.new_cache(2, window, ring=True, sink=True), [5, 1, 6, 1, 1, 11, 1, 6])
        # inside the window the reference is the plain causal forward
        torch.testing.assert_close(expected[..., :window, :], model(tokens[..., :window]), atol=ATOL, rtol=0)
    torch.testing.assert_close(steps, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(chunks, expected, atol=ATOL, rtol=0)


def test_sink_cache_rotates_one_key_per_layer_per_step_and_keeps_it_unrotated():
    """Past the window slot 0 holds position 0's keys rotated to p - window + 1 for the query at p (every layer),
    rotated afresh from the un-rotated copy each step (rotations do not pile up)."""
    cfg = tiny(pos="rope", n_layers=2, max_seq_len=16)
    model = MultiCodebookLM(cfg).eval()
    window = 6
    tokens = with_bos(cfg, random_tokens(cfg, 1, 20))
    cache = model.new_cache(1, window, ring=True, sink=True)
    with torch.no_grad():
        model(tokens[..., :window], cache=cache)
        raw = cache.keys[:, :, :, :1].clone()  # position 0 is rotated by angle 0: slot 0 holds it un-rotated
        for p in range(window, 20):
            model(tokens[..., p:p + 1], cache=cache)
            cos, sin = model.rope.cos_sin(torch.tensor([p - window + 1]), torch.float32)
            torch.testing.assert_close(cache.keys[:, :, :, :1], apply_rotary(raw, cos, sin), atol=1e-6, rtol=0)
    assert cache.length == 20 and cache.slot_pos[0] == 0
    assert sorted(cache.slot_pos[1:].tolist()) == list(range(20 - window + 1, 20))
    assert "sink=True" in repr(cache)


def test_sink_cache_refuses_what_it_cannot_do():
    cfg = tiny(pos="rope")
    model = MultiCodebookLM(cfg).eval()
    with pytest.raises(ValueError, match="needs ring=True"):
        model.new_cache(1, 8, sink=True)
    with pytest.raises(ValueError, match="max_len >= 2"):
        model.new_cache(1, 1, ring=True, sink=True)
    with pytest.raises(ValueError, match="RotaryEmbedding"):
        KVCache(1, 1, 1, 4, 8, ring=True, sink=True)
    with pytest.raises(ValueError, match="needs RoPE"):
        MultiCodebookLM(tiny(pos="learned")).new_cache(1, 8, ring=True, sink=True)
    # the cache itself refuses a multi-position step past the window (the model splits those)
    cache = model.new_cache(1, 4, ring=True, sink=True)
    with torch.no_grad():
        model(random_tokens(cfg, 1, 4), cache=cache)
    with pytest.raises(ValueError, match="one position per step past its window"):
        cache.begin(2)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned"])
def test_ring_mode_is_refused_for_additive_positions(pos):
    """Additive encodings bake each position into every cached key and value: sliding needs a recompute."""
    model = MultiCodebookLM(tiny(pos=pos))
    with pytest.raises(ValueError, match="needs RoPE"):
        model.new_cache(1, 16, ring=True)


def test_cache_limits_are_clear_errors():
    cfg = tiny(max_seq_len=32)
    model = MultiCodebookLM(cfg).eval()
    with pytest.raises(ValueError, match="max_len must be in 1..max_seq_len=32"):
        model.new_cache(1, 33)
    cache = model.new_cache(2, 8)
    with torch.no_grad():
        model(random_tokens(cfg, 2, 8), cache=cache)
        with pytest.raises(RuntimeError, match="KV cache is full"):
            model(random_tokens(cfg, 2, 1), cache=cache)
        with pytest.raises(ValueError, match="batch"):
            model(random_tokens(cfg, 3, 1), cache=model.new_cache(2, 8))
    with pytest.raises(ValueError, match="exceed the model's context"):
        model(random_tokens(cfg, 1, 33))


def test_reset_forgets_the_past():
    cfg = tiny()
    model = MultiCodebookLM(cfg).eval()
    a, b = random_tokens(cfg, 1, 6), random_tokens(cfg, 1, 6)
    cache = model.new_cache(1, 16)
    with torch.no_grad():
        decode(model, a, cache, [6])
        cache.reset()
        again = decode(model, b, cache, [3, 1, 1, 1])
        torch.testing.assert_close(again, model(b), atol=ATOL, rtol=0)


# ---- a conditioned LM: the cross-attention cache next to the self-attention one (issue 20) ---------

COND = {"speakers": ["a", "b"], "text_max_bytes": 16, "encoder_layers": 1}


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_cached_steps_with_cross_attention_equal_the_full_forward(pos):
    """The cross-attention keys/values, computed once (`cross_memory`), with the self-attention cache step by
    step give every logit of the full forward that projects them itself (atol 1e-5)."""
    cfg = tiny(pos=pos, condition=COND)
    model = MultiCodebookLM(cfg).eval()
    tokens = random_tokens(cfg, 2, 20)
    cond = model.condition_inputs(["ahoj", "loď"], ["a", "b"], 2)
    with torch.no_grad():
        full = model(tokens, memory=model.encode_condition(cond))
        memory = model.cross_memory(cond)
        assert memory.kv is not None and len(memory.kv) == cfg.n_layers
        steps = torch.cat([model(tokens[..., i:i + 1], cache=cache, memory=memory)
                           for cache in [model.new_cache(2, 20)] for i in range(20)], dim=2)
        chunks = decode_with(model, tokens, model.new_cache(2, 20), [6, 1, 1, 12], memory)
    torch.testing.assert_close(steps, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(chunks, full, atol=ATOL, rtol=0)
    assert not torch.allclose(full, model(tokens), atol=1e-3)  # the condition is read (null conditions differ)


def test_sink_ring_with_cross_attention_equals_a_fresh_training_window_with_the_same_condition():
    """Past the context the condition stays in view unchanged: the sink ring's step at position p equals a full
    forward over the fresh training window ending at p, under the same memory (1 layer, where the sink ring is
    exactly a fresh window, as in the unconditioned test above; atol 1e-5)."""
    cfg = tiny(pos="rope", n_layers=1, max_seq_len=16, condition=COND)
    model = MultiCodebookLM(cfg).eval()
    window, n = 12, 30
    tokens = with_bos(cfg, random_tokens(cfg, 1, n))
    cond = model.condition_inputs(["hele"], ["b"], 1)
    cache = model.new_cache(1, window, ring=True, sink=True)
    with torch.no_grad():
        memory = model.cross_memory(cond)
        for p in range(n):
            step = model(tokens[..., p:p + 1], cache=cache, memory=memory)
            fresh = tokens[..., :p + 1] if p < window else torch.cat([tokens[..., :1],
                                                                       tokens[..., p + 2 - window:p + 1]], -1)
            torch.testing.assert_close(step, model(fresh, memory=memory)[..., -1:, :], atol=ATOL, rtol=0)


def decode_with(model, tokens, cache, chunks, memory):
    out, start = [], 0
    for n in chunks:
        out.append(model(tokens[..., start:start + n], cache=cache, memory=memory))
        start += n
    return torch.cat(out, dim=2)
