"""The codec: SEANet encoder -> residual vector quantizer -> SEANet decoder.

    codes = codec.encode(wav)    # wav [B, C, S] at codec.sample_rate -> LongTensor [B, N_c, ceil(S / hop)]
    wav = codec.decode(codes)    # codes [B, k, T], 1 <= k <= N_c   -> [B, C, T * hop]

A saved codec is a folder holding `config.json` (the `CodecConfig` fields) and
`model.safetensors` (every parameter and buffer, quantizer EMA statistics included), optionally
`discriminator.safetensors` for adversarial fine-tuning. Nothing is ever unpickled. The decoder's
tensors may be stored in half precision (`save_pretrained(..., decoder_dtype="float16")`, which the
shipped codec uses: 97 % of its bytes are the decoder's); they load back as float32, and the
encoder and quantizer, which make the tokens, are always stored exactly.
`codec.fingerprint()` is a sha256 of the config and all weights; `codec.token_fingerprint()` covers
only what makes and means the tokens (encoder, quantizer, their settings). Files of tokens (`.rvq`
files, token shards, language models) record the token fingerprint, so they are never decoded with
another codec's decoder, yet stay valid when only the decoder was fine-tuned.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils import parametrize

from codec.discriminator import save_discriminator
from codec.istft_decoder import ISTFTDecoder
from codec.stft_encoder import STFTEncoder
from codec.modules import SEANetDecoder, SEANetEncoder
from codec.quantizer import QuantizerOutput, ResidualVectorQuantizer
from rvqlm_core.atomic import refuse_foreign_folder, usual_permissions
from rvqlm_core.weight_dtype import loads_as, storage_dtype

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
DISCRIMINATOR_NAME = "discriminator.safetensors"
FORMAT_NAME = "rvqlm-codec"
FORMAT_VERSION = 1
ENCODERS = ("seanet", "stft")
DECODERS = ("seanet", "istft")
ISTFT_ONLY_SETTINGS = ("decoder", "decoder_dim", "decoder_layers", "istft_hop", "istft_n_fft")
STFT_ONLY_SETTINGS = ("encoder", "encoder_dim", "encoder_layers", "encoder_hop")
# Settings that only shape the decoder: they do not enter the token fingerprint.
DECODER_SETTINGS = ("decoder", "decoder_dim", "decoder_layers", "istft_hop", "istft_n_fft", "istft_phase",
                    "decoder_channels")
ISTFT_PHASES = ("angle", "angle_vector")


@dataclass(frozen=True)
class CodecConfig:
    """Architecture and quantizer settings. The defaults are the project's default codec.

    16 kHz mono, hop 320 (strides 4*4*5*4) -> 50 frames/s; 8 codebooks of 1024 -> 4 kbps.
    The encoder is deliberately light (8 base channels and no residual units at the full sample
    rate, where tiny convolutions dominate CPU time: it must tokenize >= 100x real time on a 2-core
    CPU; a first stride of 4 quarters the rate of the next level) and the decoder heavier
    (32 base channels), as SoundStream found that decoder capacity matters more. `causal` puts all
    padding on the left in encoder and decoder: a prefix encodes to the same first frames as the
    whole file, so prompts and streaming chunks get exactly the tokens the full file would.
    `dead_code_threshold` is an EMA count of assignments per step: a CPU batch of ~200-400 frames
    gives each of 1024 codes ~0.2-0.4 on average, so EnCodec's 2.0 (made for ~5000 frames a step)
    would call every code dead and re-seed the codebooks at every step; 0.02 flags codes used
    about 10x less than uniform usage. `quantizer_dropout` 0.5: half the examples train a random
    bitrate, half the full one (DAC found dropping on every example costs full-bitrate quality).
    `istft_phase` chooses how the iSTFT decoder emits phases (codec/istft_decoder.py): "angle",
    or "angle_vector" (an angle turned by a predicted 2-D vector's direction). `istft_n_fft` is the
    iSTFT decoder's window and FFT size (None: 4 * istft_hop, 20 ms at the defaults). A longer window
    resolves pitch harmonics in the predicted magnitudes (640 at 16 kHz: 40 ms, 25 Hz bins) at the
    cost of look-ahead (istft_n_fft / 2 samples).
    """

    sample_rate: int = 16000
    channels: int = 1
    strides: tuple[int, ...] = (4, 4, 5, 4)
    encoder_channels: int = 8
    decoder_channels: int = 32
    encoder_full_rate_residuals: bool = False
    latent_dim: int = 64
    dilations: tuple[int, ...] = (1, 3, 9)
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 7
    compress: int = 2
    causal: bool = True
    n_codebooks: int = 8
    codebook_size: int = 1024
    ema_decay: float = 0.99
    kmeans_init: bool = True
    kmeans_iters: int = 10
    dead_code_threshold: float = 0.02
    quantizer_dropout: float = 0.5
    commitment_weight: float = 1.0
    encoder: str = "seanet"
    encoder_dim: int = 256
    encoder_layers: int = 6
    encoder_hop: int = 80
    decoder: str = "seanet"
    decoder_dim: int = 384
    decoder_layers: int = 8
    istft_hop: int = 80
    istft_n_fft: int | None = None
    istft_phase: str = "angle"

    def __post_init__(self) -> None:
        # Accept lists (JSON, YAML) for the tuple fields, and keep the dataclass hashable.
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        object.__setattr__(self, "dilations", tuple(int(d) for d in self.dilations))
        positive = ("sample_rate", "channels", "encoder_channels", "decoder_channels", "latent_dim", "kernel_size",
                    "residual_kernel_size", "last_kernel_size", "compress", "n_codebooks", "codebook_size",
                    "decoder_dim", "decoder_layers", "istft_hop", "encoder_dim", "encoder_layers", "encoder_hop")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CodecConfig.{name} must be a positive integer, got {value!r}")
        if not self.strides or any(s < 1 for s in self.strides):
            raise ValueError(f"CodecConfig.strides must be positive integers, got {self.strides}")
        if any(d < 1 for d in self.dilations):
            raise ValueError(f"CodecConfig.dilations must be positive integers, got {self.dilations}")
        if self.codebook_size < 2:
            raise ValueError(f"CodecConfig.codebook_size must be >= 2, got {self.codebook_size}")
        if self.encoder not in ENCODERS:
            raise ValueError(f"CodecConfig.encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.encoder == "stft" and self.hop_length % self.encoder_hop:
            raise ValueError(f"CodecConfig.encoder_hop {self.encoder_hop} must divide hop_length {self.hop_length}")
        if self.decoder not in DECODERS:
            raise ValueError(f"CodecConfig.decoder must be one of {DECODERS}, got {self.decoder!r}")
        if self.istft_phase not in ISTFT_PHASES:
            raise ValueError(f"CodecConfig.istft_phase must be one of {ISTFT_PHASES}, got {self.istft_phase!r}")
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
        """Bitrate with all N_c codebooks, counting ceil(log2 |V|) bits per code."""
        return self.n_codebooks * math.ceil(math.log2(self.codebook_size)) * self.frame_rate / 1000

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["strides"], d["dilations"] = list(self.strides), list(self.dilations)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "config") -> "CodecConfig":
        """Build from a dict, refusing unknown keys by name (a typo must not silently become a default)."""
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object of codec settings, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{source}: unknown codec config keys {unknown}; known keys: {sorted(known)}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(f"{source}: invalid codec config ({e})") from None


@dataclass
class CodecOutput:
    """What `Codec.forward` returns (training path, with gradients).

    audio: [B, C, S] reconstruction, trimmed to the input length.
    quantizer: the QuantizerOutput (codes [B, k, T], commit_loss, usage metrics).
    latent: [B, D, T] encoder output before quantization.
    spectrum: the iSTFT decoder's predicted complex spectra [B * C, bins, T * hop / istft_hop]
        (frame j centred on sample j * istft_hop), or None for other decoders.
    """

    audio: torch.Tensor
    quantizer: QuantizerOutput
    latent: torch.Tensor = field(repr=False)
    spectrum: torch.Tensor | None = field(default=None, repr=False)


class Codec(nn.Module):
    """Encoder + residual vector quantizer + decoder. See the module docstring for the API."""

    def __init__(self, config: CodecConfig | None = None):
        super().__init__()
        self.config = config = config or CodecConfig()
        common = dict(channels=config.channels, latent_dim=config.latent_dim, strides=config.strides,
                      dilations=config.dilations, kernel_size=config.kernel_size,
                      residual_kernel_size=config.residual_kernel_size, last_kernel_size=config.last_kernel_size,
                      compress=config.compress, causal=config.causal)
        if config.encoder == "stft":
            self.encoder = STFTEncoder(config.channels, config.latent_dim, config.hop_length, config.encoder_hop,
                                       dim=config.encoder_dim, n_layers=config.encoder_layers, causal=config.causal)
        else:
            self.encoder = SEANetEncoder(base_channels=config.encoder_channels,
                                         full_rate_residuals=config.encoder_full_rate_residuals, **common)
        self.quantizer = ResidualVectorQuantizer(
            config.latent_dim, config.n_codebooks, config.codebook_size, decay=config.ema_decay,
            kmeans_init=config.kmeans_init, kmeans_iters=config.kmeans_iters,
            dead_code_threshold=config.dead_code_threshold, quantizer_dropout=config.quantizer_dropout,
            commitment_weight=config.commitment_weight)
        if config.decoder == "istft":
            self.decoder = ISTFTDecoder(config.channels, config.latent_dim, config.hop_length, config.istft_hop,
                                        dim=config.decoder_dim, n_layers=config.decoder_layers, causal=config.causal,
                                        phase=config.istft_phase, n_fft=config.istft_window)
        else:
            self.decoder = SEANetDecoder(base_channels=config.decoder_channels, **common)

    # ------------------------------------------------------------------ properties

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def channels(self) -> int:
        return self.config.channels

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    @property
    def frame_rate(self) -> int:
        return self.config.frame_rate

    @property
    def n_codebooks(self) -> int:
        return self.config.n_codebooks

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @property
    def causal(self) -> bool:
        return self.config.causal

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def frame_span(self) -> tuple[int, int]:
        """(lo, hi): frame t's codes depend exactly on samples t * hop + lo ... t * hop + hi (lo <= 0).

        -lo samples of past context, hi - hop + 1 of look-ahead (0 when causal). Anything outside
        is zero padding at the signal's edges.
        """
        return self.encoder.frame_span()

    @property
    def receptive_field(self) -> int:
        """How many input samples one frame's codes depend on (past context + the frame + look-ahead)."""
        lo, hi = self.frame_span
        return hi - lo + 1

    def bitrate_kbps(self, n_q: float | None = None) -> float:
        n_q = self.n_codebooks if n_q is None else n_q
        return n_q * math.ceil(math.log2(self.codebook_size)) * self.frame_rate / 1000

    # ------------------------------------------------------------------ training path

    def pad_to_hop(self, wav: torch.Tensor) -> torch.Tensor:
        """Zero-pad [..., S] on the right to a multiple of hop_length."""
        extra = (-wav.shape[-1]) % self.hop_length
        return torch.nn.functional.pad(wav, (0, extra)) if extra else wav

    def forward(self, wav: torch.Tensor, n_q: int | None = None) -> CodecOutput:
        """Training / evaluation pass with gradients. wav [B, C, S] -> CodecOutput (audio [B, C, S]).

        In train mode the quantizer updates its codebooks and applies quantizer dropout (unless n_q
        is given); in eval mode it uses n_q (default all) codebooks.
        """
        self._check_wav(wav)
        length = wav.shape[-1]
        latent = self.encoder(self.pad_to_hop(wav))
        q = self.quantizer(latent, n_q=n_q)
        if isinstance(self.decoder, ISTFTDecoder):
            spectrum = self.decoder.spectrum(q.quantized)
            audio = self.decoder.synthesize(spectrum, wav.shape[0])[..., :length]
        else:
            spectrum, audio = None, self.decoder(q.quantized)[..., :length]
        return CodecOutput(audio=audio, quantizer=q, latent=latent, spectrum=spectrum)

    # ------------------------------------------------------------------ inference API

    @torch.inference_mode()
    def encode(self, wav: torch.Tensor, n_q: int | None = None) -> torch.Tensor:
        """wav [B, C, S] float at `sample_rate` -> LongTensor [B, n_q (default N_c), ceil(S / hop)].

        The input is moved to the codec's device and zero-padded on the right to a whole frame.
        """
        self._check_wav(wav)
        wav = self.pad_to_hop(wav.to(self.device, torch.float32))
        with parametrize.cached():  # weight-norm weights computed once per call, not per layer use
            return self.quantizer.encode(self.encoder(wav), n_q=n_q)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, k, T] with 1 <= k <= N_c, values in 0..|V|-1 -> wav [B, C, T * hop] float."""
        if not isinstance(codes, torch.Tensor) or codes.dim() != 3:
            shape = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise ValueError(f"decode expects codes shaped [B, k, T], got {shape}")
        if codes.shape[-1] == 0 or codes.shape[0] == 0:
            raise ValueError(f"decode got an empty code tensor of shape {tuple(codes.shape)}")
        latent = self.quantizer.decode(codes.to(self.device))
        with parametrize.cached():
            return self.decoder(latent)

    def _check_wav(self, wav: torch.Tensor) -> None:
        if not isinstance(wav, torch.Tensor):
            raise ValueError(f"expected a waveform tensor [B, C, S], got {type(wav).__name__}")
        if wav.dim() != 3:
            raise ValueError(f"expected a waveform shaped [B, C, S] (batch, channels, samples), got {tuple(wav.shape)}")
        if wav.shape[1] != self.channels:
            raise ValueError(f"this codec takes {self.channels}-channel audio, got {wav.shape[1]} channels "
                             f"(shape {tuple(wav.shape)})")
        if wav.shape[0] == 0 or wav.shape[-1] == 0:
            raise ValueError(f"empty waveform of shape {tuple(wav.shape)}")
        if not wav.is_floating_point():
            raise ValueError(f"expected float samples in [-1, 1], got dtype {wav.dtype}")
        if not torch.isfinite(wav).all():
            raise ValueError("waveform contains NaN or infinite samples")

    # ------------------------------------------------------------------ persistence

    def _settings_for_fingerprint(self) -> dict[str, Any]:
        settings = self.config.to_dict()
        if settings["decoder"] == "seanet":
            # Codecs saved before the iSTFT decoder existed keep their fingerprints (tokens, LMs and
            # .rvq files record it): the iSTFT settings do not exist for a SEANet decoder.
            for key in ISTFT_ONLY_SETTINGS:
                settings.pop(key)
        if settings["encoder"] == "seanet":
            # Likewise for codecs saved before the STFT encoder existed.
            for key in STFT_ONLY_SETTINGS:
                settings.pop(key)
        if settings.get("istft_phase") == "angle":
            settings.pop("istft_phase")  # and before the phase options existed
        if settings.get("istft_n_fft", 0) is None:
            settings.pop("istft_n_fft")  # and before the window size was a setting
        return settings

    @staticmethod
    def _hash(settings: dict[str, Any], state: dict[str, torch.Tensor]) -> str:
        h = hashlib.sha256()
        h.update(json.dumps(settings, sort_keys=True).encode())
        for name, tensor in sorted(state.items()):
            t = tensor.detach().to("cpu").contiguous()
            h.update(f"\n{name}:{t.dtype}:{tuple(t.shape)}\n".encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()

    def fingerprint(self) -> str:
        """sha256 hex of the config JSON and every tensor of the state_dict (name, dtype, shape, bytes):
        this exact codec, decoder included."""
        return self._hash(self._settings_for_fingerprint(), self.state_dict())

    def token_fingerprint(self) -> str:
        """sha256 hex of what decides the token ids and what they mean: the settings except the
        decoder's, and the encoder and quantizer tensors (codebooks and their statistics).

        Files of tokens (`.rvq`, token shards, language models) record it: a codec whose decoder was
        fine-tuned (`train-codec --model.train_decoder_only true`) has a new `fingerprint` but the same
        `token_fingerprint`, so it decodes and generates with them. Files written before this existed
        hold the full fingerprint; `accepts_tokens` takes either.
        """
        settings = {k: v for k, v in self._settings_for_fingerprint().items() if k not in DECODER_SETTINGS}
        state = {k: v for k, v in self.state_dict().items() if not k.startswith("decoder.")}
        return self._hash(settings, state)

    def accepts_tokens(self, fingerprint: str | None) -> bool:
        """Whether tokens recorded with `fingerprint` are this codec's: its token fingerprint, or (files
        written before token fingerprints existed) its full fingerprint."""
        # The full fingerprint hashes every decoder weight too: computed only when the token one fails.
        return fingerprint is not None and (fingerprint == self.token_fingerprint() or fingerprint == self.fingerprint())

    def save_pretrained(self, path: str | os.PathLike, discriminator: nn.Module | None = None,
                        decoder_dtype: torch.dtype | str | None = None) -> Path:
        """Write `config.json` + `model.safetensors` (+ `discriminator.safetensors`) to folder `path`.

        Atomic: everything is written to a temporary sibling folder that is then renamed into
        place, so `path` never holds a half-written codec. An existing `path` is replaced only if it
        holds nothing but a saved codec's files.

        decoder_dtype: store the decoder's floating-point tensors as "float16" or "bfloat16" (None /
        "float32": exactly). Half the file; `from_pretrained` loads them back as float32, so the
        loaded codec decodes within rounding of this one. Tokens are unaffected: the encoder and the
        quantizer are stored exactly, so `token_fingerprint()` is the same before and after. The
        file's `fingerprint` metadata is that of the codec as it will load.
        """
        dtype = storage_dtype(decoder_dtype, "decoder_dtype")
        dest = Path(path)
        refuse_foreign_folder(dest, (CONFIG_NAME, WEIGHTS_NAME, DISCRIMINATOR_NAME), "a saved codec")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            config = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **self.config.to_dict()}
            (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            state = _cpu_state(self)
            stored = {k: v.to(dtype) if k.startswith("decoder.") and v.is_floating_point() else v
                      for k, v in state.items()}
            as_loaded = {k: v.to(state[k].dtype) for k, v in stored.items()}
            fingerprint = self._hash(self._settings_for_fingerprint(), as_loaded)
            save_file(stored, str(tmp / WEIGHTS_NAME), metadata={"fingerprint": fingerprint})
            if discriminator is not None:
                save_discriminator(discriminator, tmp / DISCRIMINATOR_NAME)
            usual_permissions(tmp)
            old = None
            if dest.exists():
                old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
                os.replace(dest, old)
            os.replace(tmp, dest)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu") -> "Codec":
        """Load a folder written by `save_pretrained`. Clear errors for every way it can be wrong."""
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"no codec folder at {folder}")
        config_path, weights_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
        for p in (config_path, weights_path):
            if not p.is_file():
                raise FileNotFoundError(f"{folder} is not a saved codec: {p.name} is missing")
        try:
            raw = json.loads(config_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{config_path}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{config_path}: expected a JSON object")
        fmt, version = raw.pop("format", FORMAT_NAME), raw.pop("format_version", FORMAT_VERSION)
        if fmt != FORMAT_NAME:
            raise ValueError(f"{config_path}: format {fmt!r} is not {FORMAT_NAME!r}")
        if version != FORMAT_VERSION:
            raise ValueError(f"{config_path}: codec format version {version} is not supported "
                             f"(this rvqlm reads version {FORMAT_VERSION})")
        config = CodecConfig.from_dict(raw, source=str(config_path))
        model = cls(config)
        try:
            state = load_file(str(weights_path), device="cpu")
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"{weights_path}: not a readable safetensors file ({e})") from None
        expected = model.state_dict()
        _check_state(expected, state, weights_path)
        # A half-precision decoder (save_pretrained's decoder_dtype) loads back as float32.
        state = {k: v.to(expected[k].dtype) for k, v in state.items()}
        model.load_state_dict(state, strict=True)
        return model.to(map_location).eval()


def _cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in module.state_dict().items()}


def _check_state(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], source: Path) -> None:
    """Compare a loaded state dict with the model's; raise one ValueError listing every problem."""
    problems = []
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing:
        problems.append(f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    for name in sorted(set(expected) & set(found)):
        if expected[name].shape != found[name].shape:
            problems.append(f"{name} has shape {tuple(found[name].shape)}, the config needs {tuple(expected[name].shape)}")
        elif expected[name].dtype != found[name].dtype and not (
                name.startswith("decoder.") and loads_as(found[name].dtype, expected[name].dtype)):
            problems.append(f"{name} has dtype {found[name].dtype}, expected {expected[name].dtype}")
    if problems:
        raise ValueError(f"{source} does not match its config.json: " + "; ".join(problems[:8]))

