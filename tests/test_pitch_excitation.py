"""codec.pitch (YIN) and codec.excitation (the harmonic source of a source-filter decoder)."""

import math

import pytest
import torch

from codec.excitation import excitation_spectra, harmonic_excitation, to_samples
from codec.pitch import cmnd, yin

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


def test_the_pulse_train_has_unit_power_and_only_harmonics_of_f0_below_nyquist():
    f0 = 150.0
    e = harmonic_excitation(torch.full((1, 101), f0), torch.ones(1, 101), HOP, SR)[0]
    assert e.shape == (100 * HOP,)
    assert abs(e.pow(2).mean().item() - 1.0) < 0.01
    spectrum = torch.fft.rfft(e).abs()                      # 1 s: 1 Hz bins
    k = int(SR / 2 / f0)
    harmonic_bins = torch.arange(1, k + 1) * int(f0)
    assert torch.all(spectrum[harmonic_bins] > 0.4 * spectrum.max())
    others = torch.ones_like(spectrum, dtype=torch.bool)
    others[harmonic_bins] = False
    assert spectrum[others].max() < 1e-3 * spectrum.max()


def test_unvoiced_samples_are_silent_and_the_phase_runs_on_through_them():
    voiced = torch.tensor([[1.0] * 10 + [0.0] * 10 + [1.0] * 11])
    f0 = torch.full((1, 31), 100.0)
    e = harmonic_excitation(f0, voiced, HOP, SR)[0]
    assert torch.all(e[11 * HOP: 19 * HOP] == 0)
    whole = harmonic_excitation(f0, torch.ones(1, 31), HOP, SR)[0]
    assert torch.allclose(e[21 * HOP:], whole[21 * HOP:])  # same oscillator phase as if never stopped


def test_to_samples_interpolates_between_frames_and_excitation_spectra_match_the_stft_frames():
    assert torch.allclose(to_samples(torch.tensor([[0.0, 1.0, 3.0]]), 4)[0],
                          torch.tensor([0, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5]))
    h, n = excitation_spectra(torch.full((2, 50), 120.0), torch.ones(2, 50, dtype=torch.bool), 640, HOP,
                              torch.hann_window(640), SR, generator=torch.Generator().manual_seed(0))
    assert h.shape == n.shape == (2, 321, 50) and h.is_complex()
    with pytest.raises(ValueError, match="two frames"):
        to_samples(torch.ones(1, 1), HOP)
