"""Aligned text: the text placed on the frames, one more stream of the decoder's summed input.

An LM whose ConditionConfig has an `alphabet` reads its text as units (lm.text_units) and also
frame by frame: each frame t gets the unit u(t) being said there (from a forced alignment in
training, from predicted durations at generation), and the decoder input at position t adds

    F[t] = W_f enc[u(t)] + E_in[min(t - start(u(t)), 15)] + E_out[min(end(u(t)) - 1 - t, 15)]

(the encoder's state of that unit, projected, plus where t sits inside the unit's run of frames),
as FastSpeech's length regulator does; frames with no unit (padding, a null text) add nothing.
The encoder also predicts each unit's duration, log(1 + frames), trained by squared error
against the alignment, so that generation needs only the text (hard, monotonic alignment: the
text is read in order, each unit once).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from lm.end_of_audio import bar_or_force_end
from lm.text_units import TextUnitError, units as _units

MAX_OFFSET = 15  # offsets inside a unit's run are counted up to this many frames


def frame_units_from_durations(durations: Sequence[Sequence[int]], width: int | None = None) -> Tensor:
    """Per-row unit durations in frames -> frame_units [B, F] long: frame t's unit index, -1 past a
    row's last frame (F = the longest row's frames, or `width`)."""
    lengths = [int(sum(d)) for d in durations]
    width = max([1, *lengths]) if width is None else width
    out = torch.full((len(durations), width), -1, dtype=torch.long)
    for row, d in enumerate(durations):
        units = torch.repeat_interleave(torch.arange(len(d)), torch.as_tensor(list(d), dtype=torch.long))
        out[row, :min(len(units), width)] = units[:width]
    return out


def run_offsets(frame_units: Tensor) -> tuple[Tensor, Tensor]:
    """frame_units [B, F] -> (frames since the start of each frame's run of one unit, frames until its
    end), each [B, F] long clamped to MAX_OFFSET."""
    def since_start(idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device).expand_as(idx)
        change = torch.ones_like(idx, dtype=torch.bool)
        change[:, 1:] = idx[:, 1:] != idx[:, :-1]
        start = torch.where(change, pos, torch.zeros_like(pos)).cummax(dim=1).values
        return pos - start

    since = since_start(frame_units)
    until = since_start(frame_units.flip(1)).flip(1)
    return since.clamp_max(MAX_OFFSET), until.clamp_max(MAX_OFFSET)


class FrameText(nn.Module):
    """The aligned-text stream and the duration predictor of an encoder of width d."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.since = nn.Embedding(MAX_OFFSET + 1, d_model)
        self.until = nn.Embedding(MAX_OFFSET + 1, d_model)
        self.duration = nn.Sequential(nn.Linear(d_model, d_model), nn.SiLU(), nn.Linear(d_model, 1))

    def log_durations(self, states: Tensor) -> Tensor:
        """Encoder states [B, M, d] (position 0 the speaker, 1..L the units) -> predicted log(1 + frames)
        of every unit [B, M - 1]."""
        return self.duration(states[:, 1:]).squeeze(-1)

    def predict(self, states: Tensor, text_len: Tensor, pace: float = 1.0) -> list[list[int]]:
        """Rounded predicted durations of each row's text_len [B] units (at least 1 frame each; a
        pace > 1 speaks faster). Rows with no text: []."""
        frames = ((self.log_durations(states).float().exp() - 1.0) / pace).round().clamp_min(1).long()
        return [frames[row, :int(n)].tolist() for row, n in enumerate(text_len)]

    def frames(self, states: Tensor, frame_units: Tensor, text_len: Tensor) -> Tensor:
        """states [B, M, d]; frame_units [B, F] (unit index per frame, -1 none); text_len [B] (0: null
        text) -> the stream F [B, F, d], zero where a frame has no unit."""
        real = (frame_units >= 0) & (frame_units < text_len[:, None])
        source = (frame_units + 1).clamp(0, states.shape[1] - 1)
        picked = states.gather(1, source[..., None].expand(-1, -1, states.shape[-1]))
        since, until = run_offsets(frame_units)
        stream = self.proj(picked) + self.since(since) + self.until(until)
        return stream * real[..., None].to(stream.dtype)

    def duration_loss(self, states: Tensor, durations: Tensor, text_len: Tensor) -> Tensor:
        """Mean squared error of predicted log(1 + frames) over the units with a known duration
        (durations [B, L] float, < 0 unknown) of rows that read a text (text_len [B] > 0); 0 if none."""
        pred = self.log_durations(states)[:, :durations.shape[1]]
        known = (durations >= 0) & (text_len[:, None] > 0)
        known = known[:, :pred.shape[1]]
        if not bool(known.any()):
            return pred.new_zeros(())
        target = torch.log1p(durations[:, :pred.shape[1]].clamp_min(0).to(pred.dtype))
        return ((pred - target) ** 2)[known].mean()


class AlignedEnd:
    """An aligned-text LM's end at generation: a row's text fills its first F frames (its units'
    durations), so codebook 0 may choose the end only from frame F on, and must at frame F + `linger`.
    Rows without a text (the null rows of guidance included) are free. Call `before(n)` ahead of each
    decoder forward over n positions and `after(logits)` on its logits (as lm.alignment.ReadingWindow)."""

    def __init__(self, model, memory, linger: int = 25):
        if linger < 0:
            raise ValueError(f"linger must be >= 0, got {linger}")
        self.end_id, self.linger = model.config.end_id, linger
        self.frames = memory.frame_len  # [R] frames each row's units fill (0: no text)
        self.step = -1  # the pattern step whose logits the last forward ends on

    def before(self, n_positions: int = 1) -> None:
        """A forward over n positions ends at the next step (a prefill or a recompute over n: at step n - 1)."""
        self.step = max(self.step + 1, n_positions - 1)

    def after(self, logits: Tensor) -> Tensor:
        """logits [B, N_c, S, V] (B <= R) -> the end barred from codebook 0's last position before a row's
        frames run out, and the only choice there once they ran out `linger` frames ago."""
        rows = logits.shape[0]
        frames = self.frames[:rows]
        barred = (frames > 0) & (self.step < frames)
        forced = (frames > 0) & (self.step >= frames + self.linger)
        return bar_or_force_end(logits, barred, forced, self.end_id)


def frames_at(frames: Tensor, positions: Tensor) -> Tensor:
    """The stream frames [B, F, d] at model positions [S] -> [B, S, d] (zero at positions >= F)."""
    inside = positions < frames.shape[1]
    picked = frames[:, positions.clamp_max(frames.shape[1] - 1)]
    return picked * inside[None, :, None].to(picked.dtype)


ALIGNMENTS = "alignments.jsonl"  # in a token folder: {"path", "units", "durations"} a line (`rvqlm align`)


def text_units(text: str) -> str:
    """units(text), or "" for a text with nothing to say."""
    try:
        return _units(text)
    except TextUnitError:
        return ""


def aligned_durations(tokens_dir, entries, texts: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Each entry's frames per unit from TOKENS_DIR/alignments.jsonl (() for a file with no text).
    ValueError naming the file where a text has no alignment, or one that does not fit its units or frames."""
    file = Path(tokens_dir) / ALIGNMENTS
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError:
        raise FileNotFoundError(f"{file} does not exist: align the token folder first (`rvqlm align`)") from None
    table = {}
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            table[row["path"]] = (row["units"], tuple(int(x) for x in row["durations"]))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{file}:{n}: not an alignment line ({{\"path\", \"units\", \"durations\"}})") from None
    out = []
    for entry, text in zip(entries, texts):
        if not text_units(text):
            out.append(())
            continue
        if entry.path not in table:
            raise ValueError(f"{file}: no alignment of {entry.path}, which has a text: run `rvqlm align` again")
        units, durations = table[entry.path]
        if units != text_units(text) or len(durations) != len(units) or sum(durations) != entry.n_frames:
            raise ValueError(f"{file}: {entry.path}: the alignment does not fit its text's {len(text_units(text))} units "
                             f"and {entry.n_frames} frames: run `rvqlm align` again")
        out.append(durations)
    return tuple(out)
