"""A frame-rate decoder part that predicts a spectrogram and inverts it: ConvNeXt blocks + inverse STFT.

    decoder: {kind: istft, dim: 384, layers: 8, hop: 160, n_fft: 640}    # the shipped codec's

Every layer runs at the codec's frame rate as a stack of ConvNeXt blocks; a linear head predicts,
per frame, `r = hop_length / hop` short-time spectra (log-magnitude and phase angle per bin,
`n_fft = 4 * hop` unless set), and `torch.istft` overlap-adds them into the waveform.

    z [B, latent_dim, T] -> ConvNeXt x layers at T -> head [B, C * r * 2 * (n_fft/2+1), T]
      -> spectra [B*C, n_fft/2+1, T * r] -> istft(hop, center) -> wav [B, C, T * hop_length]

Causality: with `causal=True` the depthwise convolutions see only past frames; the inverse STFT
adds a look-ahead of `n_fft / 2` samples, which the streaming decoder waits for (`ISTFTStream`).
The encoder, which decides the tokens, is unaffected. Why this design and its window length:
docs/codec.md, docs/experiments.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import nn
from torch.nn import functional as F

from codec.core.config import positive_ints
from codec.core.modules import conv_padding, convnext_blocks
from codec.core.parts import register_part
from codec.core.streaming_layers import MIN_ROWS, Chain, ConvNeXtStep, ConvStep, per_frame


@dataclass(frozen=True)
class ISTFTDecoderConfig:
    """The iSTFT decoder's settings."""

    dim: int = 384  # ConvNeXt width
    layers: int = 8  # ConvNeXt blocks
    hop: int = 160  # hop of its output spectra; divides the codec's hop_length
    n_fft: int | None = 640  # window and FFT size (None: 4 * hop)

    def __post_init__(self) -> None:
        positive_ints("istft decoder", dim=self.dim, layers=self.layers, hop=self.hop)
        n_fft = self.n_fft
        if n_fft is not None and (isinstance(n_fft, bool) or not isinstance(n_fft, int) or n_fft < 2 * self.hop
                                  or n_fft % 2):
            raise ValueError(f"istft decoder n_fft must be None or an even integer >= 2 * hop ({2 * self.hop}), "
                             f"got {n_fft!r}")

    @property
    def window(self) -> int:
        """n_fft, or 4 * hop when unset."""
        return self.n_fft or 4 * self.hop

    def check(self, codec) -> None:
        if codec.hop_length % self.hop:
            raise ValueError(f"istft decoder hop {self.hop} must divide hop_length {codec.hop_length}")


@register_part("decoder", "istft", ISTFTDecoderConfig)
class ISTFTDecoder(nn.Module):
    """Latent frames -> waveform through a predicted spectrogram. z [B, latent_dim, T] -> [B, channels, T * hop].

    dim / n_layers / hidden: the ConvNeXt stack's width, depth and MLP width. Each latent frame
    predicts hop_length / istft_hop (a whole number) spectra of
    n_fft points (default 4 * istft_hop: Hann window, 75 % overlap). Magnitudes are exp(log-magnitude)
    clipped at 100, phases free angles.
    """

    MAX_MAGNITUDE = 100.0

    def __init__(self, channels: int = 1, latent_dim: int = 64, hop_length: int = 320, istft_hop: int = 80, *,
                 dim: int = 384, n_layers: int = 8, hidden: int | None = None, kernel_size: int = 7,
                 causal: bool = False, n_fft: int | None = None):
        super().__init__()
        self.channels, self.hop_length, self.istft_hop = channels, hop_length, istft_hop
        self.per_frame = hop_length // istft_hop
        self.n_fft = 4 * istft_hop if n_fft is None else n_fft  # ISTFTDecoderConfig checks both
        self.n_bins = self.n_fft // 2 + 1
        self.embed = nn.Conv1d(latent_dim, dim, kernel_size)
        self.embed_pad = conv_padding(kernel_size, causal)
        self.norm_in = nn.LayerNorm(dim)
        self.blocks = convnext_blocks(dim, n_layers, hidden, kernel_size=kernel_size, causal=causal)
        self.norm_out = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, channels * self.per_frame * 2 * self.n_bins)
        self.register_buffer("window", torch.hann_window(self.n_fft), persistent=False)

    @classmethod
    def from_config(cls, config: ISTFTDecoderConfig, codec) -> "ISTFTDecoder":
        return cls(codec.channels, codec.latent_dim, codec.hop_length, config.hop, dim=config.dim,
                   n_layers=config.layers, causal=codec.causal, n_fft=config.window)

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
        out = rearrange(out, "b t (c r k f) -> k (b c) f (t r)", c=self.channels, r=self.per_frame, k=2)
        return torch.polar(torch.exp(out[0]).clamp(max=self.MAX_MAGNITUDE), out[1])

    def synthesize(self, spec: torch.Tensor, batch: int) -> torch.Tensor:
        """Spectra [B * C, bins, T * r] (from `spectrum`) -> waveform [B, C, T * hop_length]."""
        wav = torch.istft(spec, self.n_fft, hop_length=self.istft_hop, win_length=self.n_fft, window=self.window,
                          center=True, length=spec.shape[-1] * self.istft_hop)
        return rearrange(wav, "(b c) s -> b c s", b=batch, c=self.channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.synthesize(self.spectrum(z), z.shape[0])

    def streaming_step(self, exact: bool = False) -> "ISTFTStream":
        return ISTFTStream(self, exact)


class ISTFTStream:
    """The iSTFT decoder over chunks of latent frames: the ConvNeXt stack step by step, then the
    overlap-add, whose audio lags by n_fft / 2 samples (`lookahead_samples`). `exact`: rounded as
    the offline pass (codec.core.streaming)."""

    def __init__(self, decoder: ISTFTDecoder, exact: bool = False):
        embed = ConvStep(decoder.embed.weight, decoder.embed.bias, pad_left=decoder.embed_pad[0], exact=exact)
        self.chain = Chain([embed, per_frame(decoder.norm_in, exact), *(ConvNeXtStep(b, exact) for b in decoder.blocks)])
        self.overlap_add = OverlapAdd(decoder.window, decoder.istft_hop)
        self.decoder, self.exact = decoder, exact
        self.lookahead_samples = decoder.n_fft // 2

    def step(self, z: torch.Tensor) -> torch.Tensor:
        """z [B, D, n] -> wav [B, C, samples made final]."""
        x = self.chain.step(z)
        return self.overlap_add.push(self._spectrum(x)).reshape(z.shape[0], self.decoder.channels, -1)

    def _spectrum(self, x: torch.Tensor) -> torch.Tensor:
        """The head on x [B, dim, n]; `exact`: with zero frames appended (rounding as a long signal's)."""
        decoder, n = self.decoder, x.shape[-1]
        if not self.exact:
            return decoder.head_spectrum(x)
        extra = max(-(-MIN_ROWS // x.shape[0]) - n, 1)
        return decoder.head_spectrum(F.pad(x, (0, extra)))[..., : n * decoder.per_frame]

    def flush(self, batch: int) -> torch.Tensor:
        """The samples still waiting for look-ahead -> [B, C, lookahead_samples]."""
        return self.overlap_add.flush(batch * self.decoder.channels).reshape(batch, self.decoder.channels, -1)


class OverlapAdd:
    """`torch.istft(center=True)` over chunks of spectra: windowed inverse FFTs summed into a
    pending tail, divided by the summed squared window once no later spectrum can reach them.

    Spectrum j covers samples j * hop - n_fft/2 ... j * hop + n_fft/2 - 1 of the output, so after
    spectra 0..J the samples before (J + 1) * hop - n_fft/2 are final.
    """

    def __init__(self, window: torch.Tensor, hop: int):
        self.window, self.hop, self.n_fft = window, hop, window.shape[0]
        self.trim = self.n_fft // 2
        self.spectra = 0  # pushed so far
        self.start = 0  # full-OLA position of the tail's first sample
        self.tail: torch.Tensor | None = None  # [N, pending] sums
        self.envelope = window.new_zeros(0)  # [pending] summed squared windows

    def _fold(self, frames: torch.Tensor) -> torch.Tensor:
        """[N, n_fft, m] -> [N, (m - 1) * hop + n_fft], overlap-added."""
        m = frames.shape[-1]
        out = F.fold(frames, (1, (m - 1) * self.hop + self.n_fft), (1, self.n_fft), stride=(1, self.hop))
        return out[:, 0, 0]

    def push(self, spec: torch.Tensor) -> torch.Tensor:
        """Complex spectra [N, n_fft/2 + 1, m] -> the samples they make final, [N, s]."""
        if spec.shape[-1]:
            frames = torch.fft.irfft(spec, n=self.n_fft, dim=-2) * self.window[:, None]
            ola = self._fold(frames)
            env = self._fold(self.window.square()[None, :, None].expand(1, -1, spec.shape[-1]))[0]
            if self.tail is not None:
                ola[:, : self.tail.shape[-1]] += self.tail
                env[: self.envelope.shape[0]] += self.envelope
            self.tail, self.envelope = ola, env
            self.spectra += spec.shape[-1]
        return self._emit(self.spectra * self.hop, spec.shape[0])

    def flush(self, n: int) -> torch.Tensor:
        """The last samples, up to `torch.istft`'s length (spectra x hop): [N, s]."""
        return self._emit(self.spectra * self.hop + self.trim, n)

    def _emit(self, end: int, n: int) -> torch.Tensor:
        if self.tail is None or end <= self.start:
            return self.window.new_zeros(n, 0)
        k = end - self.start
        skip = max(self.trim - self.start, 0)  # center=True drops the first n_fft / 2 samples
        out, env = self.tail[:, skip:k], self.envelope[skip:k]
        self.tail, self.envelope, self.start = self.tail[:, k:], self.envelope[k:], end
        if env.numel() and float(env.abs().min()) < 1e-11:
            raise ValueError("window overlap-add has a zero (the iSTFT's NOLA condition fails)")
        return out / env
