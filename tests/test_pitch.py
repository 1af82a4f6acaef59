"""codec.source_filter.pitch: YIN pitch and voicing."""

import math

import pytest
import torch

from codec.source_filter.pitch import cmnd, yin

SR, HOP = 16000, 160


def tone(f0: float, seconds: float = 1.0, harmonics: int = 6) -> torch.Tensor:
    t = torch.arange(int(SR * seconds)) / SR
    return sum(torch.sin(2 * math.pi * k * f0 * t + k) / k for k in range(1, harmonics + 1))


@pytest.mark.parametrize("f0", [70.0, 123.4, 220.0, 410.0])
def test_yin_finds_the_period_of_a_harmonic_tone_and_calls_it_voiced(f0):
    est, voiced = yin(tone(f0), SR, HOP)
    inner = slice(5, -5)
    assert voiced[inner].all()
    assert torch.allclose(est[inner], torch.full_like(est[inner], f0), rtol=2e-3)


def test_yin_calls_noise_and_silence_unvoiced_and_fills_their_f0():
    noise = torch.randn(SR, generator=torch.Generator().manual_seed(0)) * 0.1
    assert not yin(noise, SR, HOP)[1].any()
    f0, voiced = yin(torch.zeros(SR), SR, HOP)
    assert not voiced.any() and torch.all(f0 == 50.0)  # no voiced frame anywhere: fmin
    # a tone after silence: the silent frames carry the tone's f0 (continuous phase for an oscillator)
    f0, voiced = yin(torch.cat([torch.zeros(SR // 2), tone(200.0)]), SR, HOP)
    assert not voiced[:40].any() and voiced[60:-5].all()
    assert torch.allclose(f0[:40], torch.full((40,), 200.0), rtol=5e-3)


def test_cmnd_is_yins_normalised_difference_computed_directly():
    """d'(0) = 1, d'(tau) = d(tau) tau / sum_{j=1..tau} d(j), d(tau) = sum_{j<W} (x_j - x_{j+tau})^2."""
    x = torch.randn(1, 1, 40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    window, max_lag = 24, 16
    d = torch.stack([((x[0, 0, :window] - x[0, 0, tau: tau + window]) ** 2).sum() for tau in range(max_lag + 1)])
    expected = torch.cat([torch.ones(1, dtype=d.dtype), d[1:] * torch.arange(1, max_lag + 1) / d[1:].cumsum(0)])
    assert torch.allclose(cmnd(x, window, max_lag)[0, 0], expected, atol=1e-9)
