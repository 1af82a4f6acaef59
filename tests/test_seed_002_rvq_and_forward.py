"""Seed 002 (the (|V|, N_c)-tokenizer, RVQ, and "the architectural mathematics of the forward pass").

Each test quotes the passage of `shared/seeds/002_*.txt` it checks. The RVQ codes are recomputed with
plain Python loops over `rvq.codebooks`; the forward-pass pieces are recomputed in the seed's own
column-vector convention (x_i = W_E e_i, q = W_q x, scores K^T q / sqrt(d_qk)), which is the transpose
of the row-vector code. The closing problem of the seed (RoPE and cross-entropy) is checked against
docs/theory.md in test_seed_002_theory.py.

Deliberate departures (docs/theory.md, section 3): codes are counted from 0, not 1; each embedding
table has two extra rows (pad, bos) that the heads never predict.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from codec.core.quantizer import ResidualVectorQuantizer
from lm import MultiCodebookLM
from lm.generate import generate
from lm.layers import Attention, FeedForward, LayerNorm, RMSNorm, SinusoidalPositions, SwiGLU, make_norm
from lm.rope import RotaryEmbedding, apply_rotary
from lm.sampling import SamplingOptions
from seed_helpers import randomized, tiny


def seed_rvq(e: list[float], codebooks: list[list[list[float]]]) -> list[int]:
    """Seed 002's RVQ(e) with plain loops: level 1 takes argmin_i |e - e_i^(1)|, level c the argmin over
    V_c of the distance to what the earlier levels left (e minus their chosen vectors). First index wins
    ties. Returns the N_c indices (counted from 0)."""
    residual = list(e)
    codes = []
    for book in codebooks:
        best, best_dist = None, math.inf
        for i, vector in enumerate(book):
            dist = math.sqrt(sum((r - v) ** 2 for r, v in zip(residual, vector)))
            if dist < best_dist:
                best, best_dist = i, dist
        codes.append(best)
        residual = [r - v for r, v in zip(residual, book[best])]
    return codes


def trained_rvq(dim: int, n_codebooks: int, codebook_size: int, data: torch.Tensor) -> ResidualVectorQuantizer:
    """An RVQ whose codebooks were fitted (k-means init + one EMA step) to data [B, D, T], then in eval."""
    rvq = ResidualVectorQuantizer(dim, n_codebooks, codebook_size, kmeans_iters=5, quantizer_dropout=0.0)
    rvq.train()
    rvq(data)
    return rvq.eval()


# ---- the (|V|, N_c)-tokenizer and RVQ -----------------------------------------------------------
def test_rvq_tokenizer_maps_each_frame_to_an_N_c_tuple_of_ids_in_the_vocabulary():
    """Seed 002: a (|V|, N_c)-tokenizer is "i : T -> {1, ..., |V|}^{N_c}" and each of the "N_c token IDs
    ... ranges from 1 to the vocabulary size |V|" (rvqlm counts from 0: ids in 0..|V|-1); RVQ uses
    "N_c ordered codebooks V_1, ..., V_{N_c} each containing the same number |V| of vectors"."""
    V, N_c, D = 16, 3, 4
    z = torch.randn(5, D, 40)
    rvq = trained_rvq(D, N_c, V, z)
    assert rvq.codebooks.shape == (N_c, V, D)  # N_c codebooks of |V| vectors each
    codes = rvq.encode(z)
    assert codes.shape == (5, N_c, 40) and codes.dtype == torch.long  # one N_c-tuple per frame
    assert int(codes.min()) >= 0 and int(codes.max()) <= V - 1
    assert len(torch.unique(codes[:, 0])) > V // 2  # the range is used, not a constant
    assert rvq.encode(z, n_q=2).shape == (5, 2, 40)


@pytest.mark.parametrize("fitted", [False, True])
def test_rvq_encode_is_the_seeds_nested_argmin(fitted):
    """Seed 002: "RVQ(e) := (argmin_{1<=i<=|V|} |e - e_i^(1)|, argmin_{1<=i<=|V|} |e - argmin_{e^(1) in
    V_1} |e - e^(1)| - e_i^(2)|, ...)", computed independently with plain loops over `rvq.codebooks`
    (random codebooks, and codebooks fitted to the latents)."""
    V, N_c, D = 16, 3, 4
    z = torch.randn(2, D, 12) * 2
    rvq = trained_rvq(D, N_c, V, z) if fitted else ResidualVectorQuantizer(D, N_c, V).eval()
    codes = rvq.encode(z)
    books = rvq.codebooks.double().tolist()
    for b in range(2):
        for t in range(12):
            assert codes[b, :, t].tolist() == seed_rvq(z[b, :, t].double().tolist(), books), (b, t)


def test_rvq_encode_is_the_nested_argmin_for_latents_far_from_the_origin():
    """Seed 002's RVQ formula again ("argmin_i |e - e_i^(1)|", nested), for latents that sit far from the
    origin compared with their spread (a common offset of about 100 per dimension, spread 1), codebooks
    fitted to them. Only frames whose nearest vector is unambiguous (the best distance beats the second
    best by more than 1e-3) are compared, so a disagreement is a wrong code, not a tie.

    The expected codes come from the distances |e - e_i| themselves, in float64."""
    gen = torch.Generator().manual_seed(0)
    D, V, N_c = 8, 64, 2
    offset = torch.randn(D, 1, generator=gen) * 100
    z = offset + torch.randn(4, D, 256, generator=gen)
    rvq = trained_rvq(D, N_c, V, z)
    codes = rvq.encode(z)  # [4, N_c, 256]
    residual = z.double().permute(0, 2, 1).reshape(-1, D)  # frames [N, D]
    wrong = []
    agreed = torch.ones(residual.shape[0], dtype=torch.bool)  # frames whose earlier levels matched
    for c in range(N_c):  # plain loop over the levels, exact distances in float64
        book = rvq.codebooks[c].double()
        dist = (residual[:, None, :] - book[None]).pow(2).sum(-1).sqrt()  # [N, |V|]
        two = dist.topk(2, dim=-1, largest=False)
        expected = two.indices[:, 0]
        clear = (two.values[:, 1] - two.values[:, 0]) > 1e-3
        got = codes[:, c].reshape(-1)  # frames in (b, t) order, as residual
        bad = agreed & clear & (got != expected)
        wrong += [(c, int(n), round(float(dist[n, got[n]] - dist[n, expected[n]]), 6))
                  for n in torch.nonzero(bad).flatten()]
        agreed &= got == expected
        residual = residual - book[expected]
    assert not wrong, (f"{len(wrong)} codes are not the nearest codebook vector "
                       f"(level, frame, extra distance): {wrong[:5]}")


# ---- forward pass, step by step, in the seed's column-vector notation ------------------------------
def test_latent_embedding_is_W_E_times_the_l1_unit_one_hot_column():
    """Seed 002: "multiply it by the transformer's (learnable) embedding matrix W_E in R^{d x |V|},
    thereby obtaining some latent vector e_i -> x_i := W_E e_i in R^d (thus, the column vectors of W_E
    are the latent embeddings of the one-hots)", the one-hots being "unit vectors not just with respect
    to the l2 metric, but also the l1 metric"."""
    model = randomized(MultiCodebookLM(tiny()))
    W_E = model.codebook_table(0).T  # [d, |V| + 2] in the seed's orientation
    rows = W_E.shape[1]
    for i in range(rows):
        e_i = F.one_hot(torch.tensor(i), rows).double()
        assert float(e_i.abs().sum()) == 1.0 and float(e_i.norm()) == 1.0
        x_i = model.embed(torch.tensor([[[i]]]))[0, 0]
        assert torch.equal(x_i, W_E @ e_i) and torch.equal(x_i, W_E[:, i])


def test_layernorm_has_2d_parameters_epsilon_1e_5_and_the_seeds_formula():
    """Seed 002, LayerNorm: with mu_i the mean, sigma_i^2 the mean squared deviation "and epsilon ~ 10^-5",
    "x_i -> w (.) (x_i - mu_i 1) / sqrt(sigma_i^2 + epsilon) + b", "a (learnable) affine transformation of
    2d parameters w, b in R^d"."""
    cfg = tiny(norm="layernorm")
    assert cfg.norm_eps == 1e-5
    ln = randomized(make_norm(cfg))
    assert isinstance(ln, LayerNorm) and sum(p.numel() for p in ln.parameters()) == 2 * cfg.d_model
    x = torch.randn(5, cfg.d_model, dtype=torch.float64) * 4 - 1
    for row in range(5):
        xi = x[row].tolist()
        mu = sum(xi) / len(xi)
        var = sum((v - mu) ** 2 for v in xi) / len(xi)
        expected = ln.weight * (x[row] - mu) / math.sqrt(var + 1e-5) + ln.bias
        torch.testing.assert_close(ln(x[row]), expected, rtol=0, atol=1e-12)


def test_rmsnorm_is_layernorm_with_zero_mean_and_no_shift():
    """Seed 002: RMSNorm is "LayerNorm but with mu_i = 0 (hence sigma_i^2 = ((x^(1))^2 + ... + (x^(d))^2)
    / d) and b = 0, so only d learnable parameters w in R^d"."""
    cfg = tiny(norm="rmsnorm")
    rms = randomized(make_norm(cfg))
    assert isinstance(rms, RMSNorm) and sum(p.numel() for p in rms.parameters()) == cfg.d_model
    x = torch.randn(5, cfg.d_model, dtype=torch.float64) * 3 + 2
    for row in range(5):
        xi = x[row].tolist()
        sigma2 = sum(v * v for v in xi) / len(xi)
        expected = rms.weight * x[row] / math.sqrt(sigma2 + cfg.norm_eps)
        torch.testing.assert_close(rms(x[row]), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_heads", [1, 2, 4])
def test_attention_update_is_the_sum_over_heads_of_W_o_V_softmax_of_K_T_q(n_heads):
    """Seed 002: "q_i := W_q x_i in R^{d_qk}, k_i := W_k x_i, v_i := W_v x_i in R^{d_ov}" per head,
    "Delta x_i = sum_{eta=1}^{h} W_o^(eta) V^(eta) p_{T=1}(K^(eta)T q_i^(eta) / sqrt(d_qk) + M_i)" with
    the causal mask M, and "h := d / d_ov"."""
    cfg = tiny(d_model=8, n_heads=n_heads)
    attn = randomized(Attention(cfg, 0))
    d, d_qk = cfg.d_model, cfg.head_dim
    assert n_heads * d_qk == d  # h = d / d_ov
    n = 5
    X = torch.randn(d, n, dtype=torch.float64)  # columns x_1..x_n
    W = attn.qkv.weight  # [(3 h) d_qk, d]: maps a column x to (q; k; v)
    W_out = attn.out.weight  # [d, h d_ov]
    delta = torch.zeros(d, n, dtype=torch.float64)
    for eta in range(n_heads):
        W_q = W[eta * d_qk:(eta + 1) * d_qk]
        W_k = W[(n_heads + eta) * d_qk:(n_heads + eta + 1) * d_qk]
        W_v = W[(2 * n_heads + eta) * d_qk:(2 * n_heads + eta + 1) * d_qk]
        W_o = W_out[:, eta * d_qk:(eta + 1) * d_qk]  # R^{d_ov} -> R^d
        Q, K, V = W_q @ X, W_k @ X, W_v @ X  # [d_qk, n] columns q_i, k_i, v_i
        for i in range(n):
            M_i = torch.tensor([0.0 if j <= i else -math.inf for j in range(n)], dtype=torch.float64)
            p = torch.softmax(K.T @ Q[:, i] / math.sqrt(d_qk) + M_i, dim=0)  # T = 1
            delta[:, i] += W_o @ V @ p
    torch.testing.assert_close(attn(X.T[None])[0].T, delta, rtol=0, atol=1e-12)


@pytest.mark.parametrize("ffn", ["relu", "gelu", "swiglu"])
def test_mlp_goes_up_to_d_ff_and_back_down_to_d(ffn):
    """Seed 002, multilayer perceptron: "a linear layer from R^d -> R^{d_ff} (typically d_ff = 4d),
    followed by a nonlinear activation (originally ReLU, GPT-2 used GeLU, and these days also gated units
    like SwiGLU ...), followed by another linear layer back down from R^{d_ff} -> R^d"."""
    cfg = tiny(ffn=ffn, d_ff=None if ffn != "swiglu" else 32)
    module = randomized(SwiGLU(cfg) if ffn == "swiglu" else FeedForward(cfg))
    d, d_ff = cfg.d_model, cfg.ffn_dim
    if ffn != "swiglu":
        assert d_ff == 4 * d
    up = [module.w1, module.w2] if ffn == "swiglu" else [module.w1]
    down = module.w3 if ffn == "swiglu" else module.w2
    assert all(layer.in_features == d and layer.out_features == d_ff for layer in up)
    assert down.in_features == d_ff and down.out_features == d
    hidden = {}

    def keep_hidden(module, args):  # returns None: the input is recorded, not replaced
        hidden["u"] = args[0]

    down.register_forward_pre_hook(keep_hidden)
    x = torch.randn(3, d, dtype=torch.float64)
    y = module(x)
    assert hidden["u"].shape == (3, d_ff) and y.shape == (3, d)
    if ffn == "relu":
        assert torch.equal(hidden["u"], F.relu(module.w1(x)))
    elif ffn == "gelu":
        torch.testing.assert_close(hidden["u"], F.gelu(module.w1(x)), rtol=0, atol=1e-12)


def test_layers_alternate_attention_and_mlp_with_separate_parameters():
    """Seed 002: "(Layers) Alternate between the multi-headed self-attention blocks and MLP feedforwards
    for L layers" (each layer its own weights)."""
    model = MultiCodebookLM(tiny(n_layers=3))
    assert len(model.blocks) == 3
    pointers = [{p.data_ptr() for p in block.parameters()} for block in model.blocks]
    assert all(not (pointers[a] & pointers[b]) for a in range(3) for b in range(a + 1, 3))
    calls = []
    for i, block in enumerate(model.blocks):
        for kind in ("attn", "ffn"):
            getattr(block, kind).register_forward_hook(lambda m, args, out, tag=f"{kind}{i}": calls.append(tag))
    model(torch.tensor([[[8, 1, 2]]]))
    assert calls == ["attn0", "ffn0", "attn1", "ffn1", "attn2", "ffn2"]  # in the order they run


def test_positional_encodings_give_every_position_a_different_encoding():
    """Seed 002, positional encoding: "Perturb each latent in some way that uniquely encodes the position
    of its corresponding token" (additive sinusoidal on the latents, or RoPE on keys and queries)."""
    table = SinusoidalPositions(8, 512).table.double()
    gaps = torch.cdist(table, table) + torch.eye(512, dtype=torch.float64) * 1e9
    assert float(gaps.min()) > 1e-3
    rope = RotaryEmbedding(8)
    positions = torch.arange(512)
    cos, sin = rope.cos_sin(positions, torch.float64)
    k = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 512, 8)
    rotated = apply_rotary(k, cos, sin)[0, 0]  # the same key at each of 512 positions
    gaps = torch.cdist(rotated, rotated) + torch.eye(512, dtype=torch.float64) * 1e9
    assert float(gaps.min()) > 1e-4


@pytest.mark.parametrize("greedy", [True, False])
def test_generation_samples_at_the_last_position_appends_and_repeats(greedy):
    """Seed 002, sampling: "take a T-softmax over these logits ... to get a prediction of the actual next
    token, just sample from that i = n position, append it to the input sequence to obtain a new sequence
    now of length n + 1, and repeat the whole thing" (rvqlm's cached generator against that plain loop)."""
    from lm.sampling import sample_next

    model = randomized(MultiCodebookLM(tiny()))
    prompt = torch.tensor([[[3, 1]]])
    out = generate(model, prompt, 6, sampling=SamplingOptions(temperature=0.8, top_k=5, greedy=greedy),
                   generator=torch.Generator().manual_seed(7))
    assert out.shape == (1, 1, 8) and torch.equal(out[..., :2], prompt)
    gen = torch.Generator().manual_seed(7)
    seq = [model.config.bos_id, 3, 1]
    while len(seq) < 9:
        logits = model(torch.tensor([[seq]]))[:, :, -1]  # the last position n only
        seq.append(int(sample_next(logits, 0.8, 5, None, greedy, gen)))
    assert out[0, 0].tolist() == seq[1:]
