"""Seed 001 ("Transformers and Pretraining"), claim by claim.

Each test quotes the passage of `shared/seeds/001_*.txt` it checks and recomputes it independently
(explicit per-head matrices, sorted-probability bookkeeping for the sampling filters, separate
forward passes per prefix for the chain rule), then compares with rvqlm's code: `lm.layers`,
`lm.model`, `lm.kv_cache` and `lm.sampling`. Definitions seed 000 states as well (LayerNorm, the
pre-norm block, next-token shift, padding) are tested in test_seed_000_transformers.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from lm import LMConfig, MultiCodebookLM
from seed_helpers import tiny, randomized, tiny_model, keep_first_output
from lm.layers import Attention, Block, LayerNorm, RMSNorm, SwiGLU
from lm.sampling import filter_logits, sample_next, top_k_filter, top_p_filter


def head_matrices(attn: Attention) -> tuple[list, list, list, torch.Tensor]:
    """The seed's per-head W^{Q_c}, W^{K_c}, W^{V_c} (each [d x d_k], row-vector convention) and W^O
    ([A d_v x d]), cut out of the fused `qkv` projection. K/V head c // (A / A_kv) serves query head c."""
    h, h_kv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w = attn.qkv.weight.T  # [d, (h + 2 h_kv) dh]
    wq, wk, wv = w.split([h * dh, h_kv * dh, h_kv * dh], dim=1)
    group = h // h_kv
    WQ = [wq[:, c * dh:(c + 1) * dh] for c in range(h)]
    WK = [wk[:, (c // group) * dh:(c // group + 1) * dh] for c in range(h)]
    WV = [wv[:, (c // group) * dh:(c // group + 1) * dh] for c in range(h)]
    return WQ, WK, WV, attn.out.weight.T


def entropy(probs: torch.Tensor) -> float:
    p = probs[probs > 0]
    return float(-(p * p.log()).sum())


def probs_of(filtered_logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(filtered_logits.double(), dim=-1)


# ---- attention -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_attention_is_masked_softmax_of_scaled_scores_times_values_then_W_O(n_kv_heads):
    """Seed 001: "Q = XW^Q, K = XW^K, V = XW^V; then head = softmax(mask(QK^T / sqrt(d_k)))V and
    A = head W^O"; "Each head c computes Q^c, K^c, V^c from X and its own masked softmax attention,
    giving [N x d_v]; the A outputs are concatenated into [N x A d_v] and projected by W^O to [N x d]"."""
    cfg = tiny(d_model=12, n_heads=3, n_kv_heads=n_kv_heads)
    attn = randomized(Attention(cfg, 0))
    N, d_k = 5, cfg.head_dim
    X = torch.randn(N, cfg.d_model, dtype=torch.float64)
    WQ, WK, WV, WO = head_matrices(attn)
    future = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)  # j > i
    heads = []
    for c in range(cfg.n_heads):
        Q, K, V = X @ WQ[c], X @ WK[c], X @ WV[c]
        scores = (Q @ K.T / math.sqrt(d_k)).masked_fill(future, float("-inf"))
        alpha = torch.softmax(scores, dim=-1)
        assert torch.equal(alpha[future], torch.zeros(int(future.sum()), dtype=torch.float64))  # exactly 0
        heads.append(alpha @ V)  # [N, d_v]
    A = torch.cat(heads, dim=-1) @ WO  # [N, A d_v] @ [A d_v, d]
    torch.testing.assert_close(attn(X[None])[0], A, rtol=0, atol=1e-12)


def test_masked_future_positions_get_exactly_zero_weight():
    """Seed 001: "The upper triangle (j > i) is set to -inf, which the softmax turns into 0" and
    "e^-inf = 0 removes a position entirely": whatever the later tokens are, the earlier outputs are
    bit-for-bit the same."""
    cfg = tiny(d_model=8, n_heads=2)
    attn = randomized(Attention(cfg, 0))
    X = torch.randn(1, 6, cfg.d_model, dtype=torch.float64)
    Y = X.clone()
    Y[0, 3:] = torch.randn(3, cfg.d_model, dtype=torch.float64) * 1e3
    assert torch.equal(attn(X)[0, :3], attn(Y)[0, :3])


def test_multi_head_shapes_and_head_width_d_v_is_d_over_A():
    """Seed 001: "The head dimensionality is set to d_v = d/A, so the heads together have the size of one
    full-width head"; "W^Q, W^K: [d x d_k]; W^V: [d x d_v]"; the concatenation is "[1 x A d_v]", "then
    projected by W^O of shape [A d_v x d]", "so input and output are both [1 x d]"."""
    cfg = tiny(d_model=16, n_heads=4)
    attn = Attention(cfg, 0)
    d, A = cfg.d_model, cfg.n_heads
    assert cfg.head_dim == d // A == 4
    WQ, WK, WV, WO = head_matrices(attn)
    assert len(WQ) == A and all(w.shape == (d, d // A) for w in WQ + WK + WV)
    assert WO.shape == (A * cfg.head_dim, d) == (d, d)
    assert attn(torch.randn(2, 5, d)).shape == (2, 5, d)
    with pytest.raises(ValueError, match="divisible"):
        tiny(d_model=10, n_heads=4)


# ---- feed-forward, norms, block --------------------------------------------------------------------
def test_swiglu_is_swish_gate_times_linear_value_then_W3():
    """Seed 001: "FFN = (Swish(xW_1 + b_1) (x) (xW_2 + b_2))W_3 + b_3" with
    "Swish_beta(x) = x sigma(beta x)" (beta = 1 in rvqlm)."""
    cfg = tiny(ffn="swiglu", d_ff=10, bias=True)
    ffn = randomized(SwiGLU(cfg))
    x = torch.randn(3, 4, cfg.d_model, dtype=torch.float64)

    def linear(layer, v):
        return v @ layer.weight.T + layer.bias

    def swish(v, beta=1.0):
        return v * torch.sigmoid(beta * v)

    expected = linear(ffn.w3, swish(linear(ffn.w1, x)) * linear(ffn.w2, x))
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=1e-12)
    assert ffn.w1.weight.shape == ffn.w2.weight.shape == (10, cfg.d_model)
    assert ffn.w3.weight.shape == (cfg.d_model, 10)


def test_feed_forward_width_is_4d_and_holds_most_of_the_block_parameters():
    """Seed 001: "Usually d_ff ~ 4d (e.g. 2048 for d = 512). The feedforward networks thus hold most of a
    transformer's parameters"."""
    for ffn in ("relu", "gelu"):
        assert LMConfig(d_model=512, n_heads=8, ffn=ffn).ffn_dim == 2048
    block = Block(tiny(d_model=32, n_heads=4, ffn="relu"), 0)
    ffn_params = sum(p.numel() for p in block.ffn.parameters())
    attn_params = sum(p.numel() for p in block.attn.parameters())
    assert ffn_params == 2 * 32 * 128 and attn_params == 4 * 32 * 32
    assert ffn_params > attn_params


def test_rmsnorm_skips_the_mean_centering_step():
    """Seed 001: RMSNorm is "a simpler norm ... it rescales the vector by its root-mean-square, skipping
    the mean-centering step": shifting every feature by a constant changes RMSNorm's output but not
    LayerNorm's."""
    d = 6
    x = torch.randn(4, d, dtype=torch.float64)
    rms, ln = RMSNorm(d).double(), LayerNorm(d).double()
    torch.testing.assert_close(ln(x + 2.5), ln(x), rtol=0, atol=1e-6)
    assert (rms(x + 2.5) - rms(x)).abs().max() > 0.1
    rms_of_x = x.pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(rms(x), x / rms_of_x, rtol=1e-4, atol=1e-5)  # up to eps


def test_prenorm_block_per_position_t1_to_t5():
    """Seed 001: "t1_i = LayerNorm(x_i); t2_i = MultiHeadAttention(t1_i, [t1_1, ..., t1_{i-1}]);
    t3_i = t2_i + x_i; t4_i = LayerNorm(t3_i); t5_i = FFN(t4_i); h_i = t5_i + t3_i", computed for each
    position i from x_1..x_i alone."""
    cfg = tiny(norm="layernorm", ffn="gelu", bias=True)
    block = randomized(Block(cfg, 0))
    X = torch.randn(1, 6, cfg.d_model, dtype=torch.float64)
    out = block(X)
    for i in range(6):
        prefix = X[:, :i + 1]
        t1 = block.attn_norm(prefix)
        t2 = block.attn(t1)[:, i]  # the query t1_i against t1_1..t1_i (causal)
        t3 = t2 + X[:, i]
        t4 = block.ffn_norm(t3)
        t5 = block.ffn(t4)
        torch.testing.assert_close(out[:, i], t5 + t3, rtol=0, atol=1e-12)


# ---- language-model head and weight tying ---------------------------------------------------------
def test_weight_tying_uses_E_transpose_as_the_unembedding():
    """Seed 001, weight tying: "the embedding matrix E maps one-hot tokens to embeddings at the input, and
    its transpose E^T maps the final embedding back to scores over the vocabulary. Training makes E good
    at both mappings"; the head is "logits u = h^L_N E^T of shape [1 x |V|]"."""
    model = tiny_model(tie_weights=True)
    V = model.config.codebook_size
    E = model.codebook_table(0)[:V]  # the |V| code rows (rvqlm's pad/bos rows are never predicted)
    assert model.head_weight is None
    assert model.head_weights()[0].data_ptr() == E.data_ptr()  # the same memory, not a copy
    ids = torch.tensor([[[V + 1, 1, 2, 1]]])
    rows = {}
    keep_first_output(model.final_norm, rows, "h")
    logits = model(ids)
    torch.testing.assert_close(logits[0, 0], rows["h"][0] @ E.T, rtol=0, atol=1e-12)
    # "good at both mappings": code 5 never appears in the input, yet its row of E gets a gradient
    model.requires_grad_(True)
    model.loss(torch.tensor([[[1, 2, 1]]])).loss.backward()
    assert model.token_embedding.weight.grad[5].abs().sum() > 0
    untied = tiny_model(tie_weights=False).requires_grad_(True)
    untied.loss(torch.tensor([[[1, 2, 1]]])).loss.backward()
    assert untied.token_embedding.weight.grad[5].abs().sum() == 0


# ---- decoding ------------------------------------------------------------------------------------
LOGITS = torch.tensor([1.2, -0.3, 2.5, 0.4, 2.0, -1.0, 0.9])


def test_greedy_decoding_takes_the_argmax_and_is_deterministic():
    """Seed 001, greedy decoding: "Always generating the most probable token: w_t = argmax_w P(w | w_<t)",
    "it is even deterministic (same context -> same output)"."""
    batch = torch.randn(5, 7)
    for _ in range(3):
        assert torch.equal(sample_next(batch, greedy=True), torch.softmax(batch, -1).argmax(-1))
    assert int(sample_next(LOGITS, greedy=True)) == 2


def test_temperature_divides_the_logits_before_the_softmax():
    """Seed 001: "Divide the logits by a temperature tau before the softmax: y = softmax(u / tau). With
    tau < 1, high-probability tokens become more likely and rare ones less likely; as tau -> 0 it
    approaches greedy decoding; tau > 1 flattens the distribution toward uniform"."""
    base = torch.softmax(LOGITS.double(), -1)
    previous_entropy = 0.0
    for tau in (0.25, 0.5, 1.0, 2.0, 4.0):
        y = probs_of(filter_logits(LOGITS, temperature=tau))
        torch.testing.assert_close(y, torch.softmax(LOGITS.double() / tau, -1), rtol=1e-6, atol=1e-7)
        assert entropy(y) > previous_entropy
        previous_entropy = entropy(y)
    sharp = probs_of(filter_logits(LOGITS, temperature=0.5))
    assert sharp[2] > base[2] and sharp[5] < base[5]  # likely tokens gain, rare ones lose
    flat = probs_of(filter_logits(LOGITS, temperature=1e4))
    assert (flat - 1 / 7).abs().max() < 1e-3
    gen = torch.Generator().manual_seed(0)
    near_zero = sample_next(LOGITS.expand(200, 7), temperature=1e-4, generator=gen)
    assert (near_zero == 2).all()


def test_top_k_keeps_the_k_most_probable_tokens_and_renormalizes():
    """Seed 001, top-k: "Keep only the k most probable tokens, renormalize their probabilities, and
    sample from them. k = 1 is greedy decoding"."""
    p = torch.softmax(LOGITS.double(), -1)
    order = sorted(range(7), key=lambda i: -float(p[i]))
    for k in range(1, 8):
        kept = order[:k]
        expected = torch.zeros(7, dtype=torch.float64)
        expected[kept] = p[kept] / p[kept].sum()
        torch.testing.assert_close(probs_of(top_k_filter(LOGITS, k)), expected, rtol=1e-6, atol=1e-7)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randn(50, 7)
    assert torch.equal(sample_next(batch, top_k=1, generator=gen), sample_next(batch, greedy=True))


def test_top_p_keeps_the_smallest_top_set_with_mass_at_least_p():
    """Seed 001, top-p: "Top-p keeps the smallest set of top words whose probabilities sum to at least p,
    so the pool grows and shrinks with the model's confidence"."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(9, generator=gen) * 1.5
        probs = torch.softmax(logits.double(), -1)
        ranked = sorted(range(9), key=lambda i: -float(probs[i]))
        for p in (0.1, 0.35, 0.5, 0.8, 0.95):
            size = next(n for n in range(1, 10) if float(probs[ranked[:n]].sum()) >= p)  # smallest such set
            kept = torch.isfinite(top_p_filter(logits, p)).nonzero().flatten().tolist()
            assert sorted(kept) == sorted(ranked[:size])
    confident = torch.tensor([5.0, 1.0, 0.5, 0.0, -0.5])
    unsure = torch.tensor([0.2, 0.1, 0.0, -0.1, -0.2])
    pool = lambda u: int(torch.isfinite(top_p_filter(u, 0.8)).sum())  # noqa: E731
    assert pool(confident) == 1 and pool(unsure) == 4


def test_top_k_first_then_top_p_on_the_renormalized_survivors():
    """Seed 001: "Top-k first as a hard filter to eliminate garbage, then top-p to adapt to the model's
    confidence" (top-p then measures mass in the renormalized top-k distribution), and sampling draws
    from the result."""
    probs = torch.tensor([0.3, 0.3, 0.2, 0.2], dtype=torch.float64)
    logits = probs.log().float()
    # top-2 renormalizes to (0.5, 0.5); top-p 0.45 on that keeps token 0 only
    kept = torch.isfinite(filter_logits(logits, top_k=2, top_p=0.45)).nonzero().flatten().tolist()
    assert kept == [0]
    # the other order would keep tokens 0 and 1 (0.3 < 0.45 before token 1): the order matters
    assert torch.isfinite(top_k_filter(top_p_filter(logits, 0.45), 2)).sum() == 2

    # sampling with both filters draws from exactly the filtered, renormalized distribution
    p = torch.softmax(LOGITS.double(), -1)
    ranked = sorted(range(7), key=lambda i: -float(p[i]))[:4]  # top-4
    renorm = p[ranked] / p[ranked].sum()
    size = next(n for n in range(1, 5) if float(renorm[:n].sum()) >= 0.7)
    expected = torch.zeros(7, dtype=torch.float64)
    expected[ranked[:size]] = renorm[:size] / renorm[:size].sum()
    torch.testing.assert_close(probs_of(filter_logits(LOGITS, top_k=4, top_p=0.7)), expected,
                               rtol=1e-6, atol=1e-7)
    gen = torch.Generator().manual_seed(0)
    draws = sample_next(LOGITS.expand(20000, 7), top_k=4, top_p=0.7, generator=gen)
    freq = torch.bincount(draws, minlength=7).double() / 20000
    assert (freq[expected == 0] == 0).all()
    assert (freq - expected).abs().max() < 0.015


# ---- training objective -----------------------------------------------------------------------------
def test_cross_entropy_against_the_one_hot_next_token_is_minus_log_its_probability():
    """Seed 001: "Cross-entropy between the predicted distribution and the one-hot true next token,
    -sum_w y_t[w] log y_hat_t[w], which reduces to -log y_hat_t[w_{t+1}]"."""
    model = tiny_model()
    V = model.config.codebook_size
    y_hat = torch.softmax(model(torch.tensor([[[model.config.bos_id]]]))[0, 0, 0], -1)  # after x_0 alone
    for w in range(V):
        y = F.one_hot(torch.tensor(w), V).double()
        full_sum = -(y * y_hat.log()).sum()
        nll = model.log_likelihood(torch.tensor([[[w]]]))[0]
        assert abs(float(nll) - float(full_sum)) < 1e-5
        assert abs(float(nll) + math.log(float(y_hat[w]))) < 1e-5


def test_perplexity_is_inverse_probability_normalized_by_length_and_exp_of_mean_cross_entropy():
    """Seed 001: "Perplexity(w_{1:T}) = P(w_{1:T})^(-1/T), the inverse probability normalized by length.
    It is the exponent of the mean cross-entropy loss (in nats, since log is natural log)"."""
    model = tiny_model()
    x = [3, 3, 0, 6, 1]
    T, bos = len(x), model.config.bos_id
    prob = 1.0
    for t in range(T):  # chain rule, one separate forward per prefix
        prob *= float(torch.softmax(model(torch.tensor([[[bos] + x[:t]]]))[0, 0, -1], -1)[x[t]])
    result = model.loss(torch.tensor([[x]]))
    assert abs(float(result.perplexity()) - prob ** (-1 / T)) < 1e-4 * prob ** (-1 / T)
    assert abs(float(result.perplexity()) - math.exp(float(result.loss))) < 1e-9


def test_learned_positions_are_trained_rows_up_to_a_maximum_length():
    """Seed 001: "Randomly initialized embeddings for each position up to a maximum length, learned along
    with the other parameters (a matrix E_pos), added to the token embedding"."""
    model = MultiCodebookLM(tiny(pos="learned", max_seq_len=6))
    table = model.pos_embedding.table.weight
    assert table.shape == (6, model.config.d_model) and table.requires_grad
    model.loss(torch.tensor([[[1, 2, 3]]])).loss.backward()
    assert table.grad[:3].abs().sum(-1).gt(0).all() and table.grad[3:].abs().sum() == 0
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 1, 7, dtype=torch.long))


# ---- inference optimizations -----------------------------------------------------------------------
@pytest.mark.parametrize("pos,n_kv_heads", [("rope", None), ("sinusoidal", None), ("learned", None), ("rope", 1)])
def test_kv_cache_gives_the_same_logits_as_recomputing_everything(pos, n_kv_heads):
    """Seed 001, KV cache: "the key and value vectors of all previous tokens are stored in memory and
    reused, so only the new token's query, key and value must be computed": a 3-token prefill and then
    one token per call give the full forward's logits."""
    model = tiny_model(pos=pos, n_heads=2, n_kv_heads=n_kv_heads)
    ids = torch.tensor([[[8, 2, 5, 5, 0, 6, 1, 3]]])
    full = model(ids)
    cache = model.new_cache(batch_size=1)
    steps = [model(ids[..., :3], cache=cache)]
    for t in range(3, ids.shape[-1]):
        steps.append(model(ids[..., t:t + 1], cache=cache))  # only the new token goes in
    assert cache.length == ids.shape[-1]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=0, atol=1e-10)


def test_grouped_query_attention_is_multi_head_attention_when_groups_equal_heads():
    """Seed 001 names Grouped-Query Attention among the inference optimizations: with as many K/V heads
    as query heads (groups of one) it is exactly multi-head attention, and with fewer it is multi-head
    attention whose K/V heads are shared inside each group."""
    mha = tiny_model(d_model=16, n_heads=4)
    gqa_full = MultiCodebookLM(tiny(d_model=16, n_heads=4, n_kv_heads=4)).double().eval()
    gqa_full.load_state_dict(mha.state_dict())  # same parameters, same shapes
    ids = torch.tensor([[[8, 1, 4, 2, 0]]])
    assert torch.equal(gqa_full(ids), mha(ids))

    gqa = tiny_model(d_model=16, n_heads=4, n_kv_heads=2)
    expanded = MultiCodebookLM(tiny(d_model=16, n_heads=4)).double().eval()
    state = gqa.state_dict()
    dh = 4
    for i in range(gqa.config.n_layers):
        w = state[f"blocks.{i}.attn.qkv.weight"]  # rows: 4 query heads, 2 key heads, 2 value heads
        q, k, v = w.split([4 * dh, 2 * dh, 2 * dh])
        repeat = lambda m: rearrange(m, "(h d) i -> h d i", d=dh).repeat_interleave(2, 0).flatten(0, 1)  # noqa: E731
        state[f"blocks.{i}.attn.qkv.weight"] = torch.cat([q, repeat(k), repeat(v)])
    expanded.load_state_dict(state)
    torch.testing.assert_close(expanded(ids), gqa(ids), rtol=0, atol=1e-12)
