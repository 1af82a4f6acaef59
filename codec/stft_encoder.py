"""A frame-rate encoder that reads a short-time spectrum: STFT + ConvNeXt blocks.

A fixed STFT turns the waveform into short spectra (n_fft = 4 * stft_hop, Hann window, one every
stft_hop samples), compressed as |X|^0.3 * X / |X|; each codec frame stacks its
`r = hop_length / stft_hop` spectra into one vector, and every learned layer runs at the frame rate.

    wav [B, C, S] -> spectra [B, C * 2 * (n_fft/2+1), S / stft_hop]   (compressed re, im)
      -> stack r per frame [B, C * r * 2 * (n_fft/2+1), T] -> Linear -> ConvNeXt x n_layers -> Linear
      -> z [B, latent_dim, T]   (T = S / hop_length)

The STFT is a strided convolution with a fixed DFT basis, so `frame_span` is exact. With
`causal=True` each window ends at the last sample of its stft_hop block and the depthwise
convolutions see only past frames: frame t depends only on samples < (t + 1) * hop_length.
Why this encoder, and how it fared: docs/codec.md (`encoder`), docs/experiments.md.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn
from torch.nn import functional as F

from codec.istft_decoder import conv_padding, convnext_blocks
from codec.modules import frame_span_of


def dft_basis(n_fft: int) -> torch.Tensor:
    """Hann-windowed real DFT as conv weights [2 * (n_fft/2+1), 1, n_fft]: cos rows, then -sin rows."""
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)[:, None]
    window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
    angle = 2 * math.pi * k * n / n_fft
    basis = torch.cat([torch.cos(angle), -torch.sin(angle)]) * window
    return basis[:, None, :].float()


class STFTEncoder(nn.Module):
    """Waveform -> latent frames through short spectra. wav [B, channels, S] -> z [B, latent_dim, S / hop_length].

    dim / n_layers / hidden: the ConvNeXt stack's width, depth and MLP width. stft_hop must divide
    hop_length. `compression` is the magnitude exponent applied to every spectrum.
    """

    def __init__(self, channels: int = 1, latent_dim: int = 64, hop_length: int = 320, stft_hop: int = 80, *,
                 dim: int = 256, n_layers: int = 6, hidden: int | None = None, kernel_size: int = 7,
                 causal: bool = False, compression: float = 0.3):
        super().__init__()
        if hop_length % stft_hop:
            raise ValueError(f"stft_hop {stft_hop} must divide the codec's hop_length {hop_length}")
        self.channels, self.hop_length, self.stft_hop = channels, hop_length, stft_hop
        self.per_frame = hop_length // stft_hop
        self.n_fft = 4 * stft_hop
        self.n_bins = self.n_fft // 2 + 1
        self.compression = compression
        total = self.n_fft - stft_hop
        self.stft_pad = (total, 0) if causal else (total - total // 2, total // 2)
        self.register_buffer("basis", dft_basis(self.n_fft), persistent=False)
        self.embed = nn.Linear(channels * self.per_frame * 2 * self.n_bins, dim)
        self.norm_in = nn.LayerNorm(dim)
        self.blocks = convnext_blocks(dim, n_layers, hidden, kernel_size=kernel_size, causal=causal)
        self.kernel_size, self.causal = kernel_size, causal
        self.norm_out = nn.LayerNorm(dim)
        self.project = nn.Linear(dim, latent_dim)

    def spectra(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, C, S] (S a multiple of hop_length) -> compressed (re, im) [B, C, 2, n_fft/2+1, S / stft_hop]."""
        x = F.pad(rearrange(wav, "b c s -> (b c) 1 s"), self.stft_pad)
        return self.compress(F.conv1d(x, self.basis, stride=self.stft_hop), wav.shape[0])

    def compress(self, spec: torch.Tensor, batch: int) -> torch.Tensor:
        """Raw spectra [(B C), 2 * bins, n] (the DFT convolution's output) -> compressed (re, im)
        [B, C, 2, bins, n], spectrum by spectrum."""
        spec = rearrange(spec, "(b c) (two f) n -> b c two f n", b=batch, two=2)
        magnitude = torch.sqrt(spec.square().sum(dim=2, keepdim=True) + 1e-12)
        return spec * magnitude ** (self.compression - 1)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        if wav.shape[-1] % self.hop_length:
            raise ValueError(f"length {wav.shape[-1]} is not a multiple of hop_length {self.hop_length}")
        x = self.embed_spectra(self.spectra(wav))
        for block in self.blocks:
            x = block(x)
        return self.project_frames(x)

    def embed_spectra(self, spec: torch.Tensor) -> torch.Tensor:
        """Compressed spectra [B, C, 2, bins, T * r] -> the first block's input [B, dim, T], frame by frame."""
        x = rearrange(spec, "b c two f (t r) -> b t (c r two f)", r=self.per_frame)
        return rearrange(self.norm_in(self.embed(x)), "b t d -> b d t")

    def project_frames(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output [B, dim, T] -> latents [B, latent_dim, T], frame by frame."""
        return rearrange(self.project(self.norm_out(rearrange(x, "b d t -> b t d"))), "b t d -> b d t")

    def frame_span(self) -> tuple[int, int]:
        """(lo, hi) such that latent frame t depends only on samples t * hop + lo ... t * hop + hi.

        Same convention as SEANetEncoder.frame_span: lo <= 0 is minus the past context and
        hi - (hop - 1) the look-ahead (0 when causal). Tight up to one sample: the periodic Hann
        window's first tap is 0, so sample t * hop + lo itself has no weight.
        """
        # Layers as (stride, left padding, kernel), input to output: the STFT, the stacking of r
        # spectra per frame, and one depthwise convolution per block.
        spans = [(self.stft_hop, self.stft_pad[0], self.n_fft), (self.per_frame, 0, self.per_frame)]
        spans += [(1, conv_padding(self.kernel_size, self.causal)[0], self.kernel_size)] * len(self.blocks)
        return frame_span_of(spans)
