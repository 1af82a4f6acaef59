"""Per-unit durations of one line from the aligner's log-probs: its text units placed on the frames.

`torchaudio.functional.forced_align` gives each frame a class on the best CTC path of the line's
units without its two edges. Every unit of units(text), edges included, then gets a number of frames,
the numbers summing exactly to T:

- the leading EDGE: the blank frames before the first unit's emission;
- each unit but the last: its emission run and the blank frames after it, up to the next unit's run;
- the last unit: its emission run and at most TAIL more frames;
- the trailing EDGE: the rest (trailing silence is the edge's, not the last letter's).

A line with fewer frames than CTC needs (one per unit, plus a blank between repeated units) falls back
to spreading its frames evenly over its units (`Durations.fallback`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rvqlm.align.ctc import BLANK

WORD_CLASS = 1  # the WORD unit's class (its alphabet index)
TAIL = 2  # frames after the last unit's emission that still sound as that unit


@dataclass(frozen=True)
class Durations:
    frames: list[int]  # one per unit of units(text), both edges included; sums to T
    confidence: float | None  # mean log-prob per frame of the forced path (None for a fallback)
    fallback: bool


def feasible(targets: list[int], frames: int) -> bool:
    """Whether CTC can place `targets` on `frames` frames: one frame each, plus a blank between repeats."""
    repeats = sum(a == b for a, b in zip(targets, targets[1:]))
    return len(targets) > 0 and frames >= len(targets) + repeats


def even_durations(n_units: int, frames: int) -> list[int]:
    """`frames` spread over `n_units` as evenly as possible (the earlier units take the remainder)."""
    base, extra = divmod(frames, n_units)
    return [base + (i < extra) for i in range(n_units)]


def unit_starts(path: list[int]) -> list[tuple[int, int]]:
    """(first frame, last frame) of each target's emission run on a CTC path of classes per frame.
    A new target starts at a non-blank frame after a blank or after another class."""
    runs, prev = [], BLANK
    for t, k in enumerate(path):
        if k != BLANK and k == prev:
            runs[-1] = (runs[-1][0], t)
        elif k != BLANK:
            runs.append((t, t))
        prev = k
    return runs


def loud_frames(wav: torch.Tensor, frames: int, hop: int = 320) -> list[bool]:
    """Whether each frame's energy says speech: above max(peak - 35 dB, the quietest 5 % + 6 dB), frame t
    being samples [t * hop, (t + 1) * hop)."""
    x = torch.nn.functional.pad(wav.reshape(-1).float(), (0, frames * hop - wav.numel()))[:frames * hop]
    db = 10 * torch.log10(x.reshape(frames, hop).pow(2).mean(dim=1) + 1e-10)
    threshold = max(float(db.max()) - 35.0, float(db.quantile(0.05)) + 6.0)
    return (db > threshold).tolist()


def path_durations(path: list[int], n_targets: int, loud: list[bool] | None = None) -> list[int]:
    """Durations of the n_targets + 2 units (edges included) from a forced path (classes per frame).

    `loud` (speech by energy, per frame) moves the silences to the units a listener hears them in: CTC's
    emission runs are short spikes that may sit a few frames off the sound, so the first unit starts
    where speech starts (if that is before the second unit's run), the last ends where speech ends (or
    TAIL frames after its run, whichever is later), and a WORD unit starts at the first quiet frame after
    the previous unit's run (a pause between words is the WORD's, not the last letter's)."""
    runs = unit_starts(path)
    if len(runs) != n_targets:
        raise AssertionError(f"the forced path holds {len(runs)} units, the line {n_targets}")
    total = len(path)
    starts = [s for s, _ in runs]
    last_end = min(total, runs[-1][1] + 1 + TAIL)
    if loud is not None:
        speech = [t for t, x in enumerate(loud) if x]
        if speech:
            last_end = min(total, max(last_end, speech[-1] + 1))
            starts[0] = min(speech[0], (starts[1] if n_targets > 1 else last_end) - 1)
        for k in range(1, n_targets):
            if path[starts[k]] == WORD_CLASS:
                t = runs[k - 1][1] + 1
                while t < starts[k] and loud[t]:
                    t += 1
                starts[k] = max(t, starts[k - 1] + 1)
    inner = [b - a for a, b in zip(starts, starts[1:])] + [last_end - starts[-1]]
    return [starts[0], *inner, total - last_end]


def align_units(log_probs: torch.Tensor, ids: list[int], loud: list[bool] | None = None) -> Durations:
    """log_probs [T, C] of one line and the ids of its units (unit_ids: edges included) -> Durations;
    `loud`: see path_durations."""
    import torchaudio.functional as AF

    frames, targets = log_probs.shape[0], ids[1:-1]
    if not feasible(targets, frames):
        return Durations(even_durations(len(ids), frames), None, True)
    labels, scores = AF.forced_align(log_probs[None].float(), torch.tensor([targets], dtype=torch.int32),
                                     blank=BLANK)
    durations = path_durations(labels[0].tolist(), len(targets), loud)
    assert sum(durations) == frames and all(d >= 0 for d in durations)
    return Durations(durations, float(scores[0].mean()), False)
