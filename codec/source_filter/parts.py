"""The source-filter codec's parts: an encoder that analyses speech into vocoder parameters, a
decoder that synthesizes them (codec.source_filter.synthesis).

    encoder: {kind: source_filter, width: 256, layers: 4, kernel: 3}
    decoder: {kind: source_filter, n_fft: 1024}

The encoder's network (codec.source_filter.net) gives F0, voicing and aperiodicity; the envelope
is measured, not regressed (CheapTrick at the network's F0). With `envelopes: 1` the latent is
[B, 27, T] per 20 ms frame, frame t centred on sample t * hop:
    channel 0      pitch: PITCH_UNITS x log2(F0 / F0_MIN) on the encoder's F0 grid, UNVOICED_PITCH where unvoiced
    channels 1-25  the 24-order mel-cepstrum minus its training mean
    channel 26     WORLD's coded aperiodicity (dB) / 10 minus its training mean
With `envelopes: 2` ([B, 52, T]) a frame also carries the envelope 10 ms before its centre (at
t * hop - hop / 2, at the geometric mean of its neighbours' F0 where both are voiced), as its residual
from the mean of the two centre envelopes around it (interpolative coding):
    channels 1-25  the centre envelope c_t, channels 26-50  m_t - (c_{t-1} + c_t) / 2 (c_{-1} = c_0),
    channel 51     the aperiodicity; each minus its training mean.
The decoder then synthesizes every 10 ms: m_t, c_t, with F0 and aperiodicity interpolated.
The quantizer's first codebook is that pitch grid (`pitch_codebook`), so code 0..F0_BINS of
codebook 1 is the F0 stream (0 = unvoiced); codebooks 2..N_c code the envelope's residuals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from codec.core.config import added_later, positive_ints
from codec.core.parts import register_part
from codec.core.streaming_layers import ConvStep, elementwise, framewise, padding_frames
from codec.source_filter.net import F0_BINS, F0_MIN, HOP, LEFT_PAD, SourceFilterNet, class_to_f0
from codec.source_filter.synthesis import (ANALYSIS_HALF_WINDOW, MCEP_ORDER, SourceFilterSynth, SynthStream,
                                           cheaptrick, mcep_fit_matrix)

PARAMS = MCEP_ORDER + 2  # mel-cepstrum and one aperiodicity band a frame
LATENT_DIM = 1 + PARAMS  # pitch, then the parameters
MCEPS = MCEP_ORDER + 1
HALF = HOP // 2  # the second envelope's offset before the frame centre
PITCH_UNITS = 4.0  # latent units per octave of F0
UNVOICED_PITCH = -PITCH_UNITS  # an octave under F0_MIN
AP_SCALE = 10.0  # the aperiodicity's dB are divided by this in the latent
SPECTRA_CONTEXT = math.ceil(LEFT_PAD / HOP)  # frames of samples before a frame that its spectra read
ENVELOPE_CONTEXT = math.ceil(ANALYSIS_HALF_WINDOW / HOP)  # likewise for CheapTrick's window
GEMV_TAIL = 16  # rows of padding after a stream's frames in a one-column matmul


def latent_dim(envelopes: int) -> int:
    """Latent channels a frame with `envelopes` envelopes (1 or 2): pitch, mel-cepstra, aperiodicity."""
    return 1 + envelopes * MCEPS + 1


def _check_frame_grid(codec, who: str, envelopes: int) -> None:
    dim = latent_dim(envelopes)
    if (codec.sample_rate, codec.hop_length, codec.channels, codec.latent_dim) != (16000, 320, 1, dim):
        raise ValueError(f"the source-filter {who} with {envelopes} envelope(s) a frame needs sample_rate 16000, "
                         f"hop_length 320 (strides multiplying to 320), channels 1 and latent_dim {dim}; got "
                         f"{codec.sample_rate}, {codec.hop_length}, {codec.channels} and {codec.latent_dim}")


def _check_envelopes(who: str, envelopes: int) -> None:
    if envelopes not in (1, 2):
        raise ValueError(f"source_filter {who} envelopes must be 1 or 2 (a frame's envelopes), got {envelopes}")


def previous(x: torch.Tensor, before: torch.Tensor | None, dim: int) -> torch.Tensor:
    """x one frame later along `dim`: frame t holds frame t - 1, frame 0 `before` (the frame before x's
    first, without `dim`; None: x's first itself)."""
    first = x.narrow(dim, 0, 1) if before is None else before.unsqueeze(dim)
    return torch.cat([first, x.narrow(dim, 0, max(x.shape[dim] - 1, 0))], dim)


def mid_f0(f0: torch.Tensor, before: torch.Tensor | None = None) -> torch.Tensor:
    """F0 [..., T] (0 = unvoiced) -> the F0 half a frame before each frame: the geometric mean of the frame
    and the one before (`before` [...], the frame before the first; default the first itself) where both
    are voiced, else 0."""
    prev = previous(f0, before, -1)
    both = (prev > 0) & (f0 > 0)
    return torch.where(both, torch.sqrt(prev.clamp(min=0) * f0.clamp(min=0)), torch.zeros_like(f0))


def mid_residual(mid: torch.Tensor, centre: torch.Tensor, before: torch.Tensor | None = None) -> torch.Tensor:
    """The mid envelopes' residuals from interpolation: mid, centre [..., T, 25]; `before` [..., 25] the centre
    envelope before the first (default the first itself)."""
    return mid - 0.5 * (previous(centre, before, -2) + centre)


def pitch_of_class(cls: torch.Tensor) -> torch.Tensor:
    """F0 classes (0 unvoiced, 1..F0_BINS) -> the latent's pitch channel."""
    f0 = class_to_f0(cls).clamp(min=F0_MIN)
    return torch.where(cls > 0, PITCH_UNITS * torch.log2(f0 / F0_MIN), torch.full_like(f0, UNVOICED_PITCH))


def voiced_class(logits: torch.Tensor) -> torch.Tensor:
    """F0 logits [B, T, 1 + F0_BINS] (frames by rows, as both the whole-signal pass and the stream hold
    them) -> classes [B, T]: voiced where P(unvoiced) < 1/2, then the most likely class."""
    voiced = logits[..., 0] < torch.logsumexp(logits[..., 1:], -1)
    return torch.where(voiced, logits[..., 1:].argmax(-1) + 1, 0)


def f0_of_pitch(pitch: torch.Tensor) -> torch.Tensor:
    """The latent's pitch channel -> F0 in Hz (0 = unvoiced: below half-way to UNVOICED_PITCH)."""
    return torch.where(pitch > UNVOICED_PITCH / 2, F0_MIN * torch.pow(2.0, pitch / PITCH_UNITS),
                       torch.zeros_like(pitch))


def pitch_codebook(codebook_size: int, dim: int = LATENT_DIM) -> torch.Tensor:
    """[|V|, dim]: code c < 1 + F0_BINS is class c's pitch with a zero envelope; the codes above
    repeat code 0 (unvoiced), so the nearest-code search (ties to the lowest index) never picks them."""
    if codebook_size < 1 + F0_BINS:
        raise ValueError(f"the pitch codebook needs at least {1 + F0_BINS} codes, got {codebook_size}")
    book = torch.zeros(codebook_size, dim)
    cls = torch.arange(codebook_size).clamp(max=F0_BINS)
    book[:, 0] = pitch_of_class(torch.where(cls <= F0_BINS, cls, torch.zeros_like(cls)))
    book[1 + F0_BINS:, 0] = UNVOICED_PITCH
    return book


# ----------------------------------------------------------------------------- encoder


@dataclass(frozen=True)
class SourceFilterEncoderConfig:
    """The analysis network's settings (codec.source_filter.net)."""

    width: int = 256  # channels of its frame-rate layers
    layers: int = 4  # causal residual blocks
    kernel: int = 3  # their kernel over frames
    envelopes: int = added_later(1)  # envelopes a frame: 1 (at its centre) or 2 (and 10 ms before it)

    def __post_init__(self) -> None:
        positive_ints("source_filter encoder", width=self.width, layers=self.layers, kernel=self.kernel)
        _check_envelopes("encoder", self.envelopes)

    def check(self, codec) -> None:
        _check_frame_grid(codec, "encoder", self.envelopes)


@register_part("encoder", "source_filter", SourceFilterEncoderConfig)
class SourceFilterEncoder(nn.Module):
    """wav [B, 1, S] -> latent [B, 27 or 52, ceil(S / 320)] (layout: module docstring). The network gives
    the F0 (voiced where unvoiced has probability under 1/2, then the most likely class) and the
    aperiodicity; each envelope is WORLD's CheapTrick at that F0 (codec.source_filter.synthesis.cheaptrick), fitted
    by a mel-cepstrum. `param_mean` [latent - 1] is the parameters' training mean."""

    def __init__(self, width: int = 256, layers: int = 4, kernel: int = 3, envelopes: int = 1):
        super().__init__()
        _check_envelopes("encoder", envelopes)
        self.envelopes = envelopes
        self.net = SourceFilterNet(width, layers, kernel)
        self.register_buffer("param_mean", torch.zeros(latent_dim(envelopes) - 1))
        self.register_buffer("mcep_fit", mcep_fit_matrix(), persistent=False)

    @classmethod
    def from_config(cls, config: SourceFilterEncoderConfig, codec) -> "SourceFilterEncoder":
        return cls(config.width, config.layers, config.kernel, config.envelopes)

    def envelope(self, wav: torch.Tensor, f0: torch.Tensor, shift: int = 0) -> torch.Tensor:
        """wav [B, 1, S], f0 [B, T] -> mel-cepstra [B, T, 25] of the envelopes at t * 320 - shift."""
        log_power = torch.stack([cheaptrick(F.pad(w[0], (shift, 0)), f) for w, f in zip(wav, f0)])  # [B, T, bins]
        return (0.5 * log_power) @ self.mcep_fit.T

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        logits, ap = self.net(wav)
        cls = voiced_class(logits.transpose(1, 2))  # [B, T]
        f0 = class_to_f0(cls)
        centre = self.envelope(wav, f0)  # [B, T, 25]
        parts = [centre]
        if self.envelopes == 2:
            parts.append(mid_residual(self.envelope(wav, mid_f0(f0), HALF), centre))
        params = torch.cat([p.transpose(1, 2) for p in parts] + [ap], 1) - self.param_mean[None, :, None]
        return torch.cat([pitch_of_class(cls)[:, None], params], 1)

    def frame_span(self) -> tuple[int, int]:
        return self.net.frame_span()

    def streaming_step(self) -> "SourceFilterEncoderStream":
        return SourceFilterEncoderStream(self)


class SourceFilterEncoderStream:
    """wav chunks [B, 1, n] -> the latent frames [B, 27, m] they complete, each frame computed once, layer by
    layer, with the arithmetic of the whole-signal pass.

    The stream keeps what each layer needs of the past (samples for the spectra and the envelope, each
    block's convolution context: codec.core.streaming_layers.ConvStep) and computes only the new frames. A few
    frames take other kernels than a whole file's many (BLAS multiplies fewer than 16 rows otherwise, an
    elementwise op computes its last values in scalar code, a short convolution goes to im2col instead
    of oneDNN), so every step here takes the long signal's (`framewise`, `elementwise`, ConvStep's
    `exact`): the latents are `SourceFilterEncoder.forward`'s bit for bit (but in the last frames of a
    whole file, which its own pass computes in its scalar tails), and so the codes are `Codec.encode`'s
    for any chunking. Before (issue 49) each step ran the network on a window of a dozen frames, ~1e-6
    off the whole file's latents, and a 3-minute file met a near-tie where one code differed."""

    def __init__(self, encoder) -> None:
        self.encoder, net = encoder, encoder.net
        with torch.no_grad():
            self.blocks = [(b.norm, ConvStep(b.conv.weight, b.conv.bias, pad_left=b.kernel - 1), b.project)
                           for b in net.blocks]
        self.buffer: torch.Tensor | None = None
        self.offset = 0  # absolute index of buffer[..., 0]
        self.frames = 0  # frames returned
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # the last frame's F0 [B] and centre envelope [B, 25]

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.buffer = x if self.buffer is None else torch.cat([self.buffer, x], -1)
        ready = (self.offset + self.buffer.shape[-1]) // HOP - self.frames
        if ready <= 0:
            return x.new_zeros(x.shape[0], latent_dim(self.encoder.envelopes), 0)
        first, stop = self.frames, self.frames + ready
        logits, ap = self._network(first, stop)  # [B, ready, 1 + F0_BINS], [B, ready, 1]
        cls = framewise(lambda rows: voiced_class(rows)[..., None], logits)[..., 0]  # [B, ready]
        f0 = elementwise(class_to_f0, cls)
        mcep = self._envelope(first, stop, f0)  # [B, ready, 25]
        parts = [mcep]
        if self.encoder.envelopes == 2:
            before = (None, None) if self.last is None else self.last
            mid = self._envelope(first, stop, mid_f0(f0, before[0]), HALF)
            parts.append(mid_residual(mid, mcep, before[1]))
            self.last = f0[:, -1], mcep[:, -1]
        params = torch.cat([*parts, ap], -1).transpose(1, 2) - self.encoder.param_mean[None, :, None]
        self.frames = stop
        keep = max(0, (stop - max(SPECTRA_CONTEXT, ENVELOPE_CONTEXT + 1)) * HOP)
        self.buffer, self.offset = self.buffer[..., keep - self.offset:], keep
        return torch.cat([elementwise(pitch_of_class, cls)[:, None], params], 1)

    def _samples(self, start_frame: int, stop_frame: int) -> torch.Tensor:
        return self.buffer[..., start_frame * HOP - self.offset: stop_frame * HOP - self.offset]

    def _network(self, first: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """SourceFilterNet's outputs for frames first..stop - 1, frames by rows, each block's convolution
        carrying its context from the frames before."""
        net = self.encoder.net
        start = max(0, first - SPECTRA_CONTEXT)
        feats = net.features(self._samples(start, stop), exact=True)[:, first - start:]  # [B, n, 770], transposed
        h = _by_columns(lambda x: net.inp(x.transpose(1, 2)).transpose(1, 2), feats.transpose(1, 2))  # [B, D, n]
        for norm, conv, project in self.blocks:
            y = framewise(norm, h.transpose(1, 2)).transpose(1, 2)
            h = h + _by_columns(project, elementwise(F.gelu, conv.step(y)))
        h = framewise(net.out_norm, h.transpose(1, 2))
        # The one-column head is a matrix-vector product, which rounds its last rows (a tail of the row
        # loop) otherwise: they are padding here.
        ap = net.ap_head(F.pad(h, (0, 0, 0, GEMV_TAIL)))[:, : h.shape[1]]
        return framewise(net.f0_head, h), ap

    def _envelope(self, first: int, stop: int, f0: torch.Tensor, shift: int = 0) -> torch.Tensor:
        """The mel-cepstrum [B, n, 25] of the envelopes at t * 320 - shift, t = first..stop - 1, at F0 f0
        [B, n]: CheapTrick on the samples they reach, with one frame of zeros after them for the scalar
        tails of its elementwise ops."""
        start = max(0, first - ENVELOPE_CONTEXT - (1 if shift else 0))
        window = self._samples(start, stop)
        if shift:  # the window starts `shift` samples earlier (zeros before the signal)
            lead = self.buffer[..., max(0, start * HOP - shift - self.offset): start * HOP - self.offset]
            window = torch.cat([window.new_zeros(*window.shape[:-1], shift - lead.shape[-1]), lead, window], -1)
            window = window[..., : (stop - start) * HOP]
        before = first - start
        power = torch.stack([cheaptrick(w[0], torch.cat([f.new_zeros(before), f, f.new_zeros(1)]))[before:-1]
                             for w, f in zip(window, f0)])  # [B, n, bins]
        return framewise(lambda rows: (0.5 * rows) @ self.encoder.mcep_fit.T, power)


def _by_columns(fn, x: torch.Tensor) -> torch.Tensor:
    """fn of x [B, D, n] (frames along columns; fn multiplies each frame alone) with zero frames appended as
    `framewise` does, the memory laid out as the whole-signal pass lays its [B, D, T] out -> [B, D', n]."""
    b, d, n = x.shape
    return fn(F.pad(x, (0, padding_frames(b, n, d))))[..., :n]


# ----------------------------------------------------------------------------- decoder


@dataclass(frozen=True)
class SourceFilterDecoderConfig:
    """The synthesizer's settings (codec.source_filter.synthesis)."""

    n_fft: int = 1024  # length of each pulse's response
    envelopes: int = added_later(1)  # envelopes a frame (the encoder's): synthesized every 20 / envelopes ms

    def __post_init__(self) -> None:
        positive_ints("source_filter decoder", n_fft=self.n_fft)
        if self.n_fft < 256 or self.n_fft & (self.n_fft - 1):
            raise ValueError(f"source_filter decoder n_fft must be a power of two >= 256, got {self.n_fft}")
        _check_envelopes("decoder", self.envelopes)

    def check(self, codec) -> None:
        _check_frame_grid(codec, "decoder", self.envelopes)


@register_part("decoder", "source_filter", SourceFilterDecoderConfig)
class SourceFilterDecoder(nn.Module):
    """latent [B, 27 or 52, T] -> wav [B, 1, T * 320] by WORLD-style synthesis (codec.source_filter.synthesis) every
    20 / envelopes ms; no learned weights but `param_mean` [latent - 1], the parameters' training mean."""

    def __init__(self, n_fft: int = 1024, envelopes: int = 1):
        super().__init__()
        _check_envelopes("decoder", envelopes)
        self.envelopes = envelopes
        self.synth = SourceFilterSynth(16000, HOP // envelopes, n_fft)
        self.register_buffer("param_mean", torch.zeros(latent_dim(envelopes) - 1))

    @classmethod
    def from_config(cls, config: SourceFilterDecoderConfig, codec) -> "SourceFilterDecoder":
        return cls(config.n_fft, config.envelopes)

    def parameters_of(self, z: torch.Tensor, before: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """latent [D, T] -> the synthesizer's frames: (f0 [N] Hz float64, mel-cepstrum [N, 25], coded
        aperiodicity [N] dB). One envelope a frame: N = T. Two: the mid and centre frames interleaved,
        N = 2T, `before` the (f0, centre envelope, aperiodicity) of the frame before z's first; None at a
        signal's start, whose mid frame (before sample 0) is left out: N = 2T - 1. The F0 is float64 so
        that the running phase does not drift with the rounding of a chunk's elementwise ops."""
        params = z[1:].float().T + self.param_mean.float()
        f0 = f0_of_pitch(z[0].double())
        centre, ap = params[:, :MCEPS], params[:, -1] * AP_SCALE
        if self.envelopes == 1:
            return f0, centre, ap
        f0_before, centre_before, ap_before = (None, None, None) if before is None else before
        mid = params[:, MCEPS:2 * MCEPS] + 0.5 * previous(centre, centre_before, 0) + 0.5 * centre
        prev_ap = previous(ap, ap_before, 0)
        f0s = torch.stack([mid_f0(f0, f0_before), f0], 1).reshape(-1)
        mceps = torch.stack([mid, centre], 1).reshape(-1, MCEPS)
        aps = torch.stack([0.5 * (prev_ap + ap), ap], 1).reshape(-1)
        skip = 1 if before is None else 0
        return f0s[skip:], mceps[skip:], aps[skip:]

    def last_frame(self, z: torch.Tensor) -> tuple:
        """latent [D, T] -> `before` for the frames after it: its last frame's (f0, centre envelope, ap)."""
        params = z[1:, -1].float() + self.param_mean.float()
        return f0_of_pitch(z[0, -1:].double())[0], params[:MCEPS], params[-1] * AP_SCALE

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = z.detach().cpu()
        wav = []
        for zb in z:
            f0, mcep, ap = self.parameters_of(zb)
            if self.envelopes == 2:  # the last frame held over the half frame after it
                f0, mcep, ap = torch.cat([f0, f0[-1:]]), torch.cat([mcep, mcep[-1:]]), torch.cat([ap, ap[-1:]])
            wav.append(self.synth.synthesize(f0, mcep, ap))
        return torch.stack(wav)[:, None].to(self.param_mean.device)

    def streaming_step(self, exact: bool = False) -> "SourceFilterDecoderStream":
        return SourceFilterDecoderStream(self)


class SourceFilterDecoderStream:
    """latent frames -> audio: a sample is final once the next frame has come (`lookahead_samples`: one hop)."""

    def __init__(self, decoder: SourceFilterDecoder):
        self.decoder = decoder
        self.lookahead_samples = HOP
        self.streams: list[SynthStream] | None = None
        self.before: list | None = None  # per signal, the last frame's (f0, centre, ap) (two envelopes a frame)

    def step(self, z: torch.Tensor) -> torch.Tensor:
        z = z.detach().cpu()
        if self.streams is None:
            self.streams = [SynthStream(self.decoder.synth) for _ in range(z.shape[0])]
            self.before = [None] * z.shape[0]
        if z.shape[-1] == 0:
            return torch.zeros(z.shape[0], 1, 0)
        out = []
        for i, (s, zb) in enumerate(zip(self.streams, z)):
            out.append(s.push(*self.decoder.parameters_of(zb, self.before[i])))
            if self.decoder.envelopes == 2:
                self.before[i] = self.decoder.last_frame(zb)
        return torch.stack(out)[:, None].to(self.decoder.param_mean.device)

    def flush(self, batch: int) -> torch.Tensor:
        if self.streams is None:
            return torch.zeros(batch, 1, 0)
        out = []
        for s in self.streams:
            tail = s.push(s.f0[-1:], s.mcep[-1:], s.ap[-1:]) if self.decoder.envelopes == 2 else torch.zeros(0)
            out.append(torch.cat([tail, s.flush()]))
        return torch.stack(out)[:, None].to(self.decoder.param_mean.device)
