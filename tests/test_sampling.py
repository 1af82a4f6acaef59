"""Sampling filters on hand-made distributions (seed 001's definitions), then `sample_next`."""

from __future__ import annotations

import math

import pytest
import torch

from lm.sampling import filter_logits, sample_next, top_k_filter, top_p_filter


def logits_of(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()


def kept(filtered: torch.Tensor) -> list[int]:
    return torch.isfinite(filtered).nonzero().flatten().tolist()


# ---- top-k ------------------------------------------------------------------------------------

def test_top_k_keeps_the_k_largest_and_sets_the_rest_to_minus_inf():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0, -1.0])
    out = top_k_filter(logits, 2)
    assert out.shape == logits.shape
    assert kept(out) == [1, 2]
    assert out[1] == 3.0 and out[2] == 2.0  # survivors unchanged
    assert torch.isneginf(out[[0, 3, 4]]).all()


def test_top_k_ties_keep_lower_ids_and_exactly_k_survive():
    out = top_k_filter(torch.tensor([0.0, 1.0, 1.0, 1.0, 0.5]), 2)
    assert kept(out) == [1, 2]


def test_top_k_with_many_ties_matches_a_stable_sort_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 3, (500, 40), generator=g).float()  # ~7 equal values per row
    for k in (1, 5, 13, 39):
        order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
        expected = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, True)
        assert torch.equal(torch.isfinite(top_k_filter(logits, k)), expected)


def test_top_k_matches_the_stable_sort_reference_with_and_without_ties_at_the_cut():
    # Distinct logits take the threshold shortcut; a tie at the k-th value takes the tie-breaking path.
    g = torch.Generator().manual_seed(1)
    distinct = torch.randn(64, 1024, generator=g)
    tied = distinct.clone()
    tied[:, :3] = tied.topk(250, dim=-1).values[:, -1:]  # three more copies of the 250th value
    for logits in (distinct, tied, torch.cat([distinct[:2], tied[:2]])):
        order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :250]
        expected = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, True)
        out = top_k_filter(logits, 250)
        assert torch.equal(torch.isfinite(out), expected)
        assert torch.equal(out[expected], logits[expected])


def test_top_k_is_per_row_in_a_batch():
    logits = torch.tensor([[[5.0, 1.0, 2.0], [0.0, 9.0, 8.0]]])  # [1, 2, 3]
    out = top_k_filter(logits, 1)
    assert out.shape == logits.shape
    assert torch.isfinite(out).nonzero().tolist() == [[0, 0, 0], [0, 1, 1]]


def test_top_k_at_least_vocab_is_a_no_op():
    logits = torch.randn(3, 7)
    assert torch.equal(top_k_filter(logits, 7), logits)
    assert torch.equal(top_k_filter(logits, 100), logits)


@pytest.mark.parametrize("k", [0, -3, 1.5, True])
def test_top_k_rejects_bad_k(k):
    with pytest.raises(ValueError, match="top-k"):
        top_k_filter(torch.randn(5), k)


# ---- top-p ------------------------------------------------------------------------------------

PROBS = [0.5, 0.3, 0.15, 0.05]


@pytest.mark.parametrize(
    "p, expected",
    [
        (0.2, [0]),           # the top token alone already exceeds p
        (0.5, [0]),           # 0.5 >= 0.5: smallest set is {0}
        (0.6, [0, 1]),        # 0.5 < 0.6 <= 0.8
        (0.81, [0, 1, 2]),    # 0.8 < 0.81 <= 0.95
        (0.96, [0, 1, 2, 3]),
        (1.0, [0, 1, 2, 3]),
    ],
)
def test_top_p_keeps_the_smallest_top_set_with_mass_at_least_p(p, expected):
    out = top_p_filter(logits_of(PROBS), p)
    assert kept(out) == expected


def test_top_p_ranks_by_probability_not_by_position():
    # Same distribution, shuffled ids: 0.05, 0.5, 0.15, 0.3
    out = top_p_filter(logits_of([0.05, 0.5, 0.15, 0.3]), 0.6)
    assert kept(out) == [1, 3]


def test_top_p_ties_are_broken_towards_lower_ids():
    out = top_p_filter(logits_of([0.1, 0.3, 0.3, 0.3]), 0.5)
    assert kept(out) == [1, 2]
    out = top_p_filter(logits_of([0.25, 0.25, 0.25, 0.25]), 0.3)
    assert kept(out) == [0, 1]


def test_top_p_set_is_minimal_and_reaches_p_on_random_distributions():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(200, 50, generator=g) * 2.0
    ps = torch.rand(200, generator=g).clamp(0.05, 0.99)
    for row, p in zip(logits, ps.tolist()):
        probs = torch.softmax(row.double(), -1)
        keep = torch.isfinite(top_p_filter(row, p))
        mass = probs[keep].sum().item()
        assert mass >= p - 1e-12
        # Dropping the least probable kept token would fall below p (minimality) ...
        assert mass - probs[keep].min().item() < p
        # ... and every dropped token is no more probable than every kept one.
        if (~keep).any():
            assert probs[~keep].max() <= probs[keep].min()


def test_top_p_is_per_row_and_keeps_shape():
    logits = torch.stack([logits_of(PROBS), logits_of(PROBS[::-1])]).unsqueeze(0)  # [1, 2, 4]
    out = top_p_filter(logits, 0.6)
    assert out.shape == logits.shape
    assert kept(out[0, 0]) == [0, 1] and kept(out[0, 1]) == [2, 3]


@pytest.mark.parametrize("p", [0.0, -0.1, 1.01, float("nan")])
def test_top_p_rejects_p_outside_0_1(p):
    with pytest.raises(ValueError, match="top-p"):
        top_p_filter(torch.randn(5), p)


# ---- composition and temperature --------------------------------------------------------------

def test_top_k_then_top_p_applies_top_p_to_the_renormalised_survivors():
    # top-k=2 leaves {0.4, 0.3} -> renormalised {0.571, 0.429}; top-p=0.5 then keeps only id 0.
    # (top-p first would keep {0, 1}, since 0.4 < 0.5 on the original distribution.)
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    assert kept(filter_logits(logits, 1.0, top_k=2, top_p=0.5)) == [0]
    assert kept(top_p_filter(logits, 0.5)) == [0, 1]


def test_temperature_sharpens_and_flattens():
    logits = logits_of([0.6, 0.3, 0.1])
    cold = torch.softmax(filter_logits(logits, 0.5), -1)
    hot = torch.softmax(filter_logits(logits, 1e4), -1)
    same = torch.softmax(filter_logits(logits, 1.0), -1)
    assert torch.allclose(same, torch.tensor([0.6, 0.3, 0.1]), atol=1e-6)
    # softmax(u / 0.5) = p^2 / sum p^2
    expected = torch.tensor([0.36, 0.09, 0.01]) / 0.46
    assert torch.allclose(cold, expected, atol=1e-6)
    assert torch.allclose(hot, torch.full((3,), 1 / 3), atol=1e-3)


def test_tiny_temperature_gives_a_one_hot_distribution_without_nan():
    logits = torch.tensor([2.0, 2.5, -1.0, 2.4999])
    probs = torch.softmax(filter_logits(logits, 1e-30), -1)
    assert not torch.isnan(probs).any()
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


# ---- sample_next ------------------------------------------------------------------------------

def test_greedy_is_the_argmax_and_ignores_temperature():
    logits = torch.randn(4, 3, 100)
    out = sample_next(logits, temperature=0.0, greedy=True)
    assert out.shape == (4, 3) and out.dtype == torch.int64
    assert torch.equal(out, logits.argmax(-1))


def test_top_k_1_is_greedy_for_any_seed_and_temperature():
    logits = torch.randn(8, 64)
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        out = sample_next(logits, temperature=3.0, top_k=1, generator=g)
        assert torch.equal(out, logits.argmax(-1))


def test_temperature_towards_zero_approaches_greedy():
    logits = torch.randn(16, 32)
    g = torch.Generator().manual_seed(0)
    out = sample_next(logits, temperature=1e-6, generator=g)
    assert torch.equal(out, logits.argmax(-1))


def test_fixed_seed_is_reproducible_and_different_seeds_differ():
    logits = torch.zeros(64, 1000)  # uniform: draws differ across seeds with near certainty
    a = sample_next(logits, generator=torch.Generator().manual_seed(7))
    b = sample_next(logits, generator=torch.Generator().manual_seed(7))
    c = sample_next(logits, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sampling_frequencies_follow_the_filtered_distribution():
    # top-k=3 on [0.4, 0.3, 0.2, 0.1] -> {4/9, 3/9, 2/9, 0}; the 4th token must never appear.
    n = 20000
    logits = logits_of([0.4, 0.3, 0.2, 0.1]).expand(n, 4)
    ids = sample_next(logits, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(ids, minlength=4).double() / n
    expected = torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0], dtype=torch.float64)
    # 5 standard errors of a binomial proportion at n = 20000 is < 0.018.
    assert freq[3] == 0
    assert torch.allclose(freq, expected, atol=5 * math.sqrt(0.25 / n))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=0), "top-k"),
        (dict(top_p=0.0), "top-p"),
        (dict(top_p=1.5), "top-p"),
    ],
)
def test_sample_next_rejects_bad_requests(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_next(torch.randn(2, 5), **kwargs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_infinite_logit_is_refused_in_one_line(bad):
    """A broken model's logits fail loudly instead of giving an arbitrary id (multinomial's old check)."""
    from lm.sampling import draw

    logits = torch.zeros(2, 8)
    logits[1, 3] = bad
    with pytest.raises(ValueError, match="NaN or infinite logits"):
        draw(logits, torch.Generator().manual_seed(0))
