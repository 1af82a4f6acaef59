"""Stateful, chunk-by-chunk versions of the codec's causal layers (the streaming codec's parts).

Each step object takes the next chunk of its input, [B, C, n] along time with any n >= 0, and
returns the outputs that chunk completes, as the layer would compute them on the whole signal.
A convolution keeps its last `effective kernel - stride` inputs as left context (zeros at the
start: the causal padding), like EnCodec's and Mimi's streaming convolutions; a transposed
convolution keeps the overhang of its last outputs, to which the next chunk adds. Weights are
taken once when a step is built (weight norm computed then), so a step is a snapshot of its layer.

Only causal layers stream: all their padding is on the left, so no output waits for later input.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from einops import rearrange
from torch import nn
from torch.nn import functional as F

from codec.core.modules import ConvNeXtBlock, PaddedConv1d, PaddedConvTranspose1d, ResidualUnit


# PyTorch computes the last (numel mod 2 x SIMD width) elements of an elementwise op with scalar
# code, which rounds exp, erf, sqrt and pow unlike its SIMD code, and BLAS multiplies fewer than
# 16 rows with another kernel than many: a chunk is padded so that its values take a long
# signal's paths (the SIMD loop, the many-row kernel) and come out as the whole file's, bit for bit.
SIMD_TAIL = 64  # elements of padding: more than 2 x the widest SIMD vector of floats (AVX-512: 16)
MIN_ROWS = 16  # rows from which a matmul rounds as a long signal's


def elementwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, exact: bool = True) -> torch.Tensor:
    """fn (elementwise) of x; `exact`: every element through the SIMD loop (see SIMD_TAIL)."""
    if not exact:
        return fn(x)
    return fn(F.pad(x.reshape(-1), (0, SIMD_TAIL)))[: x.numel()].reshape(x.shape)


def padding_frames(batch: int, n: int, width: int) -> int:
    """Zero frames to append to n frames of `batch` signals, `width` values per frame and signal in
    the last row, so that matmuls see >= MIN_ROWS rows and no value is in a SIMD tail."""
    return max(-(-MIN_ROWS // batch) - n, -(-SIMD_TAIL // width), 1)


def framewise(fn: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, exact: bool = True) -> torch.Tensor:
    """fn over the frames of h [B, n, D] (norms, linears, activations; no mixing of frames) -> [B, n, D'];
    `exact`: computed with zero frames appended (`padding_frames`)."""
    if not exact:
        return fn(h)
    b, n, d = h.shape
    return fn(F.pad(h, (0, 0, 0, padding_frames(b, n, d))))[:, :n]


class Step:
    """One streaming layer: `step(x)` maps the next input chunk to the outputs it completes."""

    def step(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class ConvStep(Step):
    """A causal Conv1d over chunks: x [B, C_in, n] -> [B, C_out, m], m the windows that close in x.

    After n inputs in all it has given floor((n + pad_left - kernel) / stride) + 1 outputs (the
    offline layer's count for a whole signal); `pad_left` zeros start the context.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, stride: int = 1, dilation: int = 1,
                 groups: int = 1, pad_left: int, exact: bool = True):
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.kernel = (weight.shape[-1] - 1) * dilation + 1
        if self.kernel < stride:
            raise ValueError(f"a streaming convolution needs kernel >= stride, got {self.kernel} < {stride}")
        self.pad_left, self.exact = pad_left, exact
        self.context: torch.Tensor | None = None
        self._backends: dict[tuple, str] = {}

    @classmethod
    def of(cls, layer: PaddedConv1d, exact: bool = True) -> "ConvStep":
        if layer.pad_right:
            raise ValueError("streaming needs a causal convolution (all padding on the left)")
        conv = layer.conv
        return cls(conv.weight, conv.bias, stride=conv.stride[0], dilation=conv.dilation[0], groups=conv.groups,
                   pad_left=layer.pad_left, exact=exact)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        if self.context is None:
            self.context = x.new_zeros(*x.shape[:-1], self.pad_left)
        x = torch.cat([self.context, x], dim=-1)
        n_out = (x.shape[-1] - self.kernel) // self.stride + 1 if x.shape[-1] >= self.kernel else 0
        self.context = x[..., n_out * self.stride:]
        if n_out == 0:
            return x.new_zeros(x.shape[0], self.weight.shape[0], 0)
        return self._conv(x[..., : (n_out - 1) * self.stride + self.kernel], n_out)

    def _conv(self, x: torch.Tensor, n_out: int) -> torch.Tensor:
        """F.conv1d of x [B, C_in, (n_out - 1) * stride + kernel]; `exact`: rounded as a long signal's is."""
        if not self.exact:
            if self.groups == x.shape[1] == self.weight.shape[0] and self.dilation == 1:
                # Depthwise: a few products per channel, far cheaper by hand than a oneDNN call.
                y = (x.unfold(-1, self.kernel, self.stride) * self.weight).sum(-1)
                return y if self.bias is None else y + self.bias[:, None]
            return F.conv1d(x, self.weight, self.bias, stride=self.stride, dilation=self.dilation, groups=self.groups)
        if self._long_signal_backend(x) == "mkldnn":
            # As F.conv1d calls it: a 2-D convolution of height 1 (oneDNN's 1-D kernels round otherwise).
            return torch.mkldnn_convolution(x[:, :, None], self.weight[:, :, None], self.bias, [0, 0], [1, self.stride],
                                            [1, self.dilation], self.groups)[:, :, 0]
        if n_out == 1 and x.device.type == "cpu":  # BLAS rounds a single column unlike many columns
            x = F.pad(x, (0, self.stride))
        y = F.conv1d(x, self.weight, self.bias, stride=self.stride, dilation=self.dilation, groups=self.groups)
        return y[..., :n_out]

    def _long_signal_backend(self, x: torch.Tensor) -> str:
        """"mkldnn" where PyTorch convolves a long signal of x's batch with oneDNN, else "native".

        PyTorch picks a CPU convolution by size (oneDNN above 20480 input elements, im2col + BLAS
        below, and for 1x1 kernels on one thread), and each rounds differently; a chunk takes the
        long signal's kernel, so its outputs are a whole file's bit for bit.
        """
        key = (x.shape[0], x.device, x.dtype, torch.get_num_threads(), torch.backends.mkldnn.enabled)
        if key not in self._backends:
            backend = "native"
            if x.device.type == "cpu" and x.dtype == torch.float32 and torch.backends.mkldnn.is_available():
                long = x.new_zeros(x.shape[0], x.shape[1], 4 * (20480 // x.shape[1] + self.kernel))
                chosen = torch._C._select_conv_backend(long, self.weight, self.bias, [self.stride], [0],
                                                       [self.dilation], False, [0], self.groups)
                backend = "mkldnn" if chosen == torch._C._ConvBackend.Mkldnn else "native"
            self._backends[key] = backend
        return self._backends[key]


class ConvTransposeStep(Step):
    """A causal ConvTranspose1d (overhang trimmed on the right) over chunks: x [B, C_in, n] -> [B, C_out, n * stride].

    Input frame i writes outputs i * stride ... i * stride + kernel - 1; outputs before the next
    frame's first are final, the rest (kernel - stride of them) wait as `overhang` for the next
    chunk to add to. The bias is added once, as outputs leave.
    """

    def __init__(self, layer: PaddedConvTranspose1d):
        conv = layer.conv
        if layer.trim_left:
            raise ValueError("streaming needs a causal transposed convolution (overhang trimmed on the right)")
        self.weight, self.bias = conv.weight.detach(), conv.bias.detach()
        self.stride = conv.stride[0]
        self.overhang: torch.Tensor | None = None

    def step(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        if n == 0:
            return x.new_zeros(x.shape[0], self.weight.shape[1], 0)
        y = F.conv_transpose1d(x, self.weight, None, stride=self.stride)  # [B, C_out, (n-1) s + kernel]
        if self.overhang is not None:
            y[..., : self.overhang.shape[-1]] += self.overhang
        self.overhang = y[..., n * self.stride:]
        return y[..., : n * self.stride] + self.bias[:, None]


class MapStep(Step):
    """A pointwise-in-time function (activation, norm, linear per frame): needs no state."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        self.fn = fn

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class Chain(Step):
    """Steps one after another."""

    def __init__(self, steps: Sequence[Step]):
        self.steps = list(steps)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        for s in self.steps:
            x = s.step(x)
        return x


class ResidualStep(Step):
    """The SEANet residual unit over chunks: x + pointwise(ELU(dilated(ELU(x)))), lengths kept."""

    def __init__(self, unit: ResidualUnit, exact: bool = True):
        self.dilated, self.pointwise = ConvStep.of(unit.dilated, exact), ConvStep.of(unit.pointwise, exact)
        self.exact = exact

    def step(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dilated.step(elementwise(F.elu, x, self.exact))
        return x + self.pointwise.step(elementwise(F.elu, h, self.exact))


class ConvNeXtStep(Step):
    """A causal ConvNeXt block over chunks of frames: [B, D, n] -> [B, D, n]."""

    def __init__(self, block: ConvNeXtBlock, exact: bool = True):
        if block.pad[1]:
            raise ValueError("streaming needs causal ConvNeXt blocks (depthwise padding on the left)")
        conv = block.dwconv
        self.dw = ConvStep(conv.weight, conv.bias, groups=conv.groups, pad_left=block.pad[0], exact=exact)
        self.block, self.exact = block, exact

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        b = self.block
        return b.gamma * b.down(F.gelu(b.up(b.norm(h))))

    def step(self, x: torch.Tensor) -> torch.Tensor:
        h = framewise(self._mlp, rearrange(self.dw.step(x), "b d t -> b t d"), self.exact)
        return x + rearrange(h, "b t d -> b d t")


def per_frame(fn: Callable[[torch.Tensor], torch.Tensor], exact: bool = True) -> MapStep:
    """A step applying `fn` (e.g. a LayerNorm or Linear over the last axis) to every frame of [B, D, n]."""
    return MapStep(lambda x: rearrange(framewise(fn, rearrange(x, "b d t -> b t d"), exact), "b t d -> b d t"))


def seanet_steps(layers: nn.Sequential, exact: bool = True) -> Chain:
    """The streaming chain of a SEANet encoder's or decoder's layer list (convolutions, residual
    units, transposed convolutions, ELUs); `exact`: rounded as a long signal's offline pass."""
    steps: list[Step] = []
    for layer in layers:
        if isinstance(layer, PaddedConv1d):
            steps.append(ConvStep.of(layer, exact))
        elif isinstance(layer, ResidualUnit):
            steps.append(ResidualStep(layer, exact))
        elif isinstance(layer, PaddedConvTranspose1d):
            steps.append(ConvTransposeStep(layer))
        elif isinstance(layer, nn.ELU):
            steps.append(MapStep(lambda x, elu=layer: elementwise(elu, x, exact)))
        else:
            raise ValueError(f"no streaming version of layer {type(layer).__name__}")
    return Chain(steps)

