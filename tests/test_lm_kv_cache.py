"""KV cache (lm/kv_cache.py): cached decoding equals full forwards, linear and ring (sliding-window) modes.

Tolerance: fp32 logits agree to 1e-5 absolute (the cached and full passes sum the same terms in a
different order; observed differences are ~1e-7).
"""

from __future__ import annotations

import pytest
import torch

from lm import KVCache, LMConfig, MultiCodebookLM

ATOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matrices: one thread is as fast as several and immune to a busy machine's thread contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    """Ring mode (RoPE): each query sees its own and the previous window - 1 positions, keys cached already
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


def test_ring_decode_past_the_window_matches_a_fresh_forward_over_the_last_window():
    """RoPE makes scores depend on relative positions only (seed 002), so after the ring has slid far past the
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
