"""Pieces: what one encoder call sees of a file, cut so that chunked, batched tokens are exact.

A file of T frames (`S` samples zero-padded to `T * hop`) is one piece if T <= `chunk_frames`, else
consecutive chunks of `chunk_frames` core frames, each widened by the encoder's exact context
(`AudioCodec.frame_span`): L frames of past and R frames of look-ahead. A frame is kept only from a
piece in which its whole receptive field is real signal (or the file's true edge, where the
full-file encode sees zero padding too), so the tokens are those of encoding the whole file at
once, whatever the chunk size. Pieces are encoded in zero-padded batches (`encode_pieces`,
`batches`); frames near a file's true end in a padded batch would see the batch padding, so for a
non-causal codec the last R frames are re-encoded from an unpadded tail piece (`Plan.tail`).

A codec without a known finite receptive field (`frame_span` None, `tokenizes_whole_files`: the
Hugging Face adapters, codec/hf/adapter.py) gets a `WholeFilePlan` instead: every file is one unpadded piece, encoded alone, so its
tokens are the codec's `encode` of the whole file (a long file's blocks are joined in memory first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from codec.core.audio import AudioError
from codec.core.interface import AudioCodec


@dataclass
class Piece:
    """Frames [start, stop) of file `index`'s padded signal, of which [keep_lo, keep_hi) are kept.

    wav: [C, (stop - start) * hop]. at_end: `stop` is the file's true last frame.
    """

    index: int
    start: int
    stop: int
    keep_lo: int
    keep_hi: int
    wav: torch.Tensor
    at_end: bool

    @property
    def frames(self) -> int:
        return self.stop - self.start


@dataclass
class Plan:
    """Frame geometry shared by all pieces."""

    hop: int
    left: int  # L: frames of past context a frame needs
    right: int  # R: frames of look-ahead a frame needs (0 for a causal encoder)
    chunk_frames: int

    @classmethod
    def for_codec(cls, codec: AudioCodec, chunk_seconds: float) -> "Plan | WholeFilePlan":
        if codec.tokenizes_whole_files:
            return WholeFilePlan(hop=codec.hop_length, frames_for=codec.frames_for)
        lo, hi = codec.frame_span
        hop = codec.hop_length
        chunk_frames = max(1, int(round(chunk_seconds * codec.frame_rate)))
        return cls(hop=hop, left=math.ceil(-lo / hop), right=max(0, math.ceil((hi + 1) / hop) - 1),
                   chunk_frames=chunk_frames)

    def frames(self, samples: int) -> int:
        """Frames of a file of `samples` samples: ceil(samples / hop)."""
        return math.ceil(samples / self.hop)

    def encode(self, codec: AudioCodec, pieces: list[Piece]) -> list[tuple[Piece, np.ndarray]]:
        """`encode_pieces` of one batch."""
        return encode_pieces(codec, pieces, self)

    def whole(self, index: int, wav: torch.Tensor) -> Iterator[Piece]:
        """Pieces of a file held in memory: wav [C, S]."""
        return self.stream(index, iter([wav]))

    def stream(self, index: int, blocks: Iterator[torch.Tensor]) -> Iterator[Piece]:
        """Pieces of a file given as consecutive sample blocks [C, s_i]; keeps O(chunk) samples.

        The last yielded item is the file's length in samples (an int), once the stream ends.
        """
        buf: list[torch.Tensor] = []
        buf_start = 0  # sample index of buf[0][:, 0]
        buf_len = 0
        core = 0  # first frame of the next core
        hop, L, R, N = self.hop, self.left, self.right, self.chunk_frames
        total = 0
        for block in blocks:
            buf.append(block)
            buf_len += block.shape[1]
            total += block.shape[1]
            # Emit full chunks while the buffer reaches past their look-ahead (and a bit more, so
            # the last chunk is never emitted before we know whether the file ends right there).
            while (core + N + R) * hop < buf_start + buf_len:
                lo, hi = max(0, core - L), core + N + R
                wav = torch.cat(buf, dim=1)
                yield Piece(index, lo, hi, core, core + N, wav[:, lo * hop - buf_start : hi * hop - buf_start], False)
                core += N
                keep_from = max(0, core - L) * hop
                buf, buf_len = [wav[:, keep_from - buf_start :]], buf_start + buf_len - keep_from
                buf_start = keep_from
        if total == 0:
            raise AudioError("<stream>", "no samples decoded")
        n_frames = math.ceil(total / hop)
        lo = max(0, core - L)
        wav = torch.cat(buf, dim=1)[:, lo * hop - buf_start :]
        wav = torch.nn.functional.pad(wav, (0, (n_frames - lo) * hop - wav.shape[1]))
        yield Piece(index, lo, n_frames, core, n_frames, wav, True)
        yield total

    def tail(self, p: Piece) -> Piece:
        """An unpadded piece that recomputes the last R frames of an end piece."""
        lo = max(0, p.stop - self.left - self.right)
        keep_lo = max(p.keep_lo, p.stop - self.right)
        wav = p.wav[:, (lo - p.start) * self.hop :]
        return Piece(p.index, lo, p.stop, keep_lo, p.stop, wav, True)


@dataclass
class WholeFilePlan:
    """Every file one piece of all its samples, unpadded, encoded alone (module docstring)."""

    hop: int
    frames_for: Callable[[int], int]  # the codec's frames of S samples
    left: int = 0
    right: int = 0  # no tail pieces

    def frames(self, samples: int) -> int:
        return self.frames_for(samples)

    def whole(self, index: int, wav: torch.Tensor) -> Iterator[Piece]:
        return self.stream(index, iter([wav]))

    def stream(self, index: int, blocks: Iterator[torch.Tensor]) -> Iterator[Piece]:
        """One piece of the joined blocks [C, S], then S."""
        parts = [b for b in blocks if b.shape[1]]
        if not parts:
            raise AudioError("<stream>", "no samples decoded")
        wav = torch.cat(parts, dim=1)
        n = self.frames_for(wav.shape[1])
        yield Piece(index, 0, n, 0, n, wav, True)
        yield wav.shape[1]

    def encode(self, codec, pieces: list[Piece]) -> list[tuple[Piece, np.ndarray]]:
        """Each piece in a call of its own -> [(piece, codes [T, N_c])]."""
        out = []
        for p in pieces:
            codes = codec.encode(p.wav[None].to(codec.device))[0].cpu()  # [N_c, T]
            out.append((p, codes.T.numpy()))
        return out


def encode_pieces(codec: AudioCodec, pieces: list[Piece], plan: Plan) -> list[tuple[Piece, np.ndarray]]:
    """Encode pieces in one zero-padded batch -> [(piece, codes [keep_hi - keep_lo, N_c])].

    End pieces shorter than the batch lose their last R frames here; the caller re-encodes those
    with `plan.tail` pieces (grouped so that they need no padding).
    """
    longest = max(p.frames for p in pieces)
    wav = torch.zeros(len(pieces), pieces[0].wav.shape[0], longest * plan.hop)
    for i, p in enumerate(pieces):
        wav[i, :, : p.wav.shape[1]] = p.wav
    codes = codec.encode(wav.to(codec.device)).cpu()  # [B, N_c, longest]
    out = []
    for i, p in enumerate(pieces):
        hi = p.keep_hi
        if p.at_end and p.frames < longest:
            hi = max(p.keep_lo, p.keep_hi - plan.right)
        if hi > p.keep_lo:
            out.append((p, codes[i, :, p.keep_lo - p.start : hi - p.start].T.numpy()))
    return out


def batches(pieces: list[Piece], batch_frames: int) -> Iterator[list[Piece]]:
    """Cut pieces sorted by decreasing length into batches whose padded size <= batch_frames."""
    batch: list[Piece] = []
    for p in pieces:
        if batch and (len(batch) + 1) * batch[0].frames > batch_frames:
            yield batch
            batch = []
        batch.append(p)
    if batch:
        yield batch
