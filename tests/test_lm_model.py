"""MultiCodebookLM and its layers against the definitions of seeds 000-002 (each test names its passage)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lm import LMConfig, MultiCodebookLM
from lm.conditioning import ConditionInputs
from lm.layers import Attention, Block, FeedForward, LayerNorm, RMSNorm, SinusoidalPositions, SwiGLU
from lm.rope import RotaryEmbedding, apply_rotary


def tiny(**overrides) -> LMConfig:
    base = dict(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=4, max_seq_len=64)
    base.update(overrides)
    return LMConfig(**base)


def model_inputs(model: MultiCodebookLM, codes: torch.Tensor, frame_mask=None):
    """The inputs [bos, seq[:-1]] and targets seq of seed 000's next-token objective, plus validity."""
    seq, valid = model.pattern.build(codes, frame_mask, model.config.pad_id)
    inputs = torch.cat([torch.full_like(seq[..., :1], model.config.bos_id), seq[..., :-1]], dim=-1)
    return inputs, seq, valid


# ---- embeddings and heads -----------------------------------------------------------------------
def test_embedding_lookup_is_one_hot_times_table_and_codebooks_are_summed():
    """Seed 000 (tokenizer/embedding): looking up a token = its one-hot row times W_E; issue 4: the N_c
    lookups are summed into one d-vector per position, [B, S, d]."""
    cfg = tiny()
    model = MultiCodebookLM(cfg)
    tokens = torch.randint(0, cfg.embedding_rows, (2, cfg.n_codebooks, 7))
    summed = model.embed(tokens)
    assert summed.shape == (2, 7, cfg.d_model)
    expected = sum(F.one_hot(tokens[:, c], cfg.embedding_rows).float() @ model.codebook_table(c)
                   for c in range(cfg.n_codebooks))
    torch.testing.assert_close(summed, expected)
    # each codebook has its own table: the same id in different codebooks embeds differently
    assert not torch.allclose(model.codebook_table(0)[3], model.codebook_table(1)[3])


def test_heads_give_codebook_size_logits_per_codebook():
    """Seed 001 (LM head): each final row maps to |V| logits; issue 4: N_c heads, never the special ids."""
    cfg = tiny()
    model = MultiCodebookLM(cfg)
    tokens = torch.randint(0, cfg.embedding_rows, (2, cfg.n_codebooks, 5))
    logits = model(tokens)
    assert logits.shape == (2, cfg.n_codebooks, 5, cfg.codebook_size)
    assert model.head_weights().shape == (cfg.n_codebooks, cfg.codebook_size, cfg.d_model)


def test_weight_tying_uses_each_codebooks_embedding_table():
    """Seed 001 (weight tying): the unembedding is E^T, so head c's weight is codebook c's table (first |V| rows)."""
    cfg = tiny(tie_weights=True)
    model = MultiCodebookLM(cfg)
    assert model.head_weight is None
    for c in range(cfg.n_codebooks):
        assert torch.equal(model.head_weights()[c], model.codebook_table(c)[:cfg.codebook_size])
    untied = MultiCodebookLM(tiny())
    assert untied.num_parameters() - model.num_parameters() == cfg.n_codebooks * cfg.codebook_size * cfg.d_model
    # the logits really are h @ W_E^T: a change to an embedding row moves that head's logit
    tokens = torch.randint(0, cfg.codebook_size, (1, cfg.n_codebooks, 4))
    before = model(tokens)
    with torch.no_grad():
        model.token_embedding.weight[cfg.embedding_rows + 5] += 1.0  # codebook 1, code 5
    after = model(tokens)
    changed = (after - before).abs().amax(dim=(0, 2))  # [N_c, |V|]
    assert changed[1, 5] > 1e-3


# ---- norms and positions ------------------------------------------------------------------------
def test_layernorm_of_constant_vector_returns_beta():
    """Seed 000 (layer normalization): when all features are equal, sigma^2 = 0 and the result is beta."""
    norm = LayerNorm(8)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    out = norm(torch.full((2, 3, 8), 4.25))
    torch.testing.assert_close(out, norm.bias.expand(2, 3, 8))


def test_layernorm_uses_statistics_over_features_only():
    """Seed 000: mean and variance over the d features of one vector; no other position or example."""
    norm = LayerNorm(6, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 4, 6) * 3 + 1
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased variance, 1/d
    expected = norm.weight * (x - mu) / torch.sqrt(var + 1e-5) + norm.bias
    torch.testing.assert_close(norm(x), expected)
    torch.testing.assert_close(norm(x[1:2, 2:3]), norm(x)[1:2, 2:3])  # alone or in a batch: the same


def test_rmsnorm_formula():
    """Seed 002 (RMSNorm): LayerNorm with mu = 0 and b = 0, i.e. w * x / sqrt(mean(x^2) + eps)."""
    norm = RMSNorm(6, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 4, 6) + 2
    expected = norm.weight * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), expected)


def test_sinusoidal_encoding_formula():
    """Seed 000 (positional encoding): P[i, 2m] = sin(i / 10000^(2m/d)), P[i, 2m+1] = cos(i / 10000^(2m/d))."""
    d = 10
    enc = SinusoidalPositions(d, max_len=50)
    table = enc(torch.arange(50))
    for i in (0, 1, 7, 49):
        for m in range(d // 2):
            angle = i / 10000 ** (2 * m / d)
            assert table[i, 2 * m].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[i, 2 * m + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_rope_preserves_norms_and_scores_depend_on_position_difference_only():
    """Seed 002 (RoPE on keys/queries): rotations keep norms, and q.k depends on positions only via a - p."""
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def rotated(x, pos):
        cos, sin = rope.cos_sin(torch.tensor([pos]), torch.float32)
        return apply_rotary(x, cos, sin)

    torch.testing.assert_close(rotated(q, 13).norm(), q.norm())
    score = (rotated(q, 3) * rotated(k, 10)).sum()
    shifted = (rotated(q, 3 + 1000) * rotated(k, 10 + 1000)).sum()
    torch.testing.assert_close(score, shifted, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score, (rotated(q, 3) * rotated(k, 11)).sum(), atol=1e-4)


# ---- attention ----------------------------------------------------------------------------------
def reference_attention(attn: Attention, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Seed 001 written out per head: head_i = softmax(mask(q k^T / sqrt(d_k))) v, then (head_1 + ... + head_A) W_O
    concatenated. x [S, d], mask [S, S] bool (True = may attend) or None = unmasked."""
    h, h_kv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w_q, w_k, w_v = attn.qkv.weight.split([h * dh, h_kv * dh, h_kv * dh])
    heads = []
    for i in range(h):
        g = i // (h // h_kv)  # the K/V head serving query head i
        q = x @ w_q[i * dh:(i + 1) * dh].T
        k = x @ w_k[g * dh:(g + 1) * dh].T
        v = x @ w_v[g * dh:(g + 1) * dh].T
        scores = q @ k.T / math.sqrt(dh)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return torch.cat(heads, dim=-1) @ attn.out.weight.T


@pytest.mark.parametrize("n_kv_heads", [None, 4, 2, 1])
def test_attention_is_scaled_masked_multihead_formula(n_kv_heads):
    """Seed 001: scores q.k/sqrt(d_k), upper triangle -inf, heads of width d_v = d/A concatenated then W_O;
    GQA: with n_kv_heads == n_heads it is plain MHA, with fewer each K/V head serves a group of query heads."""
    cfg = tiny(n_kv_heads=n_kv_heads)
    attn = Attention(cfg, 0)
    assert attn.head_dim == cfg.d_model // cfg.n_heads
    x = torch.randn(1, 6, cfg.d_model)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(attn(x)[0], reference_attention(attn, x[0], causal), atol=1e-5, rtol=1e-5)


def test_gqa_equals_mha_with_key_value_heads_repeated_per_group():
    """Issue 4 (GQA): n_kv_heads < n_heads is MHA whose K/V projections are shared within each group."""
    gqa = Attention(tiny(n_kv_heads=2), 0)
    mha = Attention(tiny(), 0)
    dh, h = gqa.head_dim, gqa.n_heads
    w_q, w_k, w_v = gqa.qkv.weight.split([h * dh, 2 * dh, 2 * dh])
    repeat = lambda w: w.view(2, dh, -1).repeat_interleave(2, dim=0).reshape(h * dh, -1)  # noqa: E731
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([w_q, repeat(w_k), repeat(w_v)]))
        mha.out.weight.copy_(gqa.out.weight)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(gqa(x), mha(x), atol=1e-6, rtol=1e-5)


def test_unmasked_attention_is_permutation_equivariant_and_the_causal_mask_breaks_it():
    """Seed 000: f(Pi X) = Pi f(X) for self-attention without a mask (hence positional encodings are needed)."""
    attn = Attention(tiny(), 0)
    x = torch.randn(1, 8, 32)
    perm = torch.randperm(8)
    while torch.equal(perm, torch.arange(8)):
        perm = torch.randperm(8)
    no_mask = torch.ones(8, 8, dtype=torch.bool)
    torch.testing.assert_close(attn(x[:, perm], mask=no_mask), attn(x, mask=no_mask)[:, perm], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(attn(x[:, perm]), attn(x)[:, perm], atol=1e-4)  # causal: order matters


def test_causal_attention_output_ignores_later_tokens():
    """Seed 000 (causal mask): the output at t does not change when tokens after t change."""
    attn = Attention(tiny(), 0)
    x = torch.randn(1, 9, 32)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 4, 32)
    torch.testing.assert_close(attn(x)[:, :5], attn(y)[:, :5])
    assert not torch.allclose(attn(x)[:, 5:], attn(y)[:, 5:])


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "learned"])
def test_whole_model_is_causal(pos):
    """Seed 000 (decoder-only): the output at position t depends only on the tokens at positions up to t."""
    cfg = tiny(pos=pos, n_kv_heads=2)
    model = MultiCodebookLM(cfg)
    tokens = torch.randint(0, cfg.embedding_rows, (2, cfg.n_codebooks, 12))
    changed = tokens.clone()
    changed[..., 7:] = torch.randint(0, cfg.embedding_rows, (2, cfg.n_codebooks, 5))
    torch.testing.assert_close(model(tokens)[..., :7, :], model(changed)[..., :7, :])
    assert not torch.allclose(model(tokens)[..., 7:, :], model(changed)[..., 7:, :])


# ---- FFN and block ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,act", [("relu", F.relu), ("gelu", F.gelu)])
def test_feedforward_is_phi_uw1_plus_b1_times_w2_plus_b2(kind, act):
    """Seed 000 (FFN): phi(u W1 + b1) W2 + b2 with W1 [d, d_ff] and W2 [d_ff, d], the same for every row."""
    cfg = tiny(ffn=kind, d_ff=48, bias=True)
    ffn = FeedForward(cfg)
    assert ffn.w1.weight.shape == (48, 32) and ffn.w2.weight.shape == (32, 48)  # nn.Linear stores W^T
    u = torch.randn(2, 5, 32)
    expected = act(u @ ffn.w1.weight.T + ffn.w1.bias) @ ffn.w2.weight.T + ffn.w2.bias
    torch.testing.assert_close(ffn(u), expected)


def test_swiglu_form():
    """Seed 001 (SwiGLU): (Swish(x W1 + b1) * (x W2 + b2)) W3 + b3, Swish(x) = x sigma(x)."""
    cfg = tiny(ffn="swiglu", d_ff=40, bias=True)
    ffn = SwiGLU(cfg)
    x = torch.randn(2, 5, 32)
    a = x @ ffn.w1.weight.T + ffn.w1.bias
    expected = ((a * torch.sigmoid(a)) * (x @ ffn.w2.weight.T + ffn.w2.bias)) @ ffn.w3.weight.T + ffn.w3.bias
    torch.testing.assert_close(ffn(x), expected)
    assert tiny(ffn="swiglu").ffn_dim % 32 == 0 and tiny(ffn="gelu").ffn_dim == 4 * 32


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_prenorm_block_order(norm):
    """Seed 000 (pre-norm block): O = H + MHA(LN(H)), Z = O + FFN(LN(O)); the residual path is never normalised,
    so with both sublayers silenced the block is the identity (a post-norm block would return LN(H))."""
    cfg = tiny(norm=norm)
    block = Block(cfg, 0)
    h = torch.randn(2, 6, 32) * 5 + 3
    o = h + block.attn(block.attn_norm(h))
    torch.testing.assert_close(block(h), o + block.ffn(block.ffn_norm(o)))
    with torch.no_grad():
        block.attn.out.weight.zero_()
        block.ffn.w3.weight.zero_()
    torch.testing.assert_close(block(h), h)


# ---- loss ---------------------------------------------------------------------------------------
def chain_rule_probability(model: MultiCodebookLM, codes, frame_mask) -> torch.Tensor:
    """[B] product over steps s and valid codebooks c of P(seq[c, s] | inputs up to s), each factor from a
    separate forward pass over the prefix alone."""
    inputs, seq, valid = model_inputs(model, codes, frame_mask)
    probs = torch.ones(codes.shape[0], dtype=torch.float64)
    for b in range(codes.shape[0]):
        for s in range(seq.shape[-1]):
            p = torch.softmax(model(inputs[b:b + 1, :, :s + 1])[0, :, s], dim=-1)  # [N_c, |V|]
            for c in range(model.config.n_codebooks):
                if valid[b, c, s]:
                    probs[b] *= p[c, seq[b, c, s]]
    return probs


@pytest.mark.parametrize("pattern", ["delay", "parallel"])
def test_summed_loss_is_minus_log_chain_rule_probability_and_perplexity_is_exp_mean(pattern):
    """Seed 000 (next-token prediction): the summed loss is -log of the product of the conditionals (chain rule);
    seed 001: perplexity = P(w)^(-1/T) = exp(mean cross-entropy in nats)."""
    cfg = tiny(pattern=pattern, codebook_size=8)
    model = MultiCodebookLM(cfg).double().eval()
    codes = torch.randint(0, 8, (2, cfg.n_codebooks, 5))
    frame_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    out = model.loss(codes, frame_mask)
    probs = chain_rule_probability(model, codes, frame_mask)
    torch.testing.assert_close(model.log_likelihood(codes, frame_mask), -probs.log())
    torch.testing.assert_close(out.nll_sum.sum(), -probs.log().sum())
    n = int(out.count.sum())
    assert n == cfg.n_codebooks * (5 + 3)
    torch.testing.assert_close(out.perplexity(), probs.prod() ** (-1.0 / n))
    torch.testing.assert_close(out.loss.exp(), out.perplexity())


@pytest.mark.parametrize("pattern", ["delay", "parallel"])
def test_conditioned_summed_loss_is_minus_log_chain_rule_probability_with_the_end_token(pattern):
    """Seed 000 (next-token prediction) for a conditioned LM: with the end-of-audio target after a file's last
    frame (lm.end_of_audio), the summed loss is still -log of the product of the conditionals, each taken from
    a separate forward over the prefix alone under the row's own condition."""
    from lm.end_of_audio import layout_with_end

    cfg = tiny(pattern=pattern, codebook_size=8, condition={"speakers": ["a", "b"], "text_max_bytes": 8,
                                                             "encoder_layers": 1})
    model = MultiCodebookLM(cfg).double().eval()
    codes = torch.randint(0, 8, (2, cfg.n_codebooks, 5))
    frame_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    ends = torch.tensor([True, True])
    cond = model.condition_inputs(["ahoj", None], ["b", "a"], 2)
    seq, valid = layout_with_end(model.pattern, codes, frame_mask, ends, cfg.end_id, cfg.pad_id)
    inputs = torch.cat([torch.full_like(seq[..., :1], cfg.bos_id), seq[..., :-1]], dim=-1)
    log_p = torch.zeros(2, dtype=torch.float64)
    for b in range(2):
        memory = model.encode_condition(ConditionInputs(cond.text[b:b + 1], cond.text_len[b:b + 1],
                                                        cond.speaker[b:b + 1]))
        for s in range(seq.shape[-1]):
            p = torch.log_softmax(model(inputs[b:b + 1, :, :s + 1], memory=memory)[0, :, s], dim=-1)
            log_p[b] += sum(p[c, seq[b, c, s]] for c in range(cfg.n_codebooks) if valid[b, c, s])
    torch.testing.assert_close(model.log_likelihood(codes, frame_mask, cond, ends), -log_p)
    assert int(valid.sum()) == cfg.n_codebooks * (5 + 3) + 2  # every code, plus one end per row


def test_padding_changes_neither_sum_nor_count():
    """Seed 000: padding is left out of both the sum and the count; extra padded frames change nothing."""
    cfg = tiny()
    model = MultiCodebookLM(cfg).eval()
    codes = torch.randint(0, cfg.codebook_size, (2, cfg.n_codebooks, 6))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    base = model.loss(codes, mask)
    for _ in range(2):  # whatever the padded frames hold
        padded = torch.cat([codes, torch.randint(0, cfg.codebook_size, (2, cfg.n_codebooks, 5))], dim=-1)
        padded_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.bool)], dim=-1)
        out = model.loss(padded, padded_mask)
        torch.testing.assert_close(out.nll_sum, base.nll_sum)
        assert torch.equal(out.count, base.count)
        torch.testing.assert_close(out.loss, base.loss)
    assert base.count.tolist() == [10] * cfg.n_codebooks
    without_mask = model.loss(codes)
    assert without_mask.count.tolist() == [12] * cfg.n_codebooks


def test_loss_per_codebook_matches_log_likelihood_and_is_near_log_v_at_init():
    """Issue 4: loss = mean over valid targets of all codebooks; at init every codebook is near ln |V|."""
    cfg = tiny(codebook_size=64)
    model = MultiCodebookLM(cfg).eval()
    codes = torch.randint(0, 64, (3, cfg.n_codebooks, 10))
    out = model.loss(codes)
    torch.testing.assert_close(out.nll_sum.sum(), model.log_likelihood(codes).sum())
    torch.testing.assert_close(out.loss, out.nll_sum.sum() / out.count.sum())
    assert out.per_codebook().shape == (cfg.n_codebooks,)
    assert (out.per_codebook() - math.log(64)).abs().max() < 0.2


def test_bf16_autocast_loss_is_close_to_fp32():
    """Training in bf16 (issue 4): the logits are bf16 but the cross-entropy runs in fp32 and stays close."""
    cfg = tiny(codebook_size=64)
    model = MultiCodebookLM(cfg).eval()
    codes = torch.randint(0, 64, (2, cfg.n_codebooks, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model.loss(codes)
    assert low.loss.dtype == torch.float32
    torch.testing.assert_close(low.loss, model.loss(codes).loss, atol=0.03, rtol=0)


def test_dropout_is_active_in_training_only():
    """Dropout (issue 4) perturbs training forwards and leaves evaluation deterministic."""
    cfg = tiny(dropout=0.2)
    model = MultiCodebookLM(cfg)
    tokens = torch.randint(0, cfg.embedding_rows, (2, cfg.n_codebooks, 8))
    assert not torch.allclose(model.train()(tokens), model(tokens))
    torch.testing.assert_close(model.eval()(tokens), model(tokens))


def test_bad_codes_are_refused_clearly():
    cfg = tiny()
    model = MultiCodebookLM(cfg)
    with pytest.raises(ValueError, match=r"codes must be in 0\.\.15"):
        model.loss(torch.full((1, 3, 4), 16))
    with pytest.raises(ValueError, match="shape"):
        model.loss(torch.zeros(1, 2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="max_seq_len"):
        model.loss(torch.zeros(1, 3, 63, dtype=torch.long))
    with pytest.raises(ValueError, match="padding at the end"):
        model.loss(torch.zeros(1, 3, 4, dtype=torch.long), torch.tensor([[False, True, True, True]]))
    with pytest.raises(ValueError, match="token ids"):
        model(torch.full((1, 3, 4), cfg.bos_id + 1))


def test_config_validation():
    with pytest.raises(ValueError, match="divisible by n_heads"):
        LMConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        LMConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="norm must be one of"):
        LMConfig(norm="batchnorm")
    with pytest.raises(ValueError, match="unknown LMConfig settings"):
        LMConfig.from_dict({"n_layer": 3})
    assert LMConfig.from_dict(tiny().to_dict()) == tiny()


def test_parameter_and_flop_counts():
    """6N + 12 L d S training FLOPs per position (N = parameters used in matrix products: blocks and heads)."""
    cfg = tiny(ffn="swiglu", d_ff=64, n_kv_heads=2)
    model = MultiCodebookLM(cfg)
    d, dh = 32, 8
    per_layer = d * (4 + 2 * 2) * dh + d * d + 3 * d * 64
    matmul = cfg.n_layers * per_layer + cfg.n_codebooks * cfg.codebook_size * d
    assert model.flops_per_token(seq_len=10) == 6 * matmul + 12 * cfg.n_layers * d * 10
    norms = (2 * cfg.n_layers + 1) * d
    assert model.num_parameters() == cfg.n_layers * per_layer + norms + model.token_embedding.weight.numel() \
        + cfg.n_codebooks * cfg.codebook_size * d
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters() - cfg.n_codebooks * 18 * d


# ---- checkpoints --------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [dict(), dict(tie_weights=True, pos="learned", norm="layernorm", ffn="gelu",
                                                    bias=True, codec_fingerprint="codec-abc123")])
def test_save_and_load_round_trip_gives_equal_outputs(tmp_path, overrides):
    """Issue 4: save_pretrained / from_pretrained folders (config.json + model.safetensors) reproduce the model."""
    cfg = tiny(**overrides)
    model = MultiCodebookLM(cfg).eval()
    folder = model.save_pretrained(tmp_path / "lm")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    loaded = MultiCodebookLM.from_pretrained(folder).eval()
    assert loaded.config == cfg
    codes = torch.randint(0, cfg.codebook_size, (2, cfg.n_codebooks, 8))
    torch.testing.assert_close(loaded.log_likelihood(codes), model.log_likelihood(codes), rtol=0, atol=0)


def test_half_precision_save_loads_back_as_float32(tmp_path):
    """save_pretrained(dtype="float16") halves the weights file; it loads as a float32 model whose
    log-likelihoods are within half-precision rounding of the original's."""
    from safetensors.torch import load_file

    model = MultiCodebookLM(tiny()).eval()
    full = model.save_pretrained(tmp_path / "full")
    half = model.save_pretrained(tmp_path / "half", dtype="float16")
    assert {v.dtype for v in load_file(str(half / "model.safetensors")).values()} == {torch.float16}
    assert (half / "model.safetensors").stat().st_size < 0.55 * (full / "model.safetensors").stat().st_size
    loaded = MultiCodebookLM.from_pretrained(half).eval()
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    codes = torch.randint(0, loaded.config.codebook_size, (2, loaded.config.n_codebooks, 8))
    exact, rounded = model.log_likelihood(codes), loaded.log_likelihood(codes)
    assert not torch.equal(exact, rounded)
    torch.testing.assert_close(rounded, exact, rtol=0, atol=2e-2)
    with pytest.raises(ValueError, match="dtype must be one of"):
        model.save_pretrained(tmp_path / "bad", dtype="int4")


def test_export_lm_writes_half_precision_and_keeps_other_files(tmp_path, capsys):
    """`rvqlm export-lm SRC OUT --dtype float16`; an OUT holding a model card is refused, not wiped."""
    from rvqlm.cli import main

    model = MultiCodebookLM(tiny()).eval()
    src = model.save_pretrained(tmp_path / "src")
    assert main(["export-lm", str(src), str(tmp_path / "out"), "--dtype", "float16"]) == 0
    assert MultiCodebookLM.from_pretrained(tmp_path / "out").config == model.config
    (tmp_path / "out" / "MODEL_CARD.md").write_text("card")
    assert main(["export-lm", str(src), str(tmp_path / "out")]) == 2
    assert "MODEL_CARD.md" in capsys.readouterr().err
    assert (tmp_path / "out" / "MODEL_CARD.md").read_text() == "card"


def test_save_pretrained_replaces_a_saved_lm_but_never_a_model_card(tmp_path):
    """Saving over a saved LM replaces it whole (no file of the old save is left behind); a folder
    that holds anything else (a model card) is refused and left as it was."""
    folder = MultiCodebookLM(tiny(d_model=64)).save_pretrained(tmp_path / "lm")
    model = MultiCodebookLM(tiny()).eval()
    assert model.save_pretrained(folder) == folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm"]  # no temporary folder left over
    assert MultiCodebookLM.from_pretrained(folder).config == model.config
    (folder / "MODEL_CARD.md").write_text("card")
    with pytest.raises(FileExistsError, match=r"MODEL_CARD\.md"):
        MultiCodebookLM(tiny(d_model=64)).save_pretrained(folder)
    assert (folder / "MODEL_CARD.md").read_text() == "card"
    assert MultiCodebookLM.from_pretrained(folder).config == model.config


def test_from_pretrained_refuses_bad_folders_clearly(tmp_path):
    """Bad checkpoints get a message that says what is wrong, never a traceback from deep inside."""
    with pytest.raises(FileNotFoundError, match="no LM folder"):
        MultiCodebookLM.from_pretrained(tmp_path / "missing")
    model = MultiCodebookLM(tiny())
    folder = model.save_pretrained(tmp_path / "lm")

    (folder / "model.safetensors").rename(folder / "weights.bin")
    with pytest.raises(FileNotFoundError, match="model.safetensors is missing"):
        MultiCodebookLM.from_pretrained(folder)
    (folder / "weights.bin").write_bytes(b"not a safetensors file")
    (folder / "weights.bin").rename(folder / "model.safetensors")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        MultiCodebookLM.from_pretrained(folder)

    folder = model.save_pretrained(tmp_path / "lm2")
    (folder / "config.json").write_text("{ broken")
    with pytest.raises(ValueError, match="not valid JSON"):
        MultiCodebookLM.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "something-else"}))
    with pytest.raises(ValueError, match="does not describe an rvqlm LM"):
        MultiCodebookLM.from_pretrained(folder)

    # config.json from another save (different size): the weights' embedded config catches the mix
    MultiCodebookLM(tiny(d_model=64)).save_pretrained(tmp_path / "other")
    (tmp_path / "other" / "config.json").replace(folder / "config.json")
    with pytest.raises(ValueError, match="different saves"):
        MultiCodebookLM.from_pretrained(folder)


# ---- learning -----------------------------------------------------------------------------------
def speech_tokens(path, n_codebooks: int, codebook_size: int, n_frames: int) -> torch.Tensor:
    """Real-speech token streams [1, N_c, T]: the log energy of N_c frequency bands of 20 ms frames of a real
    recording, each band quantised into |V| levels (a stand-in for codec codes with their real dynamics)."""
    from codec.core.audio import load_audio

    audio = load_audio(path, 16000)[0]
    hop = 320
    frames = audio[: (audio.numel() // hop) * hop].view(-1, hop)
    energy = torch.fft.rfft(frames).abs().pow(2)  # [F, 161] power spectrum per frame
    bands = torch.stack([b.sum(-1) for b in energy.tensor_split(n_codebooks, dim=-1)], dim=0)
    log_e = (bands + 1e-8).log()[:, :n_frames]  # [N_c, T]
    lo, hi = log_e.amin(1, keepdim=True), log_e.amax(1, keepdim=True)
    codes = ((log_e - lo) / (hi - lo + 1e-9) * (codebook_size - 1)).round().long()
    return codes[None]


def test_small_model_overfits_a_short_real_token_sequence(speech_files):
    """Issue 4: a small model drives the loss on one short real token sequence to near zero (it can memorise)."""
    path = max(speech_files["valid"][:20], key=lambda p: p.stat().st_size)
    codes = speech_tokens(path, n_codebooks=4, codebook_size=32, n_frames=40)
    assert codes.shape == (1, 4, 40)
    assert len(np.unique(codes.numpy())) > 8  # a real, varied sequence, not a constant
    cfg = LMConfig(n_codebooks=4, codebook_size=32, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)
    model = MultiCodebookLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    start = model.loss(codes).loss.item()
    for _ in range(100):
        loss = model.loss(codes).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    end = model.eval().loss(codes).loss.item()
    assert start > 3.0
    assert end < 0.05, f"loss went from {start:.3f} to {end:.3f} only"


def test_saved_lm_files_get_normal_permissions(tmp_path):
    """safetensors writes 0600 files; a saved LM must be readable like any file."""
    import os
    import stat

    model = MultiCodebookLM(LMConfig(n_codebooks=2, codebook_size=5, d_model=8, n_layers=1, n_heads=2, max_seq_len=8))
    out = model.save_pretrained(tmp_path / "lm")
    mask = os.umask(0)
    os.umask(mask)
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f
