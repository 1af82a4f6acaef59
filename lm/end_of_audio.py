"""The end-of-audio token of a conditioned LM: where it sits in the pattern, and how generation stops.

Convention. A file of T frames ends with one extra id, `end_id` (= |V|, an extra output of every
head), in codebook 0 of frame T, the frame after the last; the other codebooks of frame T hold no
code (pad, not scored). With the delay pattern the end sits at step T + delay_0 = T, where codebook
0 is otherwise empty, so a window ending at its file's end needs no extra position
(S = T + N_c - 1 as before, for N_c >= 2); with the parallel pattern it takes one more step (S = T + 1).

    delay, N_c = 3, T = 4 (E = end, . = pad):
        k=0:  0 1 2 3 E .
        k=1:  . 0 1 2 3 .
        k=2:  . . 0 1 2 3

Codebook 0 is predicted first in each frame, so the end is decided before any code of frame T
would be; the later codebooks then see it as an input while they finish frames T-N_c+1..T-1.
Only codebook 0 is trained on the end, so generation never lets another codebook choose it.
A window that stops before its file's end gets no end token (the file goes on). An unconditioned
LM has no end id and generation runs to its length, as before.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lm.patterns import CodebookPattern


def layout_with_end(pattern: CodebookPattern, codes: Tensor, frame_mask: Tensor | None, ends: Tensor,
                    end_id: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """codes [B, N_c, T], frame_mask [B, T] (True frames first), ends [B] bool (True: the row's last
    real frame is its file's last) -> seq [B, N_c, S], valid [B, N_c, S], with `end_id` in codebook 0
    right after the last real frame of each row whose `ends` is True (see the module docstring).
    S = pattern.sequence_length(T), or one more step where an end needs it (parallel pattern)."""
    b, n_c, t = codes.shape
    if ends.shape != (b,) or ends.dtype != torch.bool:
        raise ValueError(f"ends must be a bool tensor [B] = [{b}], got {ends.dtype} {list(ends.shape)}")
    if frame_mask is None:
        frame_mask = torch.ones(b, t, dtype=torch.bool, device=codes.device)
    lengths = frame_mask.sum(dim=1)
    d0 = pattern.delays()[0]
    s = pattern.sequence_length(t)
    if bool(ends.any()):
        s = max(s, int(lengths[ends].max()) + d0 + 1)
    extra = pattern.num_frames(s) - t  # frames to append so that the pattern spans s steps
    if extra > 0:
        codes = torch.cat([codes, codes.new_zeros(b, n_c, extra)], dim=-1)
        frame_mask = torch.cat([frame_mask, frame_mask.new_zeros(b, extra)], dim=-1)
    seq, valid = pattern.build(codes, frame_mask, fill_id=pad_id)
    seq, valid = seq[..., :s], valid[..., :s]
    rows = ends.nonzero().flatten()
    steps = lengths[rows] + d0
    seq[rows, 0, steps] = end_id
    valid[rows, 0, steps] = True
    return seq, valid


class EndTracker:
    """Per-row end-of-audio bookkeeping while generating [B] sequences of at most `total_frames`.

    ends [B] long: each row's length in frames (total_frames until codebook 0 places `end_id`).
    After a row's end every later position of every codebook is pad, as in training.
    """

    def __init__(self, pattern: CodebookPattern, batch_size: int, total_frames: int, end_id: int, pad_id: int,
                 device: torch.device | str):
        self.delays = torch.tensor(pattern.delays(), device=device)
        self.max_delay = int(self.delays.max())
        self.end_id, self.pad_id = end_id, pad_id
        self.ends = torch.full((batch_size,), total_frames, dtype=torch.long, device=device)
        self._ended = torch.zeros(batch_size, dtype=torch.bool, device=device)

    def mask_logits(self, logits: Tensor) -> Tensor:
        """logits [B, N_c, |V| + 1] -> a copy where only codebook 0 may choose the end."""
        out = logits.clone()
        out[:, 1:, self.end_id] = float("-inf")
        return out

    def place(self, step: int, tokens: Tensor) -> Tensor:
        """The ids [B, N_c] placed at `step`: pad past each row's end; a new end recorded."""
        frame = step - self.delays  # [N_c]: the frame each codebook fills at this step
        tokens = torch.where(frame[None, :] >= self.ends[:, None], self.pad_id, tokens)
        new_end = tokens[:, 0] == self.end_id
        self.ends = torch.where(new_end, frame[0], self.ends)
        self._ended |= new_end
        return tokens

    def done(self, step: int) -> bool:
        """True once every row has ended and placed the last codebook of its last frame."""
        if not bool(self._ended.all()):
            return False
        last = torch.maximum(self.ends + int(self.delays[0]), self.ends - 1 + self.max_delay)
        return bool((step >= last).all())

    def trim(self, codes: Tensor) -> Tensor:
        """codes [B, N_c, T] reverted from the pattern -> [B, N_c, max(ends)] with 0 past each row's end."""
        t = int(self.ends.max()) if len(self.ends) else codes.shape[-1]
        codes = codes[..., :t]
        past = torch.arange(t, device=codes.device)[None, :] >= self.ends[:, None]
        return codes.masked_fill(past[:, None, :], 0)


def bar_or_force_end(logits: Tensor, barred: Tensor, forced: Tensor, end_id: int | None) -> Tensor:
    """logits [B, N_c, S, V] -> a copy where rows barred [B] cannot choose `end_id` at codebook 0's last
    position and rows forced [B] can choose nothing else there (logits itself when neither applies)."""
    if end_id is None or not bool((barred | forced).any()):
        return logits
    logits = logits.clone()
    logits[barred, 0, -1, end_id] = float("-inf")
    last = logits[forced, 0, -1]
    only_end = torch.arange(last.shape[-1], device=last.device) == end_id
    logits[forced, 0, -1] = torch.where(only_end, last, float("-inf"))
    return logits
