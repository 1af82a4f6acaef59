"""Align every line of a token folder (`rvqlm align`): TOKENS_DIR/alignments.jsonl.

For each manifest entry of the chosen splits whose metadata has a text, the entry's audio is read
from the corpus folder it was tokenized from, the aligner's log-probs of its frames are force-aligned
to the text's units (rvqlm/align/durations.py), and one JSON line is written::

    {"path": "train/airplane/let-m-oko.wav", "units": "_letím_", "durations": [12, 3, ...], "confidence": -0.21}

`durations` has one entry per character of `units` and sums to the entry's `n_frames`;
`confidence` is the forced path's mean log-prob per frame (null when the line was too short for
CTC and its frames were spread evenly). The file is written atomically at the end, under the token
folder's writer lock, so it is never written while `rvqlm tokenize` adds to the folder (the token
readers and tokenize's resume ignore files they do not know). It describes the folder as it was:
align again after tokenizing more files.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lm.text_units import TextUnitError, normalize, unit_ids, units
from rvqlm.align.ctc import CTCAligner
from rvqlm.align.durations import align_units, loud_frames
from rvqlm.align.features import HOP, SAMPLE_RATE, frame_count, log_mel

ALIGNMENTS = "alignments.jsonl"
BATCH = 16  # lines of one frame count per forward pass


@dataclass
class AlignSummary:
    aligned: int = 0
    without_text: int = 0
    unknown_characters: int = 0  # texts with a character the aligner has no class for
    fallbacks: int = 0  # lines too short for CTC: frames spread evenly
    other_splits: int = 0
    seconds: float = 0.0
    low_confidence: list = field(default_factory=list)  # (confidence, path) of the 5 least confident lines

    def lines(self) -> list[str]:
        out = [f"aligned {self.aligned} lines ({self.fallbacks} spread evenly: too short for their text), "
               f"skipped {self.without_text} without text and {self.unknown_characters} with characters the "
               f"aligner lacks, {self.other_splits} in other splits; {self.seconds:.0f} s"]
        out += [f"  least confident: {p} ({c:.2f})" for c, p in self.low_confidence]
        return out


def _check_geometry(meta: dict, tokens_dir) -> None:
    rate, frame_rate = meta["sample_rate"], meta["frame_rate"]
    if rate != SAMPLE_RATE or abs(rate / frame_rate - HOP) > 1e-6:
        raise ValueError(f"{tokens_dir}: the aligner works on {SAMPLE_RATE} Hz audio at {SAMPLE_RATE // HOP} frames "
                         f"a second; these tokens are {rate} Hz at {frame_rate:g} frames a second")


def _features(audio: Path, n_frames: int) -> tuple[torch.Tensor, list[bool]]:
    """The features of one line and which frames are loud (durations.loud_frames); ValueError when its audio
    does not give the tokens' `n_frames` frames."""
    from codec.core.audio import load_audio

    if not audio.is_file():
        raise FileNotFoundError(f"{audio} is missing: give --corpus the folder these tokens were made from")
    wav = load_audio(audio, SAMPLE_RATE, 1)
    if frame_count(wav.shape[-1]) != n_frames:
        raise ValueError(f"{audio} makes {frame_count(wav.shape[-1])} frames but its tokens have {n_frames}: "
                         f"not the audio these tokens were made from")
    return log_mel(wav), loud_frames(wav, n_frames)


def _choose(entries, splits: tuple[str, ...], alphabet: str, summary: AlignSummary) -> list[tuple]:
    """(entry, units, unit ids) of the entries to align; the others counted in `summary`."""
    jobs = []
    for entry in entries:
        text = entry.metadata.get("text")
        if entry.path.split("/")[0] not in splits:
            summary.other_splits += 1
        elif not isinstance(text, str) or not normalize(text):
            summary.without_text += 1
        else:
            try:
                jobs.append((entry, units(text), unit_ids(text, alphabet)))
            except TextUnitError:
                summary.unknown_characters += 1
    return jobs


def _groups(jobs: list[tuple], size: int = BATCH) -> list[list[tuple]]:
    """Jobs in batches of lines with exactly the same frame count: no padding, so a line's log-probs
    do not depend on the lines it is batched with."""
    by_frames: dict[int, list[tuple]] = {}
    for job in jobs:
        by_frames.setdefault(job[0].n_frames, []).append(job)
    return [group[i:i + size] for group in by_frames.values() for i in range(0, len(group), size)]


def align_jobs(model: CTCAligner, corpus_dir, jobs: list[tuple], summary: AlignSummary, progress: bool) -> dict:
    """{path: JSON line} of every job."""
    rows, scored, done, t0 = {}, [], 0, time.time()
    for group in _groups(jobs):
        feats, spans = zip(*[_features(Path(corpus_dir) / entry.path, entry.n_frames) for entry, _, _ in group])
        with torch.no_grad():
            log_probs = model(torch.stack(feats))
        for (entry, line_units, ids), lp, span in zip(group, log_probs, spans):
            found = align_units(lp, ids, span)
            summary.aligned += 1
            summary.fallbacks += found.fallback
            if found.confidence is not None:
                scored.append((found.confidence, entry.path))
            confidence = None if found.confidence is None else round(found.confidence, 4)
            rows[entry.path] = json.dumps({"path": entry.path, "units": line_units, "durations": found.frames,
                                           "confidence": confidence}, ensure_ascii=False)
        if progress and (done + len(group)) // 1000 > done // 1000:
            print(f"  aligned {done + len(group)}/{len(jobs)} lines ({time.time() - t0:.0f} s)", flush=True)
        done += len(group)
    summary.low_confidence = sorted(scored)[:5]
    return rows


def align_token_folder(tokens_dir: str | os.PathLike, corpus_dir: str | os.PathLike, aligner_dir: str | os.PathLike,
                       splits: tuple[str, ...] = ("train", "valid", "test"), progress: bool = True) -> AlignSummary:
    from rvqlm_core.atomic import atomic_write_text
    from rvqlm_core.folder_lock import folder_lock
    from rvqlm_core.token_shards import TokenShards

    if not Path(corpus_dir).is_dir():
        raise FileNotFoundError(f"no corpus folder at {corpus_dir}")
    if not Path(tokens_dir).is_dir():
        raise FileNotFoundError(f"no token folder at {tokens_dir}")
    model = CTCAligner.from_pretrained(aligner_dir)
    t0, summary = time.time(), AlignSummary()
    with folder_lock(tokens_dir):
        shards = TokenShards.open(tokens_dir)
        _check_geometry(shards.meta, tokens_dir)
        jobs = _choose(shards.entries, splits, model.config.alphabet, summary)
        rows = align_jobs(model, corpus_dir, jobs, summary, progress)
        atomic_write_text(Path(tokens_dir) / ALIGNMENTS, "".join(rows[e.path] + "\n" for e, _, _ in jobs))
    summary.seconds = time.time() - t0
    return summary
