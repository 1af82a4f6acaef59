"""Fundamental frequency and voicing of speech, frame by frame: YIN (de Cheveigne & Kawahara 2002)
in torch, batched, with no Python loop over frames.

    f0, voiced = yin(wav, sample_rate, hop)   # wav [B, S] -> f0 [B, n] Hz, voiced [B, n] bool

Frame j is centred on sample j * hop (as `torch.stft(center=True)`), n = S // hop + 1. Per frame:
the difference function d(tau) = sum_j (x_j - x_{j+tau})^2 over a window of `window` samples
(autocorrelation by FFT, energies by cumulative sums), its cumulative mean normalised form d'
(d'(0) = 1), the first tau in the search range where d' dips under `threshold` followed down to its
local minimum (the global minimum when none dips), refined by a parabola through its neighbours.
A frame is voiced when d' there is under `voicing_threshold` and the frame is not silent; unvoiced
frames carry the f0 of the nearest voiced frame (or `fmin` when none is), so an oscillator that
follows f0 keeps a continuous phase through them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _frames(wav: Tensor, hop: int, length: int) -> Tensor:
    """wav [B, S] -> frames [B, S // hop + 1, length], frame j starting at j * hop - length // 2 (zero padded)."""
    padded = F.pad(wav, (length // 2, length - length // 2))
    return padded.unfold(-1, length, hop)[:, : wav.shape[-1] // hop + 1]


def cmnd(frames: Tensor, window: int, max_lag: int) -> Tensor:
    """YIN's cumulative mean normalised difference d'(tau), tau = 0..max_lag.
    frames [B, n, window + max_lag] -> [B, n, max_lag + 1]."""
    size = 1 << (window + frames.shape[-1] - 1).bit_length()
    spectrum = torch.fft.rfft(frames, size)
    head = torch.fft.rfft(frames[..., :window], size)
    corr = torch.fft.irfft(spectrum * head.conj(), size)[..., : max_lag + 1]  # r(tau) = sum_j x_j x_{j+tau}
    squares = F.pad(frames.pow(2).cumsum(-1), (1, 0))
    energy_0 = squares[..., window: window + 1]
    energy_tau = squares[..., window: window + max_lag + 1] - squares[..., : max_lag + 1]
    diff = (energy_0 + energy_tau - 2 * corr).clamp_min(0.0)
    lags = torch.arange(max_lag + 1, device=frames.device, dtype=frames.dtype)
    running = diff[..., 1:].cumsum(-1) / lags[1:]
    out = torch.ones_like(diff)
    out[..., 1:] = diff[..., 1:] / running.clamp_min(1e-12)
    return out


def _fill_unvoiced(f0: Tensor, voiced: Tensor, fmin: float) -> Tensor:
    """Unvoiced frames take the f0 of the nearest voiced frame before them, else after, else fmin."""
    n = f0.shape[-1]
    idx = torch.arange(n, device=f0.device).expand_as(f0)
    last = torch.where(voiced, idx, -1).cummax(-1).values                          # last voiced at or before
    nxt = torch.where(voiced, idx, n).flip(-1).cummin(-1).values.flip(-1)          # next voiced at or after
    source = torch.where(last >= 0, last, nxt)
    filled = f0.gather(-1, source.clamp(0, n - 1))
    return torch.where(source < n, filled, torch.full_like(f0, fmin))


def yin(wav: Tensor, sample_rate: int, hop: int, *, fmin: float = 50.0, fmax: float = 500.0,
        window: int | None = None, threshold: float = 0.15, voicing_threshold: float = 0.25,
        silence_db: float = -55.0) -> tuple[Tensor, Tensor]:
    """wav [B, S] (or [S]) -> (f0 [B, n] in Hz, voiced [B, n] bool), n = S // hop + 1 (see module doc).
    window defaults to 50 ms (on speech it agrees with pYIN's 64 ms frames best; docs/experiments.md)."""
    if wav.dim() == 1:
        f0, voiced = yin(wav[None], sample_rate, hop, fmin=fmin, fmax=fmax, window=window, threshold=threshold,
                         voicing_threshold=voicing_threshold, silence_db=silence_db)
        return f0[0], voiced[0]
    if not 0 < fmin < fmax < sample_rate / 2:
        raise ValueError(f"need 0 < fmin < fmax < sample_rate / 2, got fmin {fmin}, fmax {fmax}")
    wav = wav.float()
    min_lag, max_lag = max(2, int(sample_rate / fmax)), int(sample_rate / fmin) + 1
    window = window or int(0.05 * sample_rate)
    frames = _frames(wav, hop, window + max_lag)
    d = cmnd(frames, window, max_lag)                                 # [B, n, max_lag + 1]
    search = d[..., min_lag: max_lag]                                 # tau = min_lag .. max_lag - 1
    falling_next = F.pad(search[..., 1:] >= search[..., :-1], (0, 1), value=True)  # d'(tau+1) >= d'(tau)
    dip = (search < threshold) & falling_next                         # first local minimum under the threshold
    has_dip = dip.any(-1)
    best = torch.where(has_dip, dip.float().argmax(-1), search.argmin(-1))
    value = search.gather(-1, best[..., None])[..., 0]
    # parabolic refinement through the neighbours (clamped at the range's ends)
    left = search.gather(-1, (best - 1).clamp_min(0)[..., None])[..., 0]
    right = search.gather(-1, (best + 1).clamp_max(search.shape[-1] - 1)[..., None])[..., 0]
    curve = left + right - 2 * value
    shift = torch.where(curve > 1e-9, 0.5 * (left - right) / curve.clamp_min(1e-9), torch.zeros_like(curve))
    period = (best + min_lag).float() + shift.clamp(-1, 1)
    f0 = sample_rate / period
    rms_db = 10 * torch.log10(frames[..., :window].pow(2).mean(-1) + 1e-12)
    voiced = (value < voicing_threshold) & (rms_db > silence_db) & (f0 >= fmin) & (f0 <= fmax)
    return _fill_unvoiced(f0, voiced, fmin), voiced
