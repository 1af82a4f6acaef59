"""The source-filter codec's parts: an encoder that analyses speech into vocoder parameters, a
decoder that synthesizes them (codec.source_filter).

    encoder: {kind: source_filter, width: 256, layers: 4, kernel: 3}
    decoder: {kind: source_filter, n_fft: 1024}

The encoder's network (codec.source_filter_net) gives F0, voicing and aperiodicity; the envelope
is measured, not regressed (CheapTrick at the network's F0). The latent is [B, 27, T] per 20 ms
frame, frame t centred on sample t * hop:
    channel 0      pitch: PITCH_UNITS x log2(F0 / F0_MIN) on the encoder's F0 grid, UNVOICED_PITCH where unvoiced
    channels 1-25  the 24-order mel-cepstrum minus its training mean
    channel 26     WORLD's coded aperiodicity (dB) / 10 minus its training mean
The quantizer's first codebook is that pitch grid (`pitch_codebook`), so code 0..F0_BINS of
codebook 1 is the F0 stream (0 = unvoiced); codebooks 2..N_c code the envelope's residuals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from codec.config import positive_ints
from codec.parts import register_part
from codec.source_filter_net import F0_BINS, F0_MIN, SourceFilterNet, class_to_f0
from codec.source_filter import MCEP_ORDER, SourceFilterSynth, SynthStream, cheaptrick, mcep_fit_matrix

PARAMS = MCEP_ORDER + 2  # mel-cepstrum and one aperiodicity band a frame
LATENT_DIM = 1 + PARAMS  # pitch, then the parameters
PITCH_UNITS = 4.0  # latent units per octave of F0
UNVOICED_PITCH = -PITCH_UNITS  # an octave under F0_MIN
AP_SCALE = 10.0  # the aperiodicity's dB are divided by this in the latent


def _check_frame_grid(codec, who: str) -> None:
    if (codec.sample_rate, codec.hop_length, codec.channels, codec.latent_dim) != (16000, 320, 1, LATENT_DIM):
        raise ValueError(f"the source-filter {who} needs sample_rate 16000, hop_length 320 (strides multiplying to "
                         f"320), channels 1 and latent_dim {LATENT_DIM}; got {codec.sample_rate}, {codec.hop_length}, "
                         f"{codec.channels} and {codec.latent_dim}")


def pitch_of_class(cls: torch.Tensor) -> torch.Tensor:
    """F0 classes (0 unvoiced, 1..F0_BINS) -> the latent's pitch channel."""
    f0 = class_to_f0(cls).clamp(min=F0_MIN)
    return torch.where(cls > 0, PITCH_UNITS * torch.log2(f0 / F0_MIN), torch.full_like(f0, UNVOICED_PITCH))


def f0_of_pitch(pitch: torch.Tensor) -> torch.Tensor:
    """The latent's pitch channel -> F0 in Hz (0 = unvoiced: below half-way to UNVOICED_PITCH)."""
    return torch.where(pitch > UNVOICED_PITCH / 2, F0_MIN * torch.pow(2.0, pitch / PITCH_UNITS),
                       torch.zeros_like(pitch))


def pitch_codebook(codebook_size: int) -> torch.Tensor:
    """[|V|, LATENT_DIM]: code c < 1 + F0_BINS is class c's pitch with a zero envelope; the codes above
    repeat code 0 (unvoiced), so the nearest-code search (ties to the lowest index) never picks them."""
    if codebook_size < 1 + F0_BINS:
        raise ValueError(f"the pitch codebook needs at least {1 + F0_BINS} codes, got {codebook_size}")
    book = torch.zeros(codebook_size, LATENT_DIM)
    cls = torch.arange(codebook_size).clamp(max=F0_BINS)
    book[:, 0] = pitch_of_class(torch.where(cls <= F0_BINS, cls, torch.zeros_like(cls)))
    book[1 + F0_BINS:, 0] = UNVOICED_PITCH
    return book


# ----------------------------------------------------------------------------- encoder


@dataclass(frozen=True)
class SourceFilterEncoderConfig:
    """The analysis network's settings (codec.source_filter_net)."""

    width: int = 256  # channels of its frame-rate layers
    layers: int = 4  # causal residual blocks
    kernel: int = 3  # their kernel over frames

    def __post_init__(self) -> None:
        positive_ints("source_filter encoder", width=self.width, layers=self.layers, kernel=self.kernel)

    def check(self, codec) -> None:
        _check_frame_grid(codec, "encoder")


@register_part("encoder", "source_filter", SourceFilterEncoderConfig)
class SourceFilterEncoder(nn.Module):
    """wav [B, 1, S] -> latent [B, 27, ceil(S / 320)] (layout: module docstring). The network gives the F0
    (voiced where unvoiced has probability under 1/2, then the most likely class) and the aperiodicity;
    the envelope is WORLD's CheapTrick at that F0 (codec.source_filter.cheaptrick), fitted by a
    mel-cepstrum. `param_mean` [26] is the parameters' training mean."""

    def __init__(self, width: int = 256, layers: int = 4, kernel: int = 3):
        super().__init__()
        self.net = SourceFilterNet(width, layers, kernel)
        self.register_buffer("param_mean", torch.zeros(PARAMS))
        self.register_buffer("mcep_fit", mcep_fit_matrix(), persistent=False)

    @classmethod
    def from_config(cls, config: SourceFilterEncoderConfig, codec) -> "SourceFilterEncoder":
        return cls(config.width, config.layers, config.kernel)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        logits, ap = self.net(wav)
        voiced = logits[:, 0] < torch.logsumexp(logits[:, 1:], 1)  # P(unvoiced) < 1/2
        cls = torch.where(voiced, logits[:, 1:].argmax(1) + 1, 0)  # [B, T]
        f0 = class_to_f0(cls)
        log_power = torch.stack([cheaptrick(w[0], f) for w, f in zip(wav, f0)])  # [B, T, bins]
        mcep = (0.5 * log_power) @ self.mcep_fit.T  # [B, T, 25]
        params = torch.cat([mcep.transpose(1, 2), ap], 1) - self.param_mean[None, :, None]
        return torch.cat([pitch_of_class(cls)[:, None], params], 1)

    def frame_span(self) -> tuple[int, int]:
        return self.net.frame_span()

    def streaming_step(self) -> "SourceFilterEncoderStream":
        return SourceFilterEncoderStream(self)


class SourceFilterEncoderStream:
    """wav chunks [B, 1, n] -> the latent frames they complete, each computed from the samples its
    `frame_span` covers (a whole-signal pass computes the same frames)."""

    def __init__(self, encoder: SourceFilterEncoder):
        self.encoder = encoder
        lo, _ = encoder.frame_span()
        self.hop = 320
        self.context = math.ceil(-lo / self.hop) * self.hop  # past samples kept, a whole number of frames
        self.buffer: torch.Tensor | None = None
        self.offset = 0  # absolute index of buffer[..., 0]
        self.frames = 0  # frames returned

    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.buffer = x if self.buffer is None else torch.cat([self.buffer, x], -1)
        total = self.offset + self.buffer.shape[-1]
        ready = total // self.hop - self.frames
        if ready <= 0:
            return x.new_zeros(x.shape[0], LATENT_DIM, 0)
        start = max(0, self.frames * self.hop - self.context)
        window = self.buffer[..., start - self.offset: (self.frames + ready) * self.hop - self.offset]
        latent = self.encoder(window)[..., -ready:]
        self.frames += ready
        keep = max(0, self.frames * self.hop - self.context)
        self.buffer, self.offset = self.buffer[..., keep - self.offset:], keep
        return latent


# ----------------------------------------------------------------------------- decoder


@dataclass(frozen=True)
class SourceFilterDecoderConfig:
    """The synthesizer's settings (codec.source_filter)."""

    n_fft: int = 1024  # length of each pulse's response

    def __post_init__(self) -> None:
        positive_ints("source_filter decoder", n_fft=self.n_fft)
        if self.n_fft < 256 or self.n_fft & (self.n_fft - 1):
            raise ValueError(f"source_filter decoder n_fft must be a power of two >= 256, got {self.n_fft}")

    def check(self, codec) -> None:
        _check_frame_grid(codec, "decoder")


@register_part("decoder", "source_filter", SourceFilterDecoderConfig)
class SourceFilterDecoder(nn.Module):
    """latent [B, 27, T] -> wav [B, 1, T * 320] by WORLD-style synthesis (codec.source_filter); no
    learned weights but `param_mean` [26], the parameters' training mean."""

    def __init__(self, n_fft: int = 1024):
        super().__init__()
        self.synth = SourceFilterSynth(16000, 320, n_fft)
        self.register_buffer("param_mean", torch.zeros(PARAMS))

    @classmethod
    def from_config(cls, config: SourceFilterDecoderConfig, codec) -> "SourceFilterDecoder":
        return cls(config.n_fft)

    def parameters_of(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """latent [D, T] -> (f0 [T] Hz float64, mel-cepstrum [T, 25], coded aperiodicity [T] dB). The F0 is
        float64 so that the running phase does not drift with the rounding of a chunk's elementwise ops."""
        params = z[1:].float().T + self.param_mean.float()
        return f0_of_pitch(z[0].double()), params[:, :MCEP_ORDER + 1], params[:, MCEP_ORDER + 1] * AP_SCALE

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = z.detach().cpu()
        wav = [self.synth.synthesize(*self.parameters_of(zb)) for zb in z]
        return torch.stack(wav)[:, None].to(self.param_mean.device)

    def streaming_step(self, exact: bool = False) -> "SourceFilterDecoderStream":
        return SourceFilterDecoderStream(self)


class SourceFilterDecoderStream:
    """latent frames -> audio: a sample is final once the next frame has come (`lookahead_samples`: one hop)."""

    def __init__(self, decoder: SourceFilterDecoder):
        self.decoder = decoder
        self.lookahead_samples = decoder.synth.hop
        self.streams: list[SynthStream] | None = None

    def step(self, z: torch.Tensor) -> torch.Tensor:
        z = z.detach().cpu()
        if self.streams is None:
            self.streams = [SynthStream(self.decoder.synth) for _ in range(z.shape[0])]
        out = [s.push(*self.decoder.parameters_of(zb)) for s, zb in zip(self.streams, z)]
        return torch.stack(out)[:, None].to(self.decoder.param_mean.device)

    def flush(self, batch: int) -> torch.Tensor:
        if self.streams is None:
            return torch.zeros(batch, 1, 0)
        return torch.stack([s.flush() for s in self.streams])[:, None].to(self.decoder.param_mean.device)
