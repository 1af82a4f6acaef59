"""The codec's building blocks: padded convolutions, the SEANet residual unit, ConvNeXt blocks.

Every convolution pads its input itself so that lengths stay exact multiples of the strides:
an input of `S = T * hop_length` samples becomes exactly `T` latent frames, and `T` frames decode
to exactly `T * hop_length` samples. With `causal=True` all padding goes on the left, so latent
frame `t` depends only on samples `< (t + 1) * hop_length`: encoding a prefix yields the same
first frames as encoding the whole signal, which is what streaming / chunked encoding needs.

`frame_span_of` computes a stack's receptive field exactly from its layers, so chunked encoders
know how much context to carry.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from einops import rearrange
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


def layer_spans(layers: Iterator[nn.Module]) -> list[tuple[int, int, int]]:
    spans = []
    for layer in layers:
        if hasattr(layer, "span"):
            spans.extend(layer.span())
    return spans


def conv_padding(kernel_size: int, causal: bool) -> tuple[int, int]:
    """(left, right) padding that keeps a stride-1 convolution's length: all on the left when causal."""
    return (kernel_size - 1, 0) if causal else ((kernel_size - 1) // 2, kernel_size // 2)


class ConvNeXtBlock(nn.Module):
    """x + gamma * Linear(GELU(Linear(LayerNorm(DepthwiseConv(x))))). [B, D, T] -> [B, D, T].

    The depthwise convolution (kernel 7) pads on the left only when causal. gamma is a learned
    per-channel layer scale, started small so that the stack begins close to the identity.
    """

    def __init__(self, dim: int, hidden: int, *, kernel_size: int = 7, causal: bool = False,
                 layer_scale: float = 1e-1):
        super().__init__()
        self.pad = conv_padding(kernel_size, causal)
        self.dwconv = nn.Conv1d(dim, dim, kernel_size, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(F.pad(x, self.pad))
        h = rearrange(h, "b d t -> b t d")
        h = self.gamma * self.down(F.gelu(self.up(self.norm(h))))
        return x + rearrange(h, "b t d -> b d t")


def convnext_blocks(dim: int, n_layers: int, hidden: int | None = None, *, kernel_size: int = 7,
                    causal: bool = False) -> nn.ModuleList:
    """n_layers ConvNeXt blocks of width dim (MLP width `hidden`, default 3 * dim), layer scale 1 / n_layers."""
    return nn.ModuleList(
        ConvNeXtBlock(dim, hidden or 3 * dim, kernel_size=kernel_size, causal=causal, layer_scale=1.0 / n_layers)
        for _ in range(n_layers))
