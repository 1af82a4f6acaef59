"""`AudioCodec`: the one codec interface (as Moshi's `CompressionModel`), what the CLI, the LMs' tools and
the tokenizer ask of any codec family; `load_codec` returns one.

    codes = codec.encode(wav)    # wav [B, C, S] at codec.sample_rate -> LongTensor [B, N_c, frames_for(S)]
    wav = codec.decode(codes)    # codes [B, k, T], 1 <= k <= N_c -> [B, C, T * hop]

Implemented by rvqlm's own codec (codec.core.model.Codec) and the Hugging Face adapters (codec.hf).
Every member without a body is abstract: a family that lacks one fails when it is built (TypeError),
not at its first call. Capabilities are properties: `stream_refusal` / `can_stream`, `frame_span` /
`tokenizes_whole_files`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from codec.core.config import bitrate_kbps


class AudioCodec(nn.Module, ABC):
    """An audio codec: waveforms to N_c codebooks of discrete codes per frame and back (module docstring)."""

    # ------------------------------------------------------------------ geometry

    @property
    @abstractmethod
    def sample_rate(self) -> int:
        """Samples per second of the audio it takes and gives."""

    @property
    @abstractmethod
    def channels(self) -> int:
        """C of the audio [B, C, S]."""

    @property
    @abstractmethod
    def hop_length(self) -> int:
        """Samples per frame."""

    @property
    @abstractmethod
    def frame_rate(self) -> float:
        """Frames per second: sample_rate / hop_length (an int where it is whole)."""

    @property
    @abstractmethod
    def n_codebooks(self) -> int:
        """N_c: the most codebooks `encode` gives."""

    @property
    @abstractmethod
    def codebook_size(self) -> int:
        """|V|: codes run 0..|V|-1."""

    @property
    @abstractmethod
    def causal(self) -> bool:
        """Whether a frame's codes depend on past and present samples only."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where its weights are."""

    def frames_for(self, samples: int) -> int:
        """T, the frames `encode` makes of `samples` samples: ceil(samples / hop)."""
        return math.ceil(samples / self.hop_length)

    def bitrate_kbps(self, n_q: float | None = None) -> float:
        """Bitrate with n_q (default N_c) codebooks; n_q may be a mean over examples."""
        return bitrate_kbps(self.frame_rate, self.n_codebooks if n_q is None else n_q, self.codebook_size)

    # ------------------------------------------------------------------ capabilities

    @property
    @abstractmethod
    def stream_refusal(self) -> str | None:
        """None where `streaming_encoder` / `streaming_decoder` work, else why not, in one line for the user."""

    @property
    def can_stream(self) -> bool:
        return self.stream_refusal is None

    @property
    @abstractmethod
    def frame_span(self) -> tuple[int, int] | None:
        """(lo, hi): frame t's codes depend exactly on samples t * hop + lo ... t * hop + hi; None where that
        is not known (then `rvqlm tokenize` encodes every file whole, codec.tokenize.pieces)."""

    @property
    def tokenizes_whole_files(self) -> bool:
        return self.frame_span is None

    # ------------------------------------------------------------------ codes

    @abstractmethod
    def encode(self, wav: torch.Tensor, n_q: int | None = None) -> torch.Tensor:
        """wav [B, C, S] float at `sample_rate` -> LongTensor [B, n_q (default N_c), frames_for(S)]."""

    @abstractmethod
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, k, T], 1 <= k <= N_c, values in 0..|V|-1 -> wav [B, C, T * hop] float."""

    @abstractmethod
    def streaming_encoder(self, n_q: int | None = None):
        """Audio chunk by chunk -> codes of each completed frame (codec.core.streaming); ValueError
        (`stream_refusal`) where it cannot stream."""

    @abstractmethod
    def streaming_decoder(self, exact: bool = False):
        """Codes frame by frame -> audio as soon as it is final; ValueError (`stream_refusal`) where it cannot."""

    # ------------------------------------------------------------------ identity

    @abstractmethod
    def config_dict(self) -> dict[str, Any]:
        """Its settings as JSON holds them (a token folder's codec.json records them)."""

    @abstractmethod
    def fingerprint(self) -> str:
        """sha256 hex of the settings and every weight: this exact codec."""

    @abstractmethod
    def token_fingerprint(self) -> str:
        """sha256 hex of what makes and means the codes (the decoder left out): files of tokens record it."""

    def accepts_tokens(self, fingerprint: str | None) -> bool:
        """Whether tokens recorded with `fingerprint` (a `.rvq` header, a token folder, an LM's config) are
        this codec's."""
        return fingerprint is not None and fingerprint == self.token_fingerprint()
