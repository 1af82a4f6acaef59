"""The codec: encoder -> residual vector quantizer -> decoder.

    codes = codec.encode(wav)    # wav [B, C, S] at codec.sample_rate -> LongTensor [B, N_c, ceil(S / hop)]
    wav = codec.decode(codes)    # codes [B, k, T], 1 <= k <= N_c   -> [B, C, T * hop]
    codec.streaming_encoder(), codec.streaming_decoder()  # the same, chunk by chunk (codec/core/streaming.py)

The encoder and decoder are registered parts (codec.core.parts), built from their configs.
A saved codec is a folder (`rvqlm_core.persistence`): `config.json` (the nested `CodecConfig`),
`model.safetensors` (every parameter and buffer, quantizer EMA statistics included; the decoder's
tensors optionally in half precision) and optionally `discriminator.safetensors`.
`fingerprint()` is a sha256 of the settings and all weights; `token_fingerprint()` covers only what
makes and means the tokens (encoder, quantizer, their settings), which files of tokens record.
`Codec` is an `AudioCodec` (codec.core.interface), as the Hugging Face adapters are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from codec.core.config import CodecConfig
from codec.core.discriminator import save_discriminator
from codec.core.int8 import int8_decoder_state, to_int8_decoder
from codec.core.interface import AudioCodec
from codec.core.parts import build_part
from codec.core.quantizer import QuantizerOutput, ResidualVectorQuantizer
from rvqlm_core.int8_linear import float_linear_state
from rvqlm_core.persistence import (CONFIG_FILE, WEIGHTS_FILE, FolderFormat, cpu_state, dequantized_state, load_state,
                                    read_folder, save_folder, stored_state)

DISCRIMINATOR_NAME = "discriminator.safetensors"
# Version 2: config.json nested by part; version 1 (flat) is read too (codec.core.config_v1).
FOLDER_FORMAT = FolderFormat("codec", "format", "rvqlm-codec", 2, extra_files=(DISCRIMINATOR_NAME,))


def weights_hash(settings: dict[str, Any], state: dict[str, torch.Tensor]) -> str:
    """sha256 hex of JSON `settings` and every tensor of `state` (name, dtype, shape, bytes, in name order):
    what codec fingerprints are made of (also the Hugging Face adapters', codec.hf.adapter)."""
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode())
    for name, tensor in sorted(state.items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"\n{name}:{t.dtype}:{tuple(t.shape)}\n".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def check_wav(wav: torch.Tensor, channels: int) -> None:
    """ValueError unless `wav` is a finite float waveform [B, `channels`, S] with B, S >= 1."""
    if not isinstance(wav, torch.Tensor):
        raise ValueError(f"expected a waveform tensor [B, C, S], got {type(wav).__name__}")
    if wav.dim() != 3:
        raise ValueError(f"expected a waveform shaped [B, C, S] (batch, channels, samples), got {tuple(wav.shape)}")
    if wav.shape[1] != channels:
        raise ValueError(f"this codec takes {channels}-channel audio, got {wav.shape[1]} channels "
                         f"(shape {tuple(wav.shape)})")
    if wav.shape[0] == 0 or wav.shape[-1] == 0:
        raise ValueError(f"empty waveform of shape {tuple(wav.shape)}")
    if not wav.is_floating_point():
        raise ValueError(f"expected float samples in [-1, 1], got dtype {wav.dtype}")
    if not torch.isfinite(wav).all():
        raise ValueError("waveform contains NaN or infinite samples")


def _is_decoder(name: str) -> bool:
    return name.startswith("decoder.")


@dataclass
class CodecOutput:
    """What `Codec.forward` returns (training path, with gradients).

    audio: [B, C, S] reconstruction, trimmed to the input length.
    quantizer: the QuantizerOutput (codes [B, k, T], commit_loss, usage metrics).
    """

    audio: torch.Tensor
    quantizer: QuantizerOutput


class Codec(AudioCodec):
    """Encoder + residual vector quantizer + decoder. See the module docstring for the API."""

    def __init__(self, config: CodecConfig | None = None):
        super().__init__()
        self.config = config = config or CodecConfig()
        self.encoder = build_part("encoder", config.encoder, config)
        q = config.quantizer
        self.quantizer = ResidualVectorQuantizer(
            config.latent_dim, q.n_codebooks, q.codebook_size, decay=q.ema_decay, kmeans_init=q.kmeans_init,
            kmeans_iters=q.kmeans_iters, dead_code_threshold=q.dead_code_threshold, quantizer_dropout=q.dropout,
            commitment_weight=q.commitment_weight)
        self.decoder = build_part("decoder", config.decoder, config)

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
        is zero padding at the signal's edges. Known, so `rvqlm tokenize` may cut long files into
        chunks widened by it (codec/tokenize/pieces.py).
        """
        return self.encoder.frame_span()

    @property
    def stream_refusal(self) -> str | None:
        """None for a causal codec; a codec that pads on both sides looks ahead and cannot stream."""
        if self.causal:
            return None
        return ("streaming needs a causal codec (config \"causal\": true); this one pads on both sides, "
                "so its frames look ahead")

    @property
    def receptive_field(self) -> int:
        """How many input samples one frame's codes depend on (past context + the frame + look-ahead)."""
        lo, hi = self.frame_span
        return hi - lo + 1

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
        q = self.quantizer(self.encoder(self.pad_to_hop(wav)), n_q=n_q)
        return CodecOutput(audio=self.decoder(q.quantized)[..., :length], quantizer=q)

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

    def streaming_encoder(self, n_q: int | None = None):
        """A `codec.core.streaming.StreamingEncoder`: audio chunk by chunk -> codes of each completed frame."""
        from codec.core.streaming import StreamingEncoder

        return StreamingEncoder(self, n_q=n_q)

    def streaming_decoder(self, exact: bool = False):
        """A `codec.core.streaming.StreamingDecoder`: codes frame by frame -> audio as soon as it is final."""
        from codec.core.streaming import StreamingDecoder

        return StreamingDecoder(self, exact=exact)

    def _check_wav(self, wav: torch.Tensor) -> None:
        check_wav(wav, self.channels)

    # ------------------------------------------------------------------ fingerprints and persistence

    def config_dict(self) -> dict[str, Any]:
        """The nested `CodecConfig` as JSON holds it."""
        return self.config.to_dict()

    @staticmethod
    def _hash(settings: dict[str, Any], state: dict[str, torch.Tensor]) -> str:
        return weights_hash(settings, state)

    def fingerprint(self) -> str:
        """sha256 hex of the settings that shape this codec (`CodecConfig.shaping_settings`) and every
        tensor of the state_dict (name, dtype, shape, bytes): this exact codec, decoder included."""
        return self._hash(self.config.shaping_settings(), self.state_dict())

    def token_fingerprint(self) -> str:
        """sha256 hex of what decides the token ids and what they mean: the shaping settings except the
        decoder's, and the encoder and quantizer tensors. A decoder-only fine-tune keeps it."""
        state = {k: v for k, v in self.state_dict().items() if not _is_decoder(k)}
        return self._hash(self.config.token_settings(), state)

    def save_pretrained(self, path: str | os.PathLike, discriminator: nn.Module | None = None,
                        decoder_dtype: torch.dtype | str | None = None) -> Path:
        """Write the codec (and `discriminator`, if given) to folder `path`, atomically
        (`rvqlm_core.persistence.save_folder`).

        decoder_dtype: store the decoder's floating-point tensors as "float16" or "bfloat16" (None /
        "float32": exactly); they load back as float32. The encoder and quantizer are always stored
        exactly, so `token_fingerprint()` is unchanged. The weights' `fingerprint` metadata is that
        of the codec as it will load. "int8": the decoder's linear layers as int8 with per-channel
        scales, loaded as an inference-only codec (codec.core.int8); an int8 codec saves as stored or dequantized.
        """
        state = float_linear_state(cpu_state(self))
        config = self.config.to_dict()
        if decoder_dtype == "int8":
            stored, as_loaded = int8_decoder_state(self, state)
            config["weight_dtype"] = "int8"
        else:
            stored = stored_state(state, decoder_dtype, "decoder_dtype", which=_is_decoder)
            as_loaded = {k: v.to(state[k].dtype) for k, v in stored.items()}
        fingerprint = self._hash(self.config.shaping_settings(), as_loaded)
        extra = {DISCRIMINATOR_NAME: lambda p: save_discriminator(discriminator, p)} if discriminator is not None else {}
        return save_folder(path, FOLDER_FORMAT, config, stored, metadata={"fingerprint": fingerprint}, extra=extra)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu") -> "Codec":
        """Load a folder written by `save_pretrained`. Clear errors for every way it can be wrong."""
        version = _folder_version(path)
        raw, state = read_folder(path, dataclasses.replace(FOLDER_FORMAT, version=version))
        weight_dtype = raw.pop("weight_dtype", "float")
        state, pairs = dequantized_state(state)
        if weight_dtype not in ("float", "int8") or bool(pairs) != (weight_dtype == "int8"):
            raise ValueError(f"{path}: weight_dtype {weight_dtype!r} does not describe its weights "
                             f"({len(pairs)} int8 tensors); export the codec again")
        read = CodecConfig.from_flat if version == 1 else CodecConfig.from_dict
        model = cls(read(raw, source=str(Path(path) / CONFIG_FILE)))
        load_state(model, state, Path(path) / WEIGHTS_FILE, may_cast=_is_decoder)
        if pairs:
            to_int8_decoder(model, pairs)
        return model.to(map_location).eval()


def _folder_version(path: str | os.PathLike) -> int:
    """1 for a folder of format version 1 (flat config.json), else this rvqlm's (read_folder checks it)."""
    try:
        return 1 if json.loads((Path(path) / CONFIG_FILE).read_text())["format_version"] == 1 else FOLDER_FORMAT.version
    except (OSError, ValueError, KeyError, TypeError):
        return FOLDER_FORMAT.version
