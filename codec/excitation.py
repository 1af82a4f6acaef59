"""The excitation of a source-filter decoder: a band-limited harmonic pulse train that follows f0,
and white noise, both at the sample rate, and their short-time spectra.

    e = harmonic_excitation(f0, voiced, hop, sample_rate)   # f0, voiced [B, n] -> [B, (n - 1) * hop]

f0 (Hz) and voicing are given per frame (frame j at sample j * hop, as `codec.pitch.yin` returns
them) and interpolated linearly to samples. The oscillator's phase is the running sum of the
instantaneous frequency, so every harmonic k advances at k * f0 and stays coherent from frame to
frame; the pulse train is sum_{k=1..K} cos(k phi) with K the harmonics below the Nyquist
frequency, computed in closed form (the Dirichlet kernel) and scaled to unit power per sample.
Unvoiced samples are silent (the noise source fills them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def to_samples(per_frame: Tensor, hop: int) -> Tensor:
    """[B, n] frame values (frame j at sample j * hop) -> [B, (n - 1) * hop] by linear interpolation."""
    x = per_frame.float()
    n = x.shape[-1]
    if n < 2:
        raise ValueError("to_samples needs at least two frames")
    left, right = x[..., :-1, None], x[..., 1:, None]
    w = torch.arange(hop, device=x.device, dtype=x.dtype) / hop
    return (left + (right - left) * w).flatten(-2)


def harmonic_excitation(f0: Tensor, voiced: Tensor, hop: int, sample_rate: int, *,
                        phase0: Tensor | None = None) -> Tensor:
    """f0 [B, n] Hz, voiced [B, n] bool or float in 0..1 -> pulse train [B, (n - 1) * hop] (see module doc).
    phase0 [B]: the oscillator's starting phase (default 0)."""
    f = to_samples(f0.clamp_min(1.0), hop)
    gate = to_samples(voiced.float(), hop)
    phi = 2 * math.pi * torch.cumsum(f / sample_rate, dim=-1)
    if phase0 is not None:
        phi = phi + phase0[:, None]
    phi = torch.remainder(phi, 2 * math.pi)
    k = torch.floor(sample_rate / 2 / f).clamp_min(1.0)             # harmonics below Nyquist
    half = torch.sin(phi / 2)
    near_zero = half.abs() < 1e-4
    dirichlet = torch.sin((k + 0.5) * phi) / (2 * torch.where(near_zero, torch.ones_like(half), half)) - 0.5
    pulses = torch.where(near_zero, k, dirichlet)                   # sum_{1..K} cos(k phi), K at phi = 0
    return gate * pulses / torch.sqrt(k / 2)


def excitation_spectra(f0: Tensor, voiced: Tensor, n_fft: int, hop: int, window: Tensor, sample_rate: int, *,
                       generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Per-frame f0 / voicing [B, n] at the STFT's hop -> (harmonic, noise) complex spectra [B, n_fft/2+1, n],
    frame j centred on sample j * hop (`torch.stft(center=True)`), the same frames as the input's."""
    b, n = f0.shape
    ext_f0 = F.pad(f0[:, None], (0, 1), mode="replicate")[:, 0]     # one frame more: n * hop samples
    ext_v = F.pad(voiced.float()[:, None], (0, 1), mode="replicate")[:, 0]
    harmonic = harmonic_excitation(ext_f0, ext_v, hop, sample_rate)
    noise = torch.randn(harmonic.shape, generator=generator, device=harmonic.device)
    both = torch.stft(torch.cat([harmonic, noise]), n_fft, hop, n_fft, window.to(harmonic.device), center=True,
                      return_complex=True)[..., :n]
    return both[:b], both[b:]
