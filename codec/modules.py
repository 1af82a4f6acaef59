"""Convolutional building blocks and the SEANet encoder / decoder of the codec.

Every convolution pads its input itself so that lengths stay exact multiples of the strides:
an input of `S = T * hop_length` samples becomes exactly `T` latent frames, and `T` frames decode
to exactly `T * hop_length` samples. With `causal=True` all padding goes on the left, so latent
frame `t` depends only on samples `< (t + 1) * hop_length`: encoding a prefix yields the same
first frames as encoding the whole signal, which is what streaming / chunked encoding needs.

The receptive field of the encoder is computed exactly from the layer list
(`SEANetEncoder.frame_span`), so chunked encoders know how much context to carry.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import weight_norm


class PaddedConv1d(nn.Module):
    """Weight-normed `Conv1d` that pads its input so output length = ceil(input length / stride).

    x [B, C_in, S] -> [B, C_out, S / stride] (S a multiple of stride). The total padding is
    `(kernel_size - 1) * dilation + 1 - stride`; causal puts it all on the left, otherwise it is
    split (the extra sample, if any, on the left).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, stride: int = 1,
                 dilation: int = 1, causal: bool = False):
        super().__init__()
        self.conv = weight_norm(nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation))
        self.stride = stride
        self.effective_kernel = (kernel_size - 1) * dilation + 1
        total = max(self.effective_kernel - stride, 0)
        self.pad_left = total if causal else total - total // 2
        self.pad_right = total - self.pad_left

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        # Extra right padding so a length that is not a multiple of the stride still covers every sample.
        extra = (-length) % self.stride
        x = F.pad(x, (self.pad_left, self.pad_right + extra))
        return self.conv(x)

    def span(self) -> list[tuple[int, int, int]]:
        """[(stride, left padding, effective kernel)] of this layer, for receptive-field arithmetic."""
        return [(self.stride, self.pad_left, self.effective_kernel)]


class PaddedConvTranspose1d(nn.Module):
    """Weight-normed `ConvTranspose1d` trimmed so that output length = stride * input length.

    x [B, C_in, T] -> [B, C_out, T * stride]. Causal trims all the overhang on the right.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, stride: int, causal: bool = False):
        super().__init__()
        self.conv = weight_norm(nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride))
        total = kernel_size - stride
        self.trim_right = total if causal else total // 2
        self.trim_left = total - self.trim_right

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., self.trim_left : y.shape[-1] - self.trim_right]


class ResidualUnit(nn.Module):
    """x + Conv1x1(ELU(DilatedConv(ELU(x)))), the SEANet residual unit. [B, C, S] -> [B, C, S]."""

    def __init__(self, channels: int, *, kernel_size: int = 3, dilation: int = 1, compress: int = 2,
                 causal: bool = False):
        super().__init__()
        hidden = max(channels // compress, 1)
        self.dilated = PaddedConv1d(channels, hidden, kernel_size, dilation=dilation, causal=causal)
        self.pointwise = PaddedConv1d(hidden, channels, 1, causal=causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pointwise(F.elu(self.dilated(F.elu(x))))

    def span(self) -> list[tuple[int, int, int]]:
        # The identity path's span lies inside the conv path's, so the convs bound the unit's span.
        return self.dilated.span() + self.pointwise.span()


def frame_span_of(spans: Sequence[tuple[int, int, int]]) -> tuple[int, int]:
    """(lo, hi) of an output frame's input samples for layers [(stride, left padding, kernel)], input first."""
    lo, hi = 0, 0
    for stride, pad_left, kernel in reversed(spans):
        lo, hi = lo * stride - pad_left, hi * stride - pad_left + kernel - 1
    return lo, hi


def _layer_spans(layers: Iterator[nn.Module]) -> list[tuple[int, int, int]]:
    spans = []
    for layer in layers:
        if hasattr(layer, "span"):
            spans.extend(layer.span())
    return spans


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

    @torch.no_grad()
    def grow_from(self, narrower: "SEANetEncoder") -> None:
        """Take a trained encoder with fewer base channels into this wider one, as the same function.

        Every layer of `narrower` holds a leading block of this one's channels: its weights are
        copied there, the weights from the new input channels into the old output channels are
        zero, and the new output channels keep their fresh initialisation. The old channels then
        compute exactly what they did, the final conv reads only them, so z [B, latent_dim, T] is
        unchanged at step 0 (up to float summation order), while the new channels get gradients
        and can learn what the narrow encoder had no room for. Weight norm (g * v / |v|, a norm
        per output channel) is unaffected: the zeros add nothing to an old channel's |v|.
        """
        mine, theirs = self.state_dict(), narrower.state_dict()
        if set(mine) != set(theirs):
            raise ValueError("grow_from needs an encoder of the same layers (strides, dilations, residual units); "
                             f"tensors differ: {sorted(set(mine) ^ set(theirs))[:4]}")
        for name, old in theirs.items():
            new = mine[name]
            if (new.dim() != old.dim() or any(n < o for n, o in zip(new.shape, old.shape))
                    or (new.dim() == 3 and new.shape[2] != old.shape[2])):
                raise ValueError(f"grow_from: {name} is {tuple(old.shape)} in the narrower encoder, "
                                 f"which does not fit in this one's {tuple(new.shape)}")
            new[tuple(slice(0, n) for n in old.shape)] = old
            if name.endswith("weight.original1"):  # v [out, in, k]: old outputs ignore the new inputs
                new[: old.shape[0], old.shape[1]:] = 0

    def frame_span(self) -> tuple[int, int]:
        """(lo, hi) such that latent frame t depends exactly on samples t * hop + lo ... t * hop + hi.

        lo <= 0 is minus the past context, hi - (hop - 1) the look-ahead (0 when causal); the
        receptive field is hi - lo + 1 samples. Padding at the signal edges is zeros.
        """
        return frame_span_of(_layer_spans(self.layers))


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
        self.hop_length = math.prod(strides)
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
