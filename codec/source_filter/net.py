"""The source-filter encoder's network: per 20 ms frame of 16 kHz mono audio, the F0 class (WORLD's
Harvest as the target) and the coded aperiodicity (D4C's, one band, dB / 10).

    f0_logits, ap = SourceFilterNet()(wav)   # wav [B, 1, S] -> [B, 1 + F0_BINS, T], [B, 1, T]; T = ceil(S / 320)

Frame t is centred on sample t * 320. Classes: 0 unvoiced, 1..F0_BINS log-spaced over F0_MIN..F0_MAX
Hz (`f0_to_class`, `class_to_f0`). Causal: frame t sees nothing from sample (t + 1) * 320 on
(`frame_span`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codec.core.streaming_layers import elementwise

F0_MIN, F0_MAX, F0_BINS = 50.0, 550.0, 256

HOP = 320
N_FFT = 1024
LEFT_PAD = N_FFT - HOP  # 704
SHORT_FFT = 512  # the envelope's window, centred on the frame: samples [t*320 - 256, t*320 + 256)

_LOG_MIN = math.log(F0_MIN)
_LOG_SPAN = math.log(F0_MAX) - math.log(F0_MIN)


def f0_to_continuous_class(f0: Tensor) -> Tensor:
    """Unrounded class position of voiced f0 (1.0 .. F0_BINS); not meaningful where f0 <= 0."""
    f0 = torch.as_tensor(f0, dtype=torch.float32)
    pos = (torch.log(f0.clamp(F0_MIN, F0_MAX)) - _LOG_MIN) / _LOG_SPAN * (F0_BINS - 1)
    return 1.0 + pos


def f0_to_class(f0: Tensor) -> Tensor:
    """f0 in Hz (0 = unvoiced) -> LongTensor class: 0 unvoiced, else 1 + round(log-position * (F0_BINS - 1))."""
    f0 = torch.as_tensor(f0, dtype=torch.float32)
    voiced = f0 > 0
    cls = torch.round(f0_to_continuous_class(torch.where(voiced, f0, torch.full_like(f0, F0_MIN)))).long()
    return torch.where(voiced, cls, torch.zeros_like(cls))


def class_to_f0(c) -> Tensor:
    """Inverse of `f0_to_class` (accepts fractional classes too); class 0 (or below 1) -> 0.0 Hz."""
    c = torch.as_tensor(c, dtype=torch.float32)
    f0 = torch.exp(_LOG_MIN + (c - 1.0) / (F0_BINS - 1) * _LOG_SPAN)
    return torch.where(c >= 1.0 - 1e-6, f0, torch.zeros_like(f0))


class _CausalBlock(nn.Module):
    """Pre-norm residual block: LayerNorm -> causal Conv1d(kernel) -> GELU -> 1x1 Conv1d, added back."""

    def __init__(self, width: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.norm = nn.LayerNorm(width)
        self.conv = nn.Conv1d(width, width, kernel)
        self.proj = nn.Conv1d(width, width, 1)

    def forward(self, x: Tensor) -> Tensor:  # x [B, C, T]
        h = self.norm(x.transpose(1, 2)).transpose(1, 2)
        h = F.pad(h, (self.kernel - 1, 0))
        return x + self.project(F.gelu(self.conv(h)))

    def project(self, h: Tensor) -> Tensor:
        """The 1x1 convolution as a matmul with frames by rows: a long signal's 1x1 Conv1d multiplies with
        frames along columns, which BLAS rounds by how many there are, so a stream's few frames could not
        follow it (codec.source_filter.parts.SourceFilterEncoderStream); rows of 16 and more round alike."""
        return F.linear(h.transpose(1, 2), self.proj.weight[:, :, 0], self.proj.bias).transpose(1, 2)


class SourceFilterNet(nn.Module):
    """wav [B, 1, S] -> (F0 logits [B, 1 + F0_BINS, T], aperiodicity [B, 1, T]): two log-magnitude
    spectra a frame (a 1024-point window ending with the frame, a 512-point one centred on it), a linear
    layer, causal residual blocks over frames and two heads."""

    def __init__(self, width: int = 256, layers: int = 4, kernel: int = 3):
        super().__init__()
        self.width, self.layers, self.kernel = width, layers, kernel
        self.register_buffer("window", torch.hann_window(N_FFT), persistent=False)
        self.register_buffer("short_window", torch.hann_window(SHORT_FFT), persistent=False)
        self.inp = nn.Linear(N_FFT // 2 + 1 + SHORT_FFT // 2 + 1, width)
        self.blocks = nn.ModuleList(_CausalBlock(width, kernel) for _ in range(layers))
        self.out_norm = nn.LayerNorm(width)
        self.f0_head = nn.Linear(width, 1 + F0_BINS)
        self.ap_head = nn.Linear(width, 1)

    def frame_span(self) -> tuple[int, int]:
        """Sample span [t*320 + lo, t*320 + hi] (inclusive) that output frame t depends on."""
        return -LEFT_PAD - self.layers * (self.kernel - 1) * HOP, HOP - 1

    @torch.no_grad()
    def init_ap_bias(self, mean: float) -> None:
        """Start the aperiodicity head at the training mean of its target."""
        self.ap_head.bias.fill_(float(mean))

    def features(self, wav: Tensor, exact: bool = False) -> Tensor:
        """wav [B, 1, S] -> log-magnitude spectra [B, T, 513 + 257], T = ceil(S / 320). `exact`: every value
        through the SIMD loop, as a long signal's (codec.core.streaming_layers.elementwise; a stream's few frames)."""
        x = wav.reshape(wav.shape[0], -1)
        s = x.shape[-1]
        t = -(-s // HOP)
        x = F.pad(x, (LEFT_PAD, t * HOP - s))
        long = torch.stft(x, N_FFT, hop_length=HOP, window=self.window.to(x.dtype), center=False,
                          return_complex=True)  # [B, 513, T]: samples [t*320 - 704, t*320 + 320)
        short = torch.stft(x[:, LEFT_PAD - SHORT_FFT // 2:][:, : (t - 1) * HOP + SHORT_FFT], SHORT_FFT,
                           hop_length=HOP, window=self.short_window.to(x.dtype), center=False,
                           return_complex=True)  # [B, 257, T]: samples [t*320 - 256, t*320 + 256)
        spectra = torch.cat([long, short], 1)
        return elementwise(lambda s: torch.log(s.abs() + 1e-4), spectra, exact).transpose(1, 2)

    def forward(self, wav: Tensor) -> tuple[Tensor, Tensor]:
        h = self.inp(self.features(wav)).transpose(1, 2)  # [B, width, T]
        for block in self.blocks:
            h = block(h)
        h = self.out_norm(h.transpose(1, 2))  # [B, T, width]
        return self.f0_head(h).transpose(1, 2), self.ap_head(h).transpose(1, 2)
