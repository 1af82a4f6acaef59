"""Codebook interleaving patterns: how N_c parallel code streams become one sequence of model steps.

A frame holds N_c codes (one per RVQ codebook). The LM predicts, at every step s, one id per
codebook; a pattern decides which frame each codebook's id at step s comes from.

* parallel: step s holds frame s of every codebook. S = T steps; all codebooks of a frame are
  predicted at once, each without seeing the others.
* delay (MusicGen): codebook k is shifted right by k steps, so step s holds codebook k of frame
  s - k. S = T + N_c - 1 steps. When codebook k of frame t is predicted, codebooks 0..k-1 of
  the same frame are already in the context. Positions with s - k outside 0..T-1 hold no code
  and are marked invalid (filled with `fill_id`, left out of the loss).

    delay, N_c = 3, T = 4 (digits are frame indices, . is invalid):
        k=0:  0 1 2 3 . .
        k=1:  . 0 1 2 3 .
        k=2:  . . 0 1 2 3
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor


class CodebookPattern(ABC):
    """Builds [B, N_c, S] step sequences from [B, N_c, T] frames and reverts them exactly."""

    name: str

    def __init__(self, n_codebooks: int):
        if n_codebooks < 1:
            raise ValueError(f"n_codebooks must be >= 1, got {n_codebooks}")
        self.n_codebooks = n_codebooks

    @abstractmethod
    def delays(self) -> list[int]:
        """Step offset of each codebook: codebook k of frame t sits at step t + delays[k]."""

    def sequence_length(self, n_frames: int) -> int:
        return n_frames + max(self.delays())

    def num_frames(self, seq_len: int) -> int:
        """Inverse of sequence_length: frames held by a sequence of seq_len steps (may be 0)."""
        return max(seq_len - max(self.delays()), 0)

    def valid(self, n_frames: int, device: torch.device | str | None = None) -> Tensor:
        """[N_c, S] bool: True where step s of codebook k holds a code of one of the n_frames frames."""
        steps = torch.arange(self.sequence_length(n_frames), device=device)
        delays = torch.tensor(self.delays(), device=device)[:, None]
        frame = steps[None, :] - delays
        return (frame >= 0) & (frame < n_frames)

    def build(self, codes: Tensor, frame_mask: Tensor | None, fill_id: int) -> tuple[Tensor, Tensor]:
        """codes [B, N_c, T] (and frame_mask [B, T] bool, False = padding frame)
        -> (seq [B, N_c, S] ids with `fill_id` at invalid steps, valid [B, N_c, S] bool).

        A step is valid when the pattern puts a code there and that code's frame is not padding.
        """
        if codes.dim() != 3 or codes.shape[1] != self.n_codebooks:
            raise ValueError(f"codes must have shape [B, {self.n_codebooks}, T], got {tuple(codes.shape)}")
        b, n_c, t = codes.shape
        if frame_mask is None:
            frame_mask = torch.ones(b, t, dtype=torch.bool, device=codes.device)
        elif frame_mask.shape != (b, t) or frame_mask.dtype != torch.bool:
            raise ValueError(f"frame_mask must be a bool tensor of shape [{b}, {t}], "
                             f"got {frame_mask.dtype} {tuple(frame_mask.shape)}")
        s = self.sequence_length(t)
        seq = codes.new_full((b, n_c, s), fill_id)
        valid = torch.zeros(b, n_c, s, dtype=torch.bool, device=codes.device)
        for k, delay in enumerate(self.delays()):
            seq[:, k, delay:delay + t] = codes[:, k]
            valid[:, k, delay:delay + t] = frame_mask
        seq = seq.masked_fill(~valid, fill_id)  # padding frames carry no code either
        return seq, valid

    def revert(self, seq: Tensor) -> Tensor:
        """seq [B, N_c, S] -> codes [B, N_c, T] with T = num_frames(S); the inverse of build."""
        if seq.dim() != 3 or seq.shape[1] != self.n_codebooks:
            raise ValueError(f"seq must have shape [B, {self.n_codebooks}, S], got {tuple(seq.shape)}")
        t = self.num_frames(seq.shape[-1])
        return torch.stack([seq[:, k, d:d + t] for k, d in enumerate(self.delays())], dim=1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_codebooks={self.n_codebooks})"


class ParallelPattern(CodebookPattern):
    name = "parallel"

    def delays(self) -> list[int]:
        return [0] * self.n_codebooks


class DelayPattern(CodebookPattern):
    name = "delay"

    def delays(self) -> list[int]:
        return list(range(self.n_codebooks))


PATTERNS: dict[str, type[CodebookPattern]] = {"delay": DelayPattern, "parallel": ParallelPattern}


def get_pattern(name: str, n_codebooks: int) -> CodebookPattern:
    if name not in PATTERNS:
        raise ValueError(f"unknown codebook pattern {name!r}; choose one of {sorted(PATTERNS)}")
    return PATTERNS[name](n_codebooks)
