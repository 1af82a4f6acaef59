"""Seed 000 ("Transformers and Self-Supervised Language Models"), definition by definition.

Each test names the passage of `shared/seeds/000_*.txt` it checks and recomputes the definition
independently (plain formulas, loops, one-hot products), then compares with rvqlm's code.
Masked language modeling (the seed's last definition) is tested with the masked LM in tests/test_masked_lm.py.

Models are tiny and run in float64 with weights drawn large enough (std 0.3) that a wrong order of
operations or a leaking mask shows up far above rounding.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from seed_helpers import tiny, randomized, tiny_model, keep_first_input, keep_first_output
from lm.layers import Attention, Block, FeedForward, LayerNorm, SinusoidalPositions


def full_mask(n: int) -> torch.Tensor:
    """[n, n] all True: every position may attend to every position (self-attention without a mask)."""
    return torch.ones(n, n, dtype=torch.bool)


# ---- tokens, embeddings, positions ---------------------------------------------------------------
def test_embedding_lookup_is_one_hot_row_times_W_E():
    """Seed 000, tokenizer definition: "the embedding of a token is the row of W_E at its index. Looking
    up a token is the same as multiplying its one-hot row vector by W_E, and the lookups for an input
    of n tokens form an n x d matrix E"."""
    model = tiny_model()
    cfg = model.config
    w_e = model.codebook_table(0)  # [|V| + 2, d]: |V| codes plus rvqlm's pad and bos rows
    assert w_e.shape == (cfg.codebook_size + 2, cfg.d_model)
    ids = torch.tensor([3, 0, 8, 6, 3])  # includes bos (|V| + 1 = 8)
    one_hot = torch.zeros(len(ids), w_e.shape[0], dtype=torch.float64)
    for row, i in enumerate(ids.tolist()):
        one_hot[row, i] = 1.0
    E = model.embed(ids.view(1, 1, -1))[0]  # [n, d]
    assert E.shape == (len(ids), cfg.d_model)
    torch.testing.assert_close(E, one_hot @ w_e, rtol=0, atol=1e-12)
    for row, i in enumerate(ids.tolist()):  # and literally the row at the index
        assert torch.equal(E[row], w_e[i])


def test_sinusoidal_table_is_the_seed_formula():
    """Seed 000, positional encoding: "fixed, as in the sinusoidal encoding. For even d, with positions i
    and coordinates counted from 0 and m = 0, ..., d/2 - 1" (the formula itself, lost from the seed's
    text, is the original transformer's: P[i, 2m] = sin(i / 10000^(2m/d)), P[i, 2m+1] = cos(same))."""
    d, n = 6, 40
    table = SinusoidalPositions(d, n).table
    assert table.shape == (n, d)
    for i in range(n):
        for m in range(d // 2):
            angle = i / 10000 ** (2 * m / d)
            assert abs(float(table[i, 2 * m]) - math.sin(angle)) < 1e-6
            assert abs(float(table[i, 2 * m + 1]) - math.cos(angle)) < 1e-6
    with pytest.raises(ValueError, match="even"):
        SinusoidalPositions(5, n)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned"])
def test_additive_encoding_is_H_equals_E_plus_P(pos):
    """Seed 000: "An additive encoding sets H = E + P, where row i of the n x d matrix P depends only
    on position i. The rows of P can be learned, one per position up to a maximum length, or fixed"."""
    model = tiny_model(pos=pos)
    ids = torch.tensor([[[1, 4, 4, 0, 6]]])
    seen = {}
    keep_first_input(model.blocks[0], seen, "H")
    model(ids)
    E = model.embed(ids)[0]
    table = model.pos_embedding.table
    P = table if pos == "sinusoidal" else table.weight
    assert P.shape[0] == model.config.max_seq_len  # one row per position up to the maximum length
    torch.testing.assert_close(seen["H"][0], E + P[:5].to(E.dtype), rtol=0, atol=1e-12)
    # row i depends only on i: the same token at positions 1 and 2 gets E[1] = E[2] but different H rows
    assert torch.equal(E[1], E[2]) and not torch.allclose(seen["H"][0, 1], seen["H"][0, 2])


# ---- permutation equivariance ------------------------------------------------------------------
def test_unmasked_self_attention_is_permutation_equivariant():
    """Seed 000: "self-attention without a mask is permutation equivariant. Write f(X) =
    Attention(XW_Q, XW_K, XW_V) for self-attention without a mask. For every n x n permutation
    matrix Pi", f(Pi X) = Pi f(X)."""
    cfg = tiny()
    attn = randomized(Attention(cfg, 0))
    n = 6
    X = torch.randn(1, n, cfg.d_model, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        perm = torch.randperm(n, generator=gen)
        Pi = torch.eye(n, dtype=torch.float64)[perm]  # the permutation matrix: (Pi X)[r] = X[perm[r]]
        out_of_permuted = attn(Pi @ X, mask=full_mask(n))
        torch.testing.assert_close(out_of_permuted, Pi @ attn(X, mask=full_mask(n)), rtol=0, atol=1e-12)


def test_the_causal_mask_breaks_permutation_equivariance():
    """Seed 000: equivariance holds for "self-attention without a mask"; the decoder's "causal mask"
    makes position i see only positions <= i, so reordering the rows no longer only reorders the output."""
    cfg = tiny()
    attn = randomized(Attention(cfg, 0))
    n = 6
    X = torch.randn(1, n, cfg.d_model, dtype=torch.float64)
    perm = torch.tensor([5, 4, 3, 2, 1, 0])
    gap = (attn(X[:, perm]) - attn(X)[:, perm]).abs().max()  # mask=None: the causal mask
    assert gap > 1e-2


def test_row_wise_layers_keep_an_unmasked_block_equivariant():
    """Seed 000: "layers that act on each row separately behave the same way, so without position
    information a reordering of the input rows only reorders the output rows" (a whole block, norms and
    feed-forward included, run without a mask and without positions)."""
    for ffn, norm in (("relu", "layernorm"), ("swiglu", "rmsnorm")):
        cfg = tiny(ffn=ffn, norm=norm, bias=True)
        block = randomized(Block(cfg, 0))
        n = 5
        X = torch.randn(2, n, cfg.d_model, dtype=torch.float64)
        perm = torch.tensor([2, 0, 4, 1, 3])
        torch.testing.assert_close(block(X[:, perm], mask=full_mask(n)), block(X, mask=full_mask(n))[:, perm],
                                   rtol=0, atol=1e-12)


# ---- layer normalization -----------------------------------------------------------------------
def test_layernorm_uses_the_statistics_of_each_feature_vector_only():
    """Seed 000, layer normalization: "It computes the mean and variance over the d features of that one
    vector ... For an array of shape batch by positions by features it normalizes along the feature axis
    only. Unlike batch normalization it uses no statistics from other examples or other positions, so it
    computes the same thing in training and in use.\""""
    d, eps = 5, 1e-5
    ln = LayerNorm(d, eps).double()
    with torch.no_grad():
        ln.weight.copy_(torch.randn(d, dtype=torch.float64))
        ln.bias.copy_(torch.randn(d, dtype=torch.float64))
    x = torch.randn(3, 4, d, dtype=torch.float64) * 3 + 2
    expected = torch.empty_like(x)
    for b, s in itertools.product(range(3), range(4)):
        h = x[b, s].tolist()
        mu = sum(h) / d
        var = sum((v - mu) ** 2 for v in h) / d  # over the d features, population variance
        for j in range(d):
            expected[b, s, j] = ln.weight[j] * (h[j] - mu) / math.sqrt(var + eps) + ln.bias[j]
    ln.train()
    out_train = ln(x)
    ln.eval()
    out_eval = ln(x)
    torch.testing.assert_close(out_train, expected, rtol=0, atol=1e-10)
    assert torch.equal(out_train, out_eval)
    # other examples and other positions do not matter: change them wildly, row (0, 1) stays the same
    y = x.clone()
    y[1:] = torch.randn_like(y[1:]) * 100
    y[0, [0, 2, 3]] = -50.0
    assert torch.equal(ln(y)[0, 1], out_eval[0, 1])


def test_layernorm_of_a_constant_vector_is_beta():
    """Seed 000: "When all features of a vector are equal, sigma^2 = 0, the normalized part is 0, and
    the result is beta" (epsilon "keeps the denominator positive": no division by zero)."""
    d = 6
    ln = LayerNorm(d).double()
    with torch.no_grad():
        ln.weight.copy_(torch.randn(d, dtype=torch.float64))
        ln.bias.copy_(torch.randn(d, dtype=torch.float64))
    for c in (0.0, -3.5, 1e4):
        out = ln(torch.full((2, d), c, dtype=torch.float64))
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, ln.bias.detach().expand(2, d), rtol=0, atol=1e-9)


# ---- residual stream and the pre-norm block ------------------------------------------------------
def test_residual_stream_is_the_running_sum_of_embeddings_and_sublayer_outputs():
    """Seed 000, residual connection: "y = h + f(h), so f must return vectors of the same width as h.
    The running sum of the embeddings and all sublayer outputs is called the residual stream"; the
    block maps "an n x d input H to an n x d output Z"."""
    model = tiny_model(n_layers=3, pos="sinusoidal")
    ids = torch.tensor([[[2, 5, 1, 1, 0, 3]]])
    outputs, shapes = [], []

    def keep(module, args, out):
        shapes.append((tuple(args[0].shape), tuple(out.shape)))
        outputs.append(out)

    for block in model.blocks:
        block.attn.register_forward_hook(keep)
        block.ffn.register_forward_hook(keep)
        block.register_forward_hook(lambda m, args, out: shapes.append((tuple(args[0].shape), tuple(out.shape))))
    stream = {}
    keep_first_input(model.final_norm, stream, "top")
    model(ids)
    n, d = 6, model.config.d_model
    assert all(s == ((1, n, d), (1, n, d)) for s in shapes)  # every sublayer and block: n x d -> n x d
    assert len(outputs) == 2 * model.config.n_layers
    H0 = model.embed(ids) + model.pos_embedding.table[:n].double()
    torch.testing.assert_close(stream["top"], H0 + sum(outputs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_prenorm_block_is_two_residual_steps_in_this_order(norm):
    """Seed 000, pre-normalization block: two residual steps, O = H + MHA(LN(H)) then
    Z = O + FFN(LN(O)) ("the order of operations is part of the architecture and a diagram must match
    the implementation it describes"). Recomputed with the block's own submodules."""
    cfg = tiny(norm=norm, ffn="gelu", bias=True)
    block = randomized(Block(cfg, 0))
    H = torch.randn(2, 5, cfg.d_model, dtype=torch.float64)
    O = H + block.attn(block.attn_norm(H))
    Z = O + block.ffn(block.ffn_norm(O))
    out = block(H)
    torch.testing.assert_close(out, Z, rtol=0, atol=1e-12)
    # the test can tell orders apart: post-norm with the same weights gives something else
    post_O = block.attn_norm(H + block.attn(H))
    post_Z = block.ffn_norm(post_O + block.ffn(post_O))
    assert (out - post_Z).abs().max() > 1e-2


# ---- feed-forward network ----------------------------------------------------------------------
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_feed_forward_is_phi_of_u_W1_plus_b1_times_W2_plus_b2_with_d_ff(act):
    """Seed 000: "The feed-forward network applies the same weights to every row u ... with W1 of shape
    d x d_ff, W2 of shape d_ff x d and an activation phi such as ReLU"."""
    cfg = tiny(ffn=act, d_ff=12, bias=True)
    ffn = randomized(FeedForward(cfg))
    W1, b1 = ffn.w1.weight.T, ffn.w1.bias  # nn.Linear stores [out, in]; the seed's W1 is [in, out]
    W2, b2 = ffn.w2.weight.T, ffn.w2.bias
    assert W1.shape == (cfg.d_model, 12) and W2.shape == (12, cfg.d_model)
    phi = {"relu": lambda a: a.clamp(min=0), "gelu": lambda a: 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))}[act]
    U = torch.randn(2, 4, cfg.d_model, dtype=torch.float64)
    out = ffn(U)
    for b, s in itertools.product(range(2), range(4)):  # the same weights on every row, one row at a time
        u = U[b, s]
        torch.testing.assert_close(out[b, s], phi(u @ W1 + b1) @ W2 + b2, rtol=0, atol=1e-12)


def test_attention_is_the_only_step_that_mixes_positions():
    """Seed 000: "Attention is the only step that mixes positions": changing the input at one position
    changes norm and feed-forward outputs at that position only, and the (unmasked) attention output
    everywhere."""
    cfg = tiny(norm="layernorm", ffn="swiglu")
    block = randomized(Block(cfg, 0))
    X = torch.randn(1, 5, cfg.d_model, dtype=torch.float64)
    Y = X.clone()
    Y[0, 2] += 1.0
    for layer in (block.attn_norm, block.ffn, block.ffn_norm):
        changed = (layer(X) - layer(Y)).abs().amax(dim=-1)[0] > 0
        assert changed.tolist() == [False, False, True, False, False]
    changed = (block.attn(X, mask=full_mask(5)) - block.attn(Y, mask=full_mask(5))).abs().amax(dim=-1)[0] > 0
    assert changed.all()


# ---- next-token prediction -----------------------------------------------------------------------
def test_inputs_are_the_targets_shifted_by_one_after_the_beginning_symbol():
    """Seed 000, next-token prediction: "A sequence x_1, ..., x_T is preceded by a beginning symbol x_0,
    so the inputs are (x_0, ..., x_{T-1}) and the targets are (x_1, ..., x_T)"; the token loss is
    -ln P(x_t | x_<t) and the sequence loss its mean, "measured in nats per token"."""
    model = tiny_model()
    x = torch.tensor([[[4, 0, 6, 6, 2]]])  # x_1..x_T, T = 5
    seen = {}
    keep_first_input(model, seen, "inputs")
    result = model.loss(x)
    bos = model.config.bos_id
    assert seen["inputs"].tolist() == [[[bos, 4, 0, 6, 6]]]
    log_p = torch.log_softmax(model(seen["inputs"])[0, 0].double(), dim=-1)  # [T, |V|]
    token_losses = [-float(log_p[t, x[0, 0, t]]) for t in range(5)]
    assert abs(float(result.loss) - sum(token_losses) / 5) < 1e-5
    assert int(result.count.sum()) == 5


def test_padding_is_left_out_of_both_the_sum_and_the_count():
    """Seed 000: "Over a batch the mean runs over all valid target positions, and padding is left out of
    both the sum and the count"."""
    model = tiny_model()
    a = torch.tensor([[[1, 2, 3, 4, 5]]])
    b = torch.tensor([[[6, 0, 2]]])
    padded = torch.cat([a, F.pad(b, (0, 2), value=0)], dim=0)  # [2, 1, 5]
    frame_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    result = model.loss(padded, frame_mask)
    assert int(result.count.sum()) == 8  # 5 + 3 valid targets, not 10
    nll_a = float(model.log_likelihood(a)[0])
    nll_b = float(model.log_likelihood(b)[0])  # the short sequence alone, never padded
    assert abs(float(result.loss) - (nll_a + nll_b) / 8) < 1e-5
    assert abs(float(result.nll_sum.sum()) - (nll_a + nll_b)) < 1e-5
    other_padding = padded.clone()
    other_padding[1, 0, 3:] = torch.tensor([5, 6])  # whatever sits in the padding changes nothing
    assert torch.equal(model.loss(other_padding, frame_mask).loss, result.loss)


def test_summed_loss_is_minus_log_of_the_chain_rule_probability():
    """Seed 000: "By the chain rule of probability the product of the conditionals is the model's
    probability of x_1, ..., x_T after x_0, so T * L(theta) is the negative log of that probability".
    The conditionals are taken from separate forward passes over each prefix, and the probabilities of
    all |V|^T sequences must add up to 1."""
    model = tiny_model(codebook_size=3)
    T, bos = 3, model.config.bos_id
    seqs = torch.tensor(list(itertools.product(range(3), repeat=T))).view(-1, 1, T)  # all 27 sequences
    nll = model.log_likelihood(seqs).double()  # [27] summed loss per sequence
    for k in (5, 22):
        assert abs(T * float(model.loss(seqs[k][None]).loss) - float(nll[k])) < 1e-5  # T * L = summed loss
        x = seqs[k, 0].tolist()
        prob = 1.0
        for t in range(T):  # P(x_{t+1} | x_0..x_t) from the last position of the prefix alone
            prefix = torch.tensor([[[bos] + x[:t]]])
            prob *= float(torch.softmax(model(prefix)[0, 0, -1], -1)[x[t]])
        assert abs(float(nll[k]) + math.log(prob)) < 1e-5
    assert abs(float(torch.exp(-nll).sum()) - 1.0) < 1e-5


# ---- decoder-only model --------------------------------------------------------------------------
@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "learned"])
def test_output_at_t_depends_only_on_tokens_up_to_t_so_one_pass_serves_all_positions(pos):
    """Seed 000, decoder-only model: "the output at position t depends only on the tokens at positions
    up to t, so one forward pass computes the next-token distributions for all positions of a training
    sequence at once" (each prefix run alone gives the same logits as the full pass)."""
    model = tiny_model(pos=pos)
    ids = torch.tensor([[[8, 3, 1, 6, 6, 0, 2]]])
    full = model(ids)[0, 0]
    for t in range(1, 8):
        torch.testing.assert_close(model(ids[..., :t])[0, 0], full[:t], rtol=0, atol=1e-10)
    changed = ids.clone()
    changed[..., 4:] = torch.tensor([0, 1, 5])
    torch.testing.assert_close(model(changed)[0, 0, :4], full[:4], rtol=0, atol=1e-10)
    assert (model(changed)[0, 0, 4:] - full[4:]).abs().max() > 1e-3


def test_head_maps_each_final_normalized_row_to_vocabulary_logits():
    """Seed 000: "followed by a linear head that maps each final row to |V| logits and a softmax across
    the vocabulary. Many designs apply one more layer normalization before the head"."""
    model = tiny_model()
    ids = torch.tensor([[[8, 1, 2, 3]]])
    seen = {}
    keep_first_output(model.final_norm, seen, "rows")
    logits = model(ids)
    assert logits.shape == (1, 1, 4, model.config.codebook_size)  # |V| logits: never pad or bos
    torch.testing.assert_close(logits[0, 0], seen["rows"][0] @ model.head_weights()[0].T, rtol=0, atol=1e-12)
    probs = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 1, 4, dtype=torch.float64))
