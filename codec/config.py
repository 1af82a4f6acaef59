"""CodecConfig: every setting that shapes a codec, validated, round-trippable to JSON; and the
bitrate arithmetic (frame rate x N_c x ceil(log2 |V|)), written once."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from rvqlm_core.settings import settings_from_dict

ENCODERS = ("seanet", "stft")
DECODERS = ("seanet", "istft")
ISTFT_PHASES = ("angle", "angle_vector")
# Settings of the STFT encoder and of the iSTFT decoder; they do not shape a SEANet one.
STFT_ENCODER_SETTINGS = ("encoder", "encoder_dim", "encoder_layers", "encoder_hop")
ISTFT_DECODER_SETTINGS = ("decoder", "decoder_dim", "decoder_layers", "istft_hop", "istft_n_fft", "istft_phase")
# Settings that only shape the decoder: they do not enter the token fingerprint.
DECODER_SETTINGS = (*ISTFT_DECODER_SETTINGS, "decoder_channels")
_POSITIVE = ("sample_rate", "channels", "encoder_channels", "decoder_channels", "latent_dim", "kernel_size",
             "residual_kernel_size", "last_kernel_size", "compress", "n_codebooks", "codebook_size",
             "decoder_dim", "decoder_layers", "istft_hop", "encoder_dim", "encoder_layers", "encoder_hop")


def bits_per_code(codebook_size: int) -> int:
    """ceil(log2 |V|): 0 for |V| = 1, 1 for 2, 10 for 1000 and 1024, 12 for 4096."""
    if codebook_size < 1:
        raise ValueError(f"codebook_size must be >= 1, got {codebook_size}")
    return math.ceil(math.log2(codebook_size))


def bitrate_kbps(frame_rate: float, n_codebooks: float, codebook_size: int) -> float:
    """Kilobits per second of N_c codebooks of |V| codes at `frame_rate` frames/s, ceil(log2 |V|) bits a code."""
    return frame_rate * n_codebooks * bits_per_code(codebook_size) / 1000


@dataclass(frozen=True)
class CodecConfig:
    """The architecture and quantizer settings of a `Codec`; the defaults are the project's default
    codec (16 kHz mono, hop 320 -> 50 frames/s, 8 codebooks of 1024 -> 4 kbps).
    docs/codec.md gives each field's reason."""

    sample_rate: int = 16000  # Hz
    channels: int = 1  # audio channels C
    strides: tuple[int, ...] = (4, 4, 5, 4)  # SEANet down/up-sampling factors; their product is the hop
    encoder_channels: int = 8  # SEANet encoder base width
    decoder_channels: int = 32  # SEANet decoder base width
    encoder_full_rate_residuals: bool = False  # residual units at the full sample rate in the encoder
    latent_dim: int = 64  # D, the quantized latent's width
    dilations: tuple[int, ...] = (1, 3, 9)  # of each SEANet residual unit's convolutions
    kernel_size: int = 7  # SEANet first-layer kernel
    residual_kernel_size: int = 3  # SEANet residual-unit kernel
    last_kernel_size: int = 7  # SEANet last-layer kernel
    compress: int = 2  # SEANet residual-unit bottleneck factor
    causal: bool = True  # all padding on the left: a prefix encodes to the whole file's first frames
    n_codebooks: int = 8  # N_c
    codebook_size: int = 1024  # |V|
    ema_decay: float = 0.99  # of the codebooks' EMA statistics
    kmeans_init: bool = True  # k-means on the first training batch
    kmeans_iters: int = 10  # Lloyd iterations of that k-means
    dead_code_threshold: float = 0.02  # EMA assignments per step under which a code is revived
    quantizer_dropout: float = 0.5  # share of training examples that use a random k in 1..N_c
    commitment_weight: float = 1.0  # weight of the commitment loss
    encoder: str = "seanet"  # one of ENCODERS
    encoder_dim: int = 256  # STFT encoder: ConvNeXt width
    encoder_layers: int = 6  # STFT encoder: ConvNeXt blocks
    encoder_hop: int = 80  # STFT encoder: hop of its input spectra (n_fft = 4 hops)
    decoder: str = "seanet"  # one of DECODERS
    decoder_dim: int = 384  # iSTFT decoder: ConvNeXt width
    decoder_layers: int = 8  # iSTFT decoder: ConvNeXt blocks
    istft_hop: int = 80  # iSTFT decoder: hop of its output spectra
    istft_n_fft: int | None = None  # iSTFT decoder: window and FFT size (None: 4 * istft_hop)
    istft_phase: str = "angle"  # iSTFT decoder: phase head, one of ISTFT_PHASES

    def __post_init__(self) -> None:
        # Accept lists (JSON, YAML) for the tuple fields, and keep the dataclass hashable.
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        object.__setattr__(self, "dilations", tuple(int(d) for d in self.dilations))
        for name in _POSITIVE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CodecConfig.{name} must be a positive integer, got {value!r}")
        if not self.strides or any(s < 1 for s in self.strides):
            raise ValueError(f"CodecConfig.strides must be positive integers, got {self.strides}")
        if any(d < 1 for d in self.dilations):
            raise ValueError(f"CodecConfig.dilations must be positive integers, got {self.dilations}")
        if self.codebook_size < 2:
            raise ValueError(f"CodecConfig.codebook_size must be >= 2, got {self.codebook_size}")
        for name, allowed in (("encoder", ENCODERS), ("decoder", DECODERS), ("istft_phase", ISTFT_PHASES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"CodecConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        self._check_hops()

    def _check_hops(self) -> None:
        if self.encoder == "stft" and self.hop_length % self.encoder_hop:
            raise ValueError(f"CodecConfig.encoder_hop {self.encoder_hop} must divide hop_length {self.hop_length}")
        if self.decoder == "istft" and self.hop_length % self.istft_hop:
            raise ValueError(f"CodecConfig.istft_hop {self.istft_hop} must divide hop_length {self.hop_length}")
        n_fft = self.istft_n_fft
        if n_fft is not None and (isinstance(n_fft, bool) or not isinstance(n_fft, int) or n_fft < 2 * self.istft_hop
                                  or n_fft % 2):
            raise ValueError(f"CodecConfig.istft_n_fft must be None or an even integer >= 2 * istft_hop "
                             f"({2 * self.istft_hop}), got {n_fft!r}")
        if self.sample_rate % self.hop_length:
            raise ValueError(f"sample_rate {self.sample_rate} is not a multiple of hop_length {self.hop_length}; "
                             "frame_rate would not be an integer")

    @property
    def hop_length(self) -> int:
        return math.prod(self.strides)

    @property
    def istft_window(self) -> int:
        """The iSTFT decoder's n_fft: `istft_n_fft`, or 4 * istft_hop when unset."""
        return self.istft_n_fft or 4 * self.istft_hop

    @property
    def frame_rate(self) -> int:
        return self.sample_rate // self.hop_length

    @property
    def bitrate_kbps(self) -> float:
        """Bitrate with all N_c codebooks."""
        return bitrate_kbps(self.frame_rate, self.n_codebooks, self.codebook_size)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["strides"], d["dilations"] = list(self.strides), list(self.dilations)
        return d

    def shaping_settings(self) -> dict[str, Any]:
        """`to_dict()` without the settings that do not shape this codec, the dict its fingerprints hash:
        a SEANet encoder leaves out `STFT_ENCODER_SETTINGS`, a SEANet decoder `ISTFT_DECODER_SETTINGS`,
        and `istft_phase` is left out at its default "angle"."""
        settings = self.to_dict()
        unused = (STFT_ENCODER_SETTINGS if self.encoder == "seanet" else ()) + \
                 (ISTFT_DECODER_SETTINGS if self.decoder == "seanet" else ())
        if self.istft_phase == "angle":
            unused += ("istft_phase",)
        return {k: v for k, v in settings.items() if k not in unused}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "codec config") -> "CodecConfig":
        """Build from a dict of the fields, refusing unknown keys by name."""
        return settings_from_dict(cls, d, source)
