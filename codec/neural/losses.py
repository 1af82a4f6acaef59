"""Reconstruction losses and quality metrics of the codec.

* `MultiScaleMelLoss`: L1 between log-mel spectrograms (torchaudio `MelSpectrogram`) at several
  FFT sizes. The number of mel bands at each size is fitted so that no triangular filter falls
  between two FFT bins (an empty filter would give a constant, useless band). Its `terms` also
  gives a loudness-scale distance on the same spectrograms (mel magnitudes to the power 0.3).
* `waveform_l1`: mean absolute sample error.
* `si_sdr`: scale-invariant signal-to-distortion ratio in dB, per example.
* `mel_distance`: the multi-scale log-mel L1 as a metric (no gradient needed), reusable to compare
  codecs (ours, Opus, ...) at the same bitrate.
"""

from __future__ import annotations

import functools
import warnings
from typing import Sequence

import torch
import torchaudio
from torch import nn
from torch.nn import functional as F


def fit_n_mels(sample_rate: int, n_fft: int, max_mels: int, f_min: float = 0.0) -> int:
    """Largest n_mels <= max_mels for which every mel filter covers at least one FFT bin."""
    for n_mels in range(max_mels, 0, -1):
        with warnings.catch_warnings():  # torchaudio warns about the empty filters we are probing for
            warnings.simplefilter("ignore")
            fb = torchaudio.functional.melscale_fbanks(n_fft // 2 + 1, f_min, sample_rate / 2, n_mels, sample_rate,
                                                       norm=None, mel_scale="htk")
        if bool((fb.max(dim=0).values > 0).all()):
            return n_mels
    raise ValueError(f"no mel filterbank fits n_fft={n_fft} at {sample_rate} Hz")


class MultiScaleMelLoss(nn.Module):
    """Mean over scales of L1(log10(mel(x_hat) + eps), log10(mel(x) + eps)).

    x_hat, x: [B, C, S] -> scalar (reduction="mean") or [B] (reduction="none").
    Scale i uses n_fft = n_ffts[i], hop n_fft // 4, a Hann window, and up to `max_mels` bands (one
    number for every scale, or one per scale: more bands at the larger FFT sizes resolve pitch
    harmonics, as DAC's 5..320 bands do).

    `terms` also gives, from the same spectrograms, a loudness-scale distance: per scale
    sum |M_hat^p - M^p| / sum M^p over the example's bins (M the mel magnitudes, p =
    `loudness_exponent`): it weighs bins by how loud they are and, being a ratio, does not depend
    on the recording's level (why: docs/experiments.md).
    """

    def __init__(self, sample_rate: int, n_ffts: Sequence[int] = (256, 512, 1024, 2048),
                 max_mels: int | Sequence[int] = 80, eps: float = 1e-5, loudness_exponent: float = 0.3):
        super().__init__()
        self.eps, self.loudness_exponent = eps, loudness_exponent
        per_scale = [max_mels] * len(n_ffts) if isinstance(max_mels, int) else list(max_mels)
        if len(per_scale) != len(n_ffts):
            raise ValueError(f"max_mels has {len(per_scale)} entries for {len(n_ffts)} FFT sizes")
        self.n_mels = [fit_n_mels(sample_rate, n, m) for n, m in zip(n_ffts, per_scale)]
        self.mels = nn.ModuleList(
            torchaudio.transforms.MelSpectrogram(sample_rate, n_fft=n, hop_length=n // 4, n_mels=m, power=1.0,
                                                 center=True, pad_mode="reflect", mel_scale="htk")
            for n, m in zip(n_ffts, self.n_mels))

    def forward(self, x_hat: torch.Tensor, x: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return self.terms(x_hat, x, reduction, loudness=False)[0]

    def terms(self, x_hat: torch.Tensor, x: torch.Tensor, reduction: str = "mean",
              loudness: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-mel L1, loudness-scale distance or None), each a scalar or [B] per `reduction`."""
        if x_hat.shape != x.shape:
            raise ValueError(f"shapes differ: {tuple(x_hat.shape)} vs {tuple(x.shape)}")
        b = x.shape[0]
        x_hat, x = x_hat.reshape(-1, x.shape[-1]), x.reshape(-1, x.shape[-1])  # [B*C, S]
        log_l1, loud = [], []
        for mel in self.mels:
            m_hat, m = mel(x_hat), mel(x)  # [B*C, n_mels, frames]
            diff = (torch.log10(m_hat + self.eps) - torch.log10(m + self.eps)).abs()
            log_l1.append(diff.reshape(b, -1).mean(dim=1))
            if loudness:
                p = self.loudness_exponent
                m_hat_p, m_p = m_hat.clamp(min=self.eps).pow(p), m.clamp(min=self.eps).pow(p)
                loud.append((m_hat_p - m_p).abs().reshape(b, -1).sum(dim=1) / m_p.reshape(b, -1).sum(dim=1))
        per_example = torch.stack(log_l1).mean(dim=0)  # [B]
        loud_per_example = torch.stack(loud).mean(dim=0) if loudness else None
        if reduction == "mean":
            return per_example.mean(), (loud_per_example.mean() if loudness else None)
        return per_example, loud_per_example


def waveform_l1(x_hat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return F.l1_loss(x_hat, x)


def si_sdr(estimate: torch.Tensor, reference: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Scale-invariant SDR in dB. [B, C, S] (or [B, S]) -> [B]; channels are concatenated.

    Both signals are made zero-mean; the reference is scaled by the optimal alpha = <e, r> / |r|^2,
    and SI-SDR = 10 log10(|alpha r|^2 / |alpha r - e|^2).
    """
    if estimate.shape != reference.shape:
        raise ValueError(f"shapes differ: {tuple(estimate.shape)} vs {tuple(reference.shape)}")
    e = estimate.reshape(estimate.shape[0], -1).double()
    r = reference.reshape(reference.shape[0], -1).double()
    e, r = e - e.mean(dim=1, keepdim=True), r - r.mean(dim=1, keepdim=True)
    alpha = (e * r).sum(dim=1, keepdim=True) / (r.pow(2).sum(dim=1, keepdim=True) + eps)
    target = alpha * r
    ratio = target.pow(2).sum(dim=1) / ((target - e).pow(2).sum(dim=1) + eps)
    return (10 * torch.log10(ratio + eps)).float()


@functools.lru_cache(maxsize=8)
def _metric_mel(sample_rate: int) -> MultiScaleMelLoss:
    return MultiScaleMelLoss(sample_rate).eval()


@torch.no_grad()
def mel_distance(estimate: torch.Tensor, reference: torch.Tensor, sample_rate: int) -> torch.Tensor:
    """Multi-scale log-mel L1 per example (lower is better). [B, C, S] -> [B]."""
    if estimate.dim() == 2:
        estimate, reference = estimate.unsqueeze(1), reference.unsqueeze(1)
    mel = _metric_mel(sample_rate).to(estimate.device)
    return mel(estimate.float(), reference.float(), reduction="none")
