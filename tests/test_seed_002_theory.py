"""docs/theory.md's worked examples, recomputed from rvqlm's own code.

Seed 002 closes with a problem whose solution is "(to be added!)": "show exactly how RoPE positional
encoding works with an example. Also, explain and motivate the cross-entropy loss ... and how this
relates to ... the one-hot encoded vectors being l1-unit vectors". docs/theory.md is that solution;
it promises that every number of its two examples is recomputed here from the code. The numbers are
parsed out of the page, so editing a number there (or changing the code) without the other fails.

RoPE comes from `lm.rope.RotaryEmbedding` / `apply_rotary` (what attention uses); cross-entropy
goes through `MultiCodebookLM.loss`, the path training uses, on a model whose logits are pinned to
the example's.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lm import LMConfig, MultiCodebookLM
from lm.layers import Attention
from lm.rope import RotaryEmbedding, apply_rotary

THEORY = Path(__file__).resolve().parents[1] / "docs" / "theory.md"
NUM = r"(-?\d+(?:\.\d+)?)"
TOL = 1e-5  # the page prints 6 decimals


@pytest.fixture(scope="module")
def doc() -> str:
    return THEORY.read_text(encoding="utf-8")


def find(doc: str, pattern: str) -> tuple[float, ...]:
    """The numbers captured by `pattern` (a regex where any run of spaces matches any whitespace)."""
    match = re.search(pattern.replace(" ", r"\s+"), doc)
    assert match, f"docs/theory.md no longer contains the passage /{pattern}/"
    return tuple(float(g) for g in match.groups())


def rope_score(q: torch.Tensor, k: torch.Tensor, q_pos: int, k_pos: int, base: float = 10000.0) -> float:
    """(R(q_pos) q) . (R(k_pos) k) with rvqlm's RoPE. q, k [d_k] float64."""
    q_rot, k_rot = rotate(q, q_pos, base), rotate(k, k_pos, base)
    return float(q_rot @ k_rot)


def rotate(x: torch.Tensor, pos: int, base: float = 10000.0) -> torch.Tensor:
    """x [d_k] rotated to position `pos` by lm.rope (as attention applies it to [B, H, S, Dh])."""
    rope = RotaryEmbedding(x.shape[-1], base)
    cos, sin = rope.cos_sin(torch.tensor([pos]), torch.float64)
    return apply_rotary(x.view(1, 1, 1, -1), cos, sin).view(-1)


# ---- 1. RoPE -----------------------------------------------------------------------------------------
def test_rope_rule_frequencies_and_pairing_are_what_the_page_says(doc):
    """theory.md: "Pair m (for m = 0, ..., d_k/2 - 1) gets a frequency theta_m = base^(-2m / d_k) (base
    10,000 by default)", each pair "rotated, in its own plane, by the angle p * theta_m" as
    "(x_a cos - x_b sin, x_a sin + x_b cos)", and "In rvqlm the pair m is the coordinates (m, m + d_k/2)"."""
    assert "pair `m` is the coordinates `(m, m + d_k/2)`" in doc
    assert "theta_m = base^(-2m / d_k)" in doc and "base 10,000" in doc
    assert LMConfig().rope_base == 10000.0
    d_k, base = 8, 10000.0
    theta = RotaryEmbedding(d_k, base).inv_freq
    for m in range(d_k // 2):
        assert abs(float(theta[m]) - base ** (-2 * m / d_k)) < 1e-15
    gen = torch.Generator().manual_seed(0)
    for pos in (1, 3, 250):
        for m in range(d_k // 2):
            x = torch.randn(d_k, generator=gen, dtype=torch.float64)
            x_a, x_b = float(x[m]), float(x[m + d_k // 2])
            angle = pos * base ** (-2 * m / d_k)
            out = rotate(x, pos, base)
            assert abs(float(out[m]) - (x_a * math.cos(angle) - x_b * math.sin(angle))) < 1e-12
            assert abs(float(out[m + d_k // 2]) - (x_a * math.sin(angle) + x_b * math.cos(angle))) < 1e-12


@pytest.fixture(scope="module")
def example(doc) -> dict:
    """theory.md's RoPE example: "Query q = (1, 2) at position 3, key k = (3, -1) at position 1"."""
    q1, q2, q_pos, k1, k2, k_pos = find(doc, r"Query `q = \(NUM, NUM\)` at position (\d+), key `k = \(NUM, NUM\)` "
                                             r"at position (\d+)".replace("NUM", NUM))
    (score,) = find(doc, r"`q' \. k' = [^`]*= NUM`".replace("NUM", NUM))
    return dict(q=torch.tensor([q1, q2], dtype=torch.float64), k=torch.tensor([k1, k2], dtype=torch.float64),
                q_pos=int(q_pos), k_pos=int(k_pos), score=score)


def test_rope_example_score(doc, example):
    """theory.md, "Example (d_k = 2, one pair, theta_0 = base^0 = 1 radian)": the plain score q . k, cos 2 and
    sin 2, R(-2) k, and the rotated score q' . k' = q^T R(-2) k, from lm.rope."""
    q, k, q_pos, k_pos, score = (example[key] for key in ("q", "k", "q_pos", "k_pos", "score"))
    assert RotaryEmbedding(2).inv_freq.tolist() == [1.0]  # theta_0 = base^0 = 1 radian
    (plain,) = find(doc, r"Without rotation: `q \. k = [^`]*= NUM`".replace("NUM", NUM))
    assert abs(float(q @ k) - plain) < TOL
    cos2, sin2 = find(doc, r"`cos 2 = NUM` and `sin 2 = NUM`".replace("NUM", NUM))
    assert abs(math.cos(q_pos - k_pos) - cos2) < TOL and abs(math.sin(q_pos - k_pos) - sin2) < TOL
    rk1, rk2 = find(doc, r"`R\(-2\) k = [^`]*= \(NUM, NUM\)`".replace("NUM", NUM))
    r_minus_2_k = rotate(k, k_pos - q_pos)  # R(k_pos - q_pos) k, rotated by the code
    assert abs(float(r_minus_2_k[0]) - rk1) < TOL and abs(float(r_minus_2_k[1]) - rk2) < TOL
    assert abs(rope_score(q, k, q_pos, k_pos) - score) < TOL
    assert abs(float(q @ r_minus_2_k) - score) < TOL  # q^T R(n - m) k: only the difference matters


def test_rope_example_shifted_positions_give_the_same_score(doc, example):
    """theory.md: "Shift both tokens by 10 positions (query at 13, key at 11): the score is again -6.781228"."""
    q_shift, k_shift, shifted = find(doc, r"\(query at (\d+), key at (\d+)\): the score is again `NUM`"
                                          .replace("NUM", NUM))
    assert q_shift - k_shift == example["q_pos"] - example["k_pos"] and q_shift != example["q_pos"]
    assert abs(rope_score(example["q"], example["k"], int(q_shift), int(k_shift)) - shifted) < TOL
    assert abs(shifted - example["score"]) < TOL


def test_rope_example_swapped_positions(doc, example):
    """theory.md: "Swap the positions (query at 1, key at 3): the difference changes sign and the score
    becomes 5.948901. RoPE is not symmetric in the two positions"."""
    q_swap, k_swap, swapped = find(doc, r"\(query at (\d+), key at (\d+)\): the difference changes sign and the "
                                        r"score becomes `NUM`".replace("NUM", NUM))
    assert (q_swap, k_swap) == (example["k_pos"], example["q_pos"])
    code_score = rope_score(example["q"], example["k"], int(q_swap), int(k_swap))
    assert abs(code_score - example["score"]) > 1  # not symmetric in the two positions
    assert abs(code_score - swapped) < TOL, f"the code gives {code_score:.6f}, docs/theory.md prints {swapped}"


def test_rope_example_norm_is_preserved(doc, example):
    """theory.md: "|q'| = |q| = sqrt(5) = 2.236068: the rotation changed the direction, not the length"."""
    norm_sq, norm = find(doc, r"`\|q'\| = \|q\| = sqrt\(NUM\) = NUM`".replace("NUM", NUM))
    q = example["q"]
    assert abs(float(q @ q) - norm_sq) < TOL and abs(math.sqrt(norm_sq) - norm) < TOL
    rotated = rotate(q, example["q_pos"])
    assert abs(float(rotated.norm()) - norm) < TOL
    assert abs(float(rotated @ q) - float(q @ q)) > 1  # and the direction did change


def test_rope_scores_depend_only_on_the_position_difference_and_norms_are_kept():
    """theory.md: "(R(m theta) q) . (R(n theta) k) = q^T R((n - m) theta) k, which depends on the positions
    only through their difference n - m", and "Norms are preserved" (random d_k = 8 vectors)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(8, generator=gen, dtype=torch.float64)
    k = torch.randn(8, generator=gen, dtype=torch.float64)
    by_offset = {}
    for offset in (-7, -1, 0, 2, 5, 30):
        scores = [rope_score(q, k, p, p - offset) for p in (40, 41, 100, 517, 4096)]
        assert max(scores) - min(scores) < 1e-9, (offset, scores)
        by_offset[offset] = scores[0]
    assert len({round(s, 6) for s in by_offset.values()}) == len(by_offset)  # the offset does matter
    for pos in (0, 3, 99, 10_000):
        assert abs(float(rotate(q, pos).norm()) - float(q.norm())) < 1e-12


def test_rope_rotates_queries_and_keys_but_not_values():
    """theory.md: "Queries and keys are rotated; values are not": a single position attends only to itself,
    so attention returns W_O v whatever that position's absolute index is."""
    cfg = LMConfig(n_codebooks=1, codebook_size=5, d_model=8, n_layers=1, n_heads=2, max_seq_len=64)
    attn = Attention(cfg, 0).double().eval()
    rope = RotaryEmbedding(cfg.head_dim)
    x = torch.randn(1, 1, cfg.d_model, dtype=torch.float64)
    outs = [attn(x, rope=rope.cos_sin(torch.tensor([p]), torch.float64)) for p in (0, 5, 33)]
    v = attn.qkv(x)[..., -cfg.kv_heads * cfg.head_dim:]  # the fused projection ends with the values
    torch.testing.assert_close(outs[0], attn.out(v), rtol=0, atol=1e-12)
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=0, atol=1e-12)


# ---- 2. cross-entropy ----------------------------------------------------------------------------------
def pinned_model(logits: list[float]) -> MultiCodebookLM:
    """A |V| = len(logits), N_c = 1 model whose logits are `logits` at every position: the final
    LayerNorm's gain is 0 and its shift e_0, and head row v is logits[v] e_0 (so h . W[v] = logits[v])."""
    cfg = LMConfig(n_codebooks=1, codebook_size=len(logits), d_model=4, n_layers=1, n_heads=1,
                   norm="layernorm", max_seq_len=4, pattern="parallel")
    model = MultiCodebookLM(cfg)
    with torch.no_grad():
        model.final_norm.weight.zero_()
        model.final_norm.bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0]))
        model.head_weight.zero_()
        model.head_weight[0, :, 0] = torch.tensor(logits)
    return model


def test_cross_entropy_worked_example_through_the_models_loss(doc):
    """theory.md, "Example (|V| = 3). Logits u = (2.0, 1.0, 0.1); the next token is token 0": y_hat, the loss
    H(y, y_hat) = -log y_hat[0], the perplexity exp(H), and the gradient y_hat - y "whose entries sum to 0",
    all from MultiCodebookLM.loss (the training path), its perplexity() and autograd."""
    u = list(find(doc, r"Logits `u = \(NUM, NUM, NUM\)`".replace("NUM", NUM)))
    (target,) = find(doc, r"the next token is token (\d+), so `y = \(1, 0, 0\)`")
    p_expected = find(doc, r"`y_hat = softmax\(u\) = \(NUM, NUM, NUM\)`".replace("NUM", NUM))
    p_target, loss_expected = find(doc, r"`H\(y, y_hat\) = -log NUM = NUM` nats".replace("NUM", NUM))
    loss_again, ppl_expected = find(doc, r"`exp\(NUM\) = NUM`".replace("NUM", NUM))
    grad_expected = find(doc, r"`y_hat - y = \(NUM, NUM, NUM\)`".replace("NUM", NUM))
    assert loss_again == loss_expected and target == 0

    model = pinned_model(u)
    captured = {}

    def keep_logits(module, args, out):  # returns None: the logits are recorded, not replaced
        out.retain_grad()
        captured["logits"] = out

    model.register_forward_hook(keep_logits)
    result = model.loss(torch.tensor([[[int(target)]]]))  # one frame: the target after bos
    logits = captured["logits"][0, 0, 0]
    torch.testing.assert_close(logits.detach(), torch.tensor(u))

    y_hat = torch.softmax(logits.detach().double(), -1)
    for got, want in zip(y_hat.tolist(), p_expected):
        assert abs(got - want) < TOL
    assert abs(float(y_hat[int(target)]) - p_target) < TOL
    assert abs(float(result.loss.detach()) - loss_expected) < TOL
    assert abs(float(result.perplexity()) - ppl_expected) < TOL
    result.loss.backward()
    grad = captured["logits"].grad[0, 0, 0]
    for got, want in zip(grad.tolist(), grad_expected):
        assert abs(got - want) < TOL
    assert abs(float(grad.sum())) < 1e-7 and abs(sum(grad_expected)) < 2e-6


def test_cross_entropy_is_the_expected_nll_under_the_one_hot_target_distribution(doc):
    """theory.md: "a one-hot vector is itself a probability distribution" (non-negative, l1 norm 1, while
    "(0.6, 0.8) has l2 norm 1 but sums to 1.4"), and "H(y, y_hat) = - sum_w y[w] log y_hat[w] =
    E_{w ~ y}[-log y_hat[w]]", which "also equals KL(y || y_hat) plus the entropy of y, which is zero for
    a one-hot target". Compared with the model's loss for every possible target."""
    a, b, total = find(doc, r"`\(NUM, NUM\)` has l2 norm 1 but sums to NUM".replace("NUM", NUM))
    assert abs(math.hypot(a, b) - 1) < 1e-12 and abs(a + b - total) < 1e-12 and total != 1
    u = list(find(doc, r"Logits `u = \(NUM, NUM, NUM\)`".replace("NUM", NUM)))
    model = pinned_model(u)
    y_hat = torch.softmax(torch.tensor(u, dtype=torch.float64), -1)
    for w in range(len(u)):
        y = F.one_hot(torch.tensor(w), len(u)).double()
        assert float(y.abs().sum()) == 1.0 and bool((y >= 0).all())  # an l1-unit, non-negative vector
        expected_nll = -(y * y_hat.log()).sum()  # E_{w ~ y}[-log y_hat[w]]
        kl = F.kl_div(y_hat.log(), y, reduction="sum")
        entropy_y = -(y[y > 0] * y[y > 0].log()).sum()
        assert float(entropy_y) == 0.0
        with torch.no_grad():
            model_loss = float(model.loss(torch.tensor([[[w]]])).loss)
        assert abs(model_loss - float(expected_nll)) < TOL
        assert abs(model_loss - float(kl + entropy_y)) < TOL
        assert abs(model_loss + math.log(float(y_hat[w]))) < TOL


def test_keys_cached_already_rotated_let_a_ring_cache_slide_past_the_context():
    """theory.md: "A key can be rotated once, when it is computed, and cached already rotated: later queries
    at any absolute position give the right relative angle. This is what lets the KV cache become a ring
    buffer that slides past the trained context with no recomputation": one token at a time through a
    ring cache of max_seq_len slots equals a full forward with a sliding window of that width."""
    cfg = LMConfig(n_codebooks=1, codebook_size=5, d_model=8, n_layers=2, n_heads=2, max_seq_len=4,
                   pattern="parallel")
    model = MultiCodebookLM(cfg).double().eval()
    ids = torch.tensor([[[6, 1, 4, 0, 2, 2, 3, 1, 0, 4]]])  # 10 positions, more than max_seq_len = 4
    with torch.no_grad():
        reference = model(ids, window=4)
        cache = model.new_cache(1, ring=True)
        steps = torch.cat([model(ids[..., t:t + 1], cache=cache) for t in range(ids.shape[-1])], dim=2)
    torch.testing.assert_close(steps, reference, rtol=0, atol=1e-10)
    assert cache.length == 10 and cache.keys.shape[3] == 4  # 4 slots held 10 positions


def test_section_3_departures_are_what_the_code_does(doc):
    """theory.md section 3: "Token ids are counted from 0 (0 .. |V|-1) ... each embedding table has extra
    rows for the special ids (pad = |V|, bos = |V| + 1), which the output heads never predict"; "the N_c
    embeddings of a frame are summed into one residual stream vector, and N_c heads read the final stream";
    "RoPE, RMSNorm and SwiGLU ... alongside the original sinusoidal encoding, LayerNorm and ReLU/GELU, all
    selectable in LMConfig"."""
    from codec.core.quantizer import ResidualVectorQuantizer
    from lm.config import FFNS, NORMS, POSITIONS

    assert "(`pad = |V|`, `bos = |V| + 1`)" in doc.replace("\n  ", " ")
    cfg = LMConfig(n_codebooks=2, codebook_size=5, d_model=8, n_layers=1, n_heads=2, max_seq_len=8)
    assert (cfg.pad_id, cfg.bos_id, cfg.embedding_rows) == (5, 6, 7)
    model = MultiCodebookLM(cfg)
    tokens = torch.tensor([[[6, 0, 4], [6, 5, 3]]])  # [B=1, N_c=2, S=3]: bos, codes, a pad
    with torch.no_grad():
        summed = model.embed(tokens)[0]
        expected = torch.stack([model.codebook_table(0)[tokens[0, 0, s]] + model.codebook_table(1)[tokens[0, 1, s]]
                                for s in range(3)])
        torch.testing.assert_close(summed, expected, rtol=0, atol=0)
        assert model(tokens).shape == (1, 2, 3, 5)  # N_c heads of |V| logits: pad and bos never predicted
    rvq = ResidualVectorQuantizer(3, 2, 4).eval()
    first = rvq.codebooks[0, 0].view(1, 3, 1)  # a latent equal to codebook 1's first vector
    assert rvq.encode(first)[0, 0, 0] == 0  # "counted from 0", where seed 002 writes 1
    assert {"rope", "sinusoidal", "learned"} <= set(POSITIONS)
    assert {"rmsnorm", "layernorm"} <= set(NORMS) and {"swiglu", "relu", "gelu"} <= set(FFNS)
