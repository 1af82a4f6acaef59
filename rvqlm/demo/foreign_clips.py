"""The demo's foreign-speaker clips: held-out lines of speakers the codec never trained on.

They come from the voices corpus's test split (rvqlm/corpora/voices.py: ru-RU Ivrvoice, en-US and es-MX
Allison; `make voices`). Each clip is one row of the page: the original, ours at N_c = 4 and
N_c = 8 (2 and 4 kbps for the shipped codec) and Opus at 6 kbps, each decoded clip aligned to the
original and scored against it (STOI, wideband PESQ) and alone (DNSMOS OVRL; the original's own
OVRL is the ceiling), with its measured bitrate.

Without the corpus the section is one line saying how to add it. A score whose package is missing
is "n/a"; without ffmpeg's libopus the Opus clips are left out with a note (`make bench-setup`).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rvqlm.quality.metrics import align, dnsmos, estimate_lag, have_package, score
from rvqlm.demo.report import ReportClip, Section, write_clip
from rvqlm.quality.roundtrips import OPUS_FLOOR_KBPS, SAMPLE_RATE, Roundtrip, opus_roundtrip, ours_roundtrip

TITLE = "Foreign speakers"
TABLE = "Foreign speakers (voices corpus, test split)"
N_Q = (4, 8)  # our codebook counts shown
MIN_SECONDS, MAX_SECONDS = 3.0, 8.0
SCORES = {"STOI": ("pystoi",), "PESQ-WB": ("pesq",), "DNSMOS OVRL": ("speechmos", "onnxruntime")}


def voices_hint(voices_dir: str | Path) -> str | None:
    """None when `voices_dir` holds a prepared corpus (its corpus.json), else the one line saying
    how to add the section."""
    if (Path(voices_dir) / "corpus.json").is_file():
        return None
    state = "is incomplete (no corpus.json)" if Path(voices_dir).exists() else "is missing"
    return (f"Foreign-speaker clips left out: the voices corpus {voices_dir} {state}; add it with `make voices` "
            "and run the demo again.")


def pick_foreign_clips(voices_dir: str | Path, n: int, min_seconds: float = MIN_SECONDS,
                       max_seconds: float = MAX_SECONDS) -> list[Path]:
    """Up to `n` test-split files of a prepared voices corpus, `min_seconds`..`max_seconds` long:
    each speaker's (sorted by name) first such file in sorted order, then each one's second, and so
    on, so that n >= the number of speakers shows every speaker. CorpusError if none fits."""
    from codec.core.audio import audio_info
    from rvqlm.corpora.folder import CorpusError, corpus_files

    voices_dir = Path(voices_dir)
    by_speaker: dict[str, list[Path]] = {}
    for f in sorted(corpus_files(voices_dir, "test")):
        by_speaker.setdefault(f.relative_to(voices_dir).parts[1], []).append(f)
    per_speaker = -(-n // max(len(by_speaker), 1))
    fitting = {}
    for speaker, files in sorted(by_speaker.items()):
        fits = (f for f in files if min_seconds <= audio_info(f).duration <= max_seconds)
        fitting[speaker] = [f for _, f in zip(range(per_speaker), fits)]
    chosen = [files[i] for i in range(per_speaker) for _, files in sorted(fitting.items()) if i < len(files)]
    if not chosen and n > 0:
        raise CorpusError(f"no test file of {voices_dir} is {min_seconds:g}-{max_seconds:g} s long")
    return chosen[:n]


def opus_missing() -> str | None:
    """None when ffmpeg can encode Opus with libopus, else why it cannot."""
    if shutil.which("ffmpeg") is None:
        return "ffmpeg is not installed"
    done = subprocess.run(["ffmpeg", "-hide_banner", "-encoders"], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True)
    return None if " libopus " in done.stdout else "this ffmpeg has no libopus encoder"


def foreign_speaker_clips(codec, voices_dir: str | Path, n: int, out: Path,
                          say: Callable[[str], None] = print) -> Section:
    """Up to `n` foreign-speaker clips (`pick_foreign_clips`) through `codec` (mono) and Opus 6 kbps,
    written under `out` (audio/foreignI-*.wav, img/foreignI-*.png) and scored; `say` gets the hint
    when there is no voices corpus, or the time the clips took. Each row: the original, ours at each
    N_c, Opus; the table: one row per clip and system."""
    why_not = voices_hint(voices_dir)
    if why_not is None and n < 1:
        why_not = "Foreign-speaker clips left out (0 asked for)."
    if why_not is None and codec.channels != 1:
        why_not = f"Foreign-speaker clips left out: the codec has {codec.channels} channels; they score mono codecs."
    if why_not is not None:
        say(why_not)
        return Section(TITLE, why_not, table_title=TABLE)
    wall, cpu = time.perf_counter(), time.process_time()
    files = pick_foreign_clips(voices_dir, n)
    no_opus = opus_missing()
    done = Section(TITLE, "", table_title=TABLE)
    with tempfile.TemporaryDirectory(prefix="rvqlm_foreign_") as tmp:
        for i, path in enumerate(files):
            clips, rows = _foreign_row(codec, path, Path(voices_dir), f"foreign{i + 1}", out, Path(tmp), no_opus)
            done.rows.append(clips)
            done.table += rows
    done.description = _description(codec, files, Path(voices_dir), no_opus)
    say(f"foreign-speaker clips: {len(files)} scored in {time.perf_counter() - wall:.1f} s "
        f"({time.process_time() - cpu:.1f} s CPU)")
    return done


def _foreign_row(codec, path: Path, voices_dir: Path, stem: str, out: Path, workdir: Path,
                 no_opus: str | None) -> tuple[list[ReportClip], list[dict[str, str]]]:
    """One file's clips (original, ours at each N_c, Opus unless `no_opus`) and its table rows."""
    from codec.core.audio import load_audio

    reference = load_audio(path, SAMPLE_RATE, 1)[0].numpy()  # [S]
    speaker = path.relative_to(voices_dir).parts[1]
    ceiling = {"DNSMOS OVRL (ceiling)": _cell(dnsmos(reference, SAMPLE_RATE)["dnsmos_ovrl"])}
    clips = [write_clip(out, f"{stem}-original", torch.from_numpy(reference)[None], SAMPLE_RATE,
                        f"original ({speaker}/{path.name})", ceiling)]
    rows = [{"clip": stem, "speaker": speaker, "system": "original", "kbps": "-", "STOI": "-", "PESQ-WB": "-",
             "DNSMOS OVRL": ceiling["DNSMOS OVRL (ceiling)"]}]
    systems = []
    for k in _levels(codec):
        with torch.inference_mode():
            systems.append((f"ours N_c={k}", f"ours at {codec.bitrate_kbps(k):g} kbps (N_c = {k})", f"{k}cb",
                            ours_roundtrip(codec, reference, SAMPLE_RATE, k)))
    if no_opus is None:
        systems.append((f"Opus {OPUS_FLOOR_KBPS:g} kbps", f"Opus at {OPUS_FLOOR_KBPS:g} kbps", "opus",
                        opus_roundtrip(reference, SAMPLE_RATE, OPUS_FLOOR_KBPS, workdir)))
    for system, label, suffix, rt in systems:
        decoded, m = _scored(reference, rt)
        clips.append(write_clip(out, f"{stem}-{suffix}", torch.from_numpy(decoded)[None], SAMPLE_RATE, label, m))
        rows.append({"clip": stem, "speaker": speaker, "system": system, **m})
    return clips, rows


def _scored(reference: np.ndarray, rt: Roundtrip) -> tuple[np.ndarray, dict[str, str]]:
    """The decoded signal aligned to `reference` `[S]`, and its kbps, STOI, PESQ-WB and DNSMOS OVRL."""
    decoded = align(rt.decoded, estimate_lag(reference, rt.decoded, SAMPLE_RATE), len(reference))
    s = score(reference, decoded, SAMPLE_RATE, with_dnsmos=True)
    kbps = rt.bits / (len(reference) / SAMPLE_RATE) / 1000
    return decoded, {"kbps": f"{kbps:.1f}", "STOI": _cell(s["stoi"], ".3f"), "PESQ-WB": _cell(s["pesq"]),
                     "DNSMOS OVRL": _cell(s["dnsmos_ovrl"])}


def _levels(codec) -> list[int]:
    """Our codebook counts shown: N_Q, at most the codec's own."""
    return sorted({min(k, codec.n_codebooks) for k in N_Q})


def _cell(value: float, fmt: str = ".2f") -> str:
    return "n/a" if math.isnan(value) else f"{value:{fmt}}"


def _description(codec, files: list[Path], voices_dir: Path, no_opus: str | None) -> str:
    speakers = sorted({f.relative_to(voices_dir).parts[1] for f in files})
    kbps = " and ".join(f"{codec.bitrate_kbps(k):g} kbps (N_c = {k})"
                        for k in _levels(codec))
    words = [f"Held-out lines of speakers the codec never trained on ({', '.join(speakers)}; voices corpus, "
             f"test split, {MIN_SECONDS:g}-{MAX_SECONDS:g} s): the original, ours at {kbps}"
             f"{'' if no_opus else f' and Opus at {OPUS_FLOOR_KBPS:g} kbps'}, each aligned to the original and "
             "scored against it (STOI, wideband PESQ) and alone (DNSMOS OVRL; the original's is the ceiling)."]
    if no_opus:
        words.append(f"Opus left out: {no_opus} (`make bench-setup`).")
    missing = [f"{name} ({', '.join(p for p in packages if not have_package(p))} not installed)"
               for name, packages in SCORES.items() if not all(have_package(p) for p in packages)]
    if missing:
        words.append(f"n/a: {'; '.join(missing)}; `make bench-setup` installs them.")
    return " ".join(words)
