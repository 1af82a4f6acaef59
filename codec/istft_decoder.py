"""A frame-rate decoder that predicts a spectrogram and inverts it: ConvNeXt blocks + inverse STFT.

Every layer runs at the codec's frame rate as a stack of ConvNeXt blocks; a linear head predicts,
per frame, `r = hop_length / istft_hop` short-time spectra (log-magnitude and phase per bin,
`n_fft = 4 * istft_hop` unless set), and `torch.istft` overlap-adds them into the waveform.

    z [B, latent_dim, T] -> ConvNeXt x n_layers at T -> head [B, C * r * 2 * (n_fft/2+1), T]
      -> spectra [B*C, n_fft/2+1, T * r] -> istft(hop=istft_hop, center) -> wav [B, C, T * hop_length]

Phase: `phase="angle"` emits one free angle per bin; `phase="angle_vector"` also emits a 2-D
vector (x, y) per bin and the phase is angle + atan2(y, x). `from_angle_head` builds such a head
from a trained angle head with x = 1, y = 0, so it starts out as exactly that decoder.

Causality: with `causal=True` the depthwise convolutions see only past frames; the inverse STFT
adds a look-ahead of at most `n_fft / 2` samples. The encoder, which decides the tokens, is
unaffected. Why this design and its window length: docs/codec.md, docs/experiments.md.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn
from torch.nn import functional as F


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


class ISTFTDecoder(nn.Module):
    """Latent frames -> waveform through a predicted spectrogram. z [B, latent_dim, T] -> [B, channels, T * hop].

    dim / n_layers / hidden: the ConvNeXt stack's width, depth and MLP width. istft_hop must
    divide hop_length; each latent frame predicts hop_length / istft_hop spectra of
    n_fft points (default 4 * istft_hop: Hann window, 75 % overlap). Magnitudes are exp(log-magnitude)
    clipped at 100, phases are free angles (`phase="angle"`) or free angles turned by
    the direction of a predicted vector (`phase="angle_vector"`; see the module doc).
    """

    MAX_MAGNITUDE = 100.0
    PHASES = {"angle": 2, "angle_vector": 4}  # head outputs per bin: log-magnitude, angle[, x, y]

    def __init__(self, channels: int = 1, latent_dim: int = 64, hop_length: int = 320, istft_hop: int = 80, *,
                 dim: int = 384, n_layers: int = 8, hidden: int | None = None, kernel_size: int = 7,
                 causal: bool = False, phase: str = "angle", n_fft: int | None = None):
        super().__init__()
        if hop_length % istft_hop:
            raise ValueError(f"istft_hop {istft_hop} must divide the codec's hop_length {hop_length}")
        if phase not in self.PHASES:
            raise ValueError(f"phase must be one of {sorted(self.PHASES)}, got {phase!r}")
        self.phase = phase
        self.outputs_per_bin = self.PHASES[phase]
        self.channels, self.hop_length, self.istft_hop = channels, hop_length, istft_hop
        self.per_frame = hop_length // istft_hop
        self.n_fft = 4 * istft_hop if n_fft is None else n_fft
        if self.n_fft < 2 * istft_hop or self.n_fft % 2:
            raise ValueError(f"n_fft must be even and >= 2 * istft_hop ({2 * istft_hop}), got {self.n_fft}")
        self.n_bins = self.n_fft // 2 + 1
        self.embed = nn.Conv1d(latent_dim, dim, kernel_size)
        self.embed_pad = conv_padding(kernel_size, causal)
        self.norm_in = nn.LayerNorm(dim)
        self.blocks = convnext_blocks(dim, n_layers, hidden, kernel_size=kernel_size, causal=causal)
        self.norm_out = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, channels * self.per_frame * self.outputs_per_bin * self.n_bins)
        if phase == "angle_vector":
            self._start_vectors_at_no_turn()
        self.register_buffer("window", torch.hann_window(self.n_fft), persistent=False)

    def spectrum(self, z: torch.Tensor) -> torch.Tensor:
        """z [B, latent_dim, T] -> complex spectra [B * channels, n_fft/2 + 1, T * hop/istft_hop]."""
        x = self.embed(F.pad(z, self.embed_pad))
        x = rearrange(self.norm_in(rearrange(x, "b d t -> b t d")), "b t d -> b d t")
        for block in self.blocks:
            x = block(x)
        return self.head_spectrum(x)

    def head_spectrum(self, x: torch.Tensor) -> torch.Tensor:
        """The last ConvNeXt block's output x [B, dim, T] -> complex spectra [B * channels, bins, T * r].
        Frame by frame (no context across frames)."""
        out = self.head(self.norm_out(rearrange(x, "b d t -> b t d")))  # [B, T, C * r * 2 * bins]
        out = rearrange(out, "b t (c r k f) -> k (b c) f (t r)", c=self.channels, r=self.per_frame,
                        k=self.outputs_per_bin)
        magnitude = torch.exp(out[0]).clamp(max=self.MAX_MAGNITUDE)
        phase = out[1]
        if self.phase == "angle_vector":
            phase = phase + torch.atan2(out[3], out[2])
        return torch.polar(magnitude, phase)

    def _head_view(self, t: torch.Tensor) -> torch.Tensor:
        """The head's weight [out, dim] or bias [out] as [C, r, k, bins, ...] (k: outputs per bin)."""
        return t.view(self.channels, self.per_frame, self.outputs_per_bin, self.n_bins, *t.shape[1:])

    @torch.no_grad()
    def _start_vectors_at_no_turn(self) -> None:
        """x = 1, y = 0 for every input: atan2(y, x) = 0, the phase is the angle output alone."""
        weight, bias = self._head_view(self.head.weight), self._head_view(self.head.bias)
        weight[:, :, 2:].zero_()
        bias[:, :, 2].fill_(1.0)
        bias[:, :, 3].zero_()

    @torch.no_grad()
    def from_angle_head(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        """Take a trained `phase="angle"` head (weight [C*r*2*bins, dim], bias) into this
        `phase="angle_vector"` decoder: same log-magnitudes and angles, vectors at no turn."""
        if self.phase != "angle_vector":
            raise ValueError("from_angle_head needs phase='angle_vector'")
        expected = self.channels * self.per_frame * 2 * self.n_bins
        if weight.shape != (expected, self.head.in_features) or bias.shape != (expected,):
            raise ValueError(f"an angle head of this decoder has weight {(expected, self.head.in_features)} and "
                             f"bias ({expected},); got {tuple(weight.shape)} and {tuple(bias.shape)}")
        old_w = weight.view(self.channels, self.per_frame, 2, self.n_bins, -1)
        old_b = bias.view(self.channels, self.per_frame, 2, self.n_bins)
        self._head_view(self.head.weight)[:, :, :2].copy_(old_w)
        self._head_view(self.head.bias)[:, :, :2].copy_(old_b)
        self._start_vectors_at_no_turn()

    def synthesize(self, spec: torch.Tensor, batch: int) -> torch.Tensor:
        """Spectra [B * C, bins, T * r] (from `spectrum`) -> waveform [B, C, T * hop_length]."""
        wav = torch.istft(spec, self.n_fft, hop_length=self.istft_hop, win_length=self.n_fft, window=self.window,
                          center=True, length=spec.shape[-1] * self.istft_hop)
        return rearrange(wav, "(b c) s -> b c s", b=batch, c=self.channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.synthesize(self.spectrum(z), z.shape[0])
