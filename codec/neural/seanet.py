"""The SEANet encoder and decoder parts (SoundStream / EnCodec): strided convolutions and residual
units, at the sample rate and every rate down to the frame rate.

    encoder: {kind: seanet, channels: 8, full_rate_residuals: false, dilations: [1, 3, 9], ...}
    decoder: {kind: seanet, channels: 32, dilations: [1, 3, 9], ...}

Every convolution pads its input itself (codec.core.modules), so `T * hop` samples make `T` frames and
back; with a causal codec all padding is on the left and both stream (`streaming_step`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from codec.core.config import positive_ints
from codec.core.modules import PaddedConv1d, PaddedConvTranspose1d, ResidualUnit, frame_span_of, layer_spans
from codec.core.parts import register_part
from codec.core.streaming_layers import Chain, seanet_steps


@dataclass(frozen=True)
class SEANetConfig:
    """The layers of a SEANet encoder or decoder: base width, residual-unit dilations, kernels."""

    channels: int = 8  # base width (the encoder doubles it per stride; the decoder halves it)
    dilations: tuple[int, ...] = (1, 3, 9)  # of each residual unit's convolutions
    kernel_size: int = 7  # first-layer kernel
    residual_kernel_size: int = 3  # residual-unit kernel
    last_kernel_size: int = 7  # last-layer kernel
    compress: int = 2  # residual-unit bottleneck factor

    def __post_init__(self) -> None:
        object.__setattr__(self, "dilations", tuple(int(d) for d in self.dilations))
        positive_ints(type(self).__name__, channels=self.channels, kernel_size=self.kernel_size, compress=self.compress,
                      residual_kernel_size=self.residual_kernel_size, last_kernel_size=self.last_kernel_size)
        if any(d < 1 for d in self.dilations):
            raise ValueError(f"{type(self).__name__}.dilations must be positive integers, got {self.dilations}")

    def layers(self, codec) -> dict:
        """The keyword arguments of SEANetEncoder / SEANetDecoder in a codec of config `codec`."""
        return dict(channels=codec.channels, latent_dim=codec.latent_dim, strides=codec.strides,
                    base_channels=self.channels, dilations=self.dilations, kernel_size=self.kernel_size,
                    residual_kernel_size=self.residual_kernel_size, last_kernel_size=self.last_kernel_size,
                    compress=self.compress, causal=codec.causal)


@dataclass(frozen=True)
class SEANetEncoderConfig(SEANetConfig):
    """A SEANet encoder (8 base channels: tokenizing runs >= 100x real time on 2 cores)."""

    full_rate_residuals: bool = False  # residual units at the full sample rate (half the encoder's time)


@dataclass(frozen=True)
class SEANetDecoderConfig(SEANetConfig):
    """A SEANet decoder."""

    channels: int = 32


@register_part("encoder", "seanet", SEANetEncoderConfig)
class SEANetEncoder(nn.Module):
    """Waveform -> latent frames. wav [B, channels, S] -> z [B, latent_dim, S / hop_length].

    conv(k=7) to `base_channels`, then per stride s: residual units (dilations 1, 3, 9), ELU and a
    strided conv (kernel 2s) that doubles the channels; ELU and a final conv to `latent_dim`.
    full_rate_residuals=False leaves out the residual units of the first level (at the full sample rate).
    """

    def __init__(self, channels: int = 1, latent_dim: int = 128, base_channels: int = 16,
                 strides: Sequence[int] = (2, 4, 5, 8), dilations: Sequence[int] = (1, 3, 9), *,
                 kernel_size: int = 7, residual_kernel_size: int = 3, last_kernel_size: int = 7,
                 compress: int = 2, causal: bool = False, full_rate_residuals: bool = True):
        super().__init__()
        self.hop_length = math.prod(strides)
        layers: list[nn.Module] = [PaddedConv1d(channels, base_channels, kernel_size, causal=causal)]
        width = base_channels
        for level, stride in enumerate(strides):
            for d in dilations if (level > 0 or full_rate_residuals) else ():
                layers.append(ResidualUnit(width, kernel_size=residual_kernel_size, dilation=d, compress=compress,
                                           causal=causal))
            layers += [nn.ELU(), PaddedConv1d(width, width * 2, 2 * stride, stride=stride, causal=causal)]
            width *= 2
        layers += [nn.ELU(), PaddedConv1d(width, latent_dim, last_kernel_size, causal=causal)]
        self.layers = nn.Sequential(*layers)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        return self.layers(wav)

    @classmethod
    def from_config(cls, config: SEANetEncoderConfig, codec) -> "SEANetEncoder":
        return cls(full_rate_residuals=config.full_rate_residuals, **config.layers(codec))

    def streaming_step(self) -> Chain:
        """wav chunks [B, C, n] -> the latent frames they complete (codec.core.streaming_layers)."""
        return seanet_steps(self.layers)

    def frame_span(self) -> tuple[int, int]:
        """(lo, hi) such that latent frame t depends exactly on samples t * hop + lo ... t * hop + hi.

        lo <= 0 is minus the past context, hi - (hop - 1) the look-ahead (0 when causal); the
        receptive field is hi - lo + 1 samples. Padding at the signal edges is zeros.
        """
        return frame_span_of(layer_spans(self.layers))


@register_part("decoder", "seanet", SEANetDecoderConfig)
class SEANetDecoder(nn.Module):
    """Latent frames -> waveform. z [B, latent_dim, T] -> wav [B, channels, T * hop_length].

    Mirror of the encoder: conv(k=7) to `base_channels * 2**len(strides)`, then per stride (in
    reverse order) ELU, a transposed conv (kernel 2s) that halves the channels, residual units;
    ELU and a final conv to `channels`. No output non-linearity.
    """

    def __init__(self, channels: int = 1, latent_dim: int = 128, base_channels: int = 32,
                 strides: Sequence[int] = (2, 4, 5, 8), dilations: Sequence[int] = (1, 3, 9), *,
                 kernel_size: int = 7, residual_kernel_size: int = 3, last_kernel_size: int = 7,
                 compress: int = 2, causal: bool = False):
        super().__init__()
        self.hop_length, self.channels = math.prod(strides), channels
        width = base_channels * 2 ** len(strides)
        layers: list[nn.Module] = [PaddedConv1d(latent_dim, width, kernel_size, causal=causal)]
        for stride in reversed(strides):
            layers += [nn.ELU(), PaddedConvTranspose1d(width, width // 2, 2 * stride, stride=stride, causal=causal)]
            width //= 2
            for d in dilations:
                layers.append(ResidualUnit(width, kernel_size=residual_kernel_size, dilation=d, compress=compress,
                                           causal=causal))
        layers += [nn.ELU(), PaddedConv1d(width, channels, last_kernel_size, causal=causal)]
        self.layers = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.layers(z)

    @classmethod
    def from_config(cls, config: SEANetDecoderConfig, codec) -> "SEANetDecoder":
        return cls(**config.layers(codec))

    def streaming_step(self, exact: bool = False) -> "SEANetDecoderStream":
        return SEANetDecoderStream(seanet_steps(self.layers, exact), self.channels)


class SEANetDecoderStream:
    """The SEANet decoder over chunks of frames: each frame's audio is final at once (no look-ahead)."""

    lookahead_samples = 0

    def __init__(self, chain: Chain, channels: int):
        self.chain, self.channels = chain, channels

    def step(self, z: torch.Tensor) -> torch.Tensor:
        return self.chain.step(z)

    def flush(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, self.channels, 0)
