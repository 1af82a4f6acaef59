"""The built-in real-speech corpus: Czech voice acting from Debian's `fillets-ng-data-cs`.

1,882 Vorbis files, about 101 minutes, ~80 game levels, two main speakers and ~20 minor ones
(GPL-2+). `prepare_corpus` decodes them once to 16-bit mono wav at the codec's rate and splits
them **by level** into train / valid / test, so held-out audio never shares a scene (or a take)
with training audio. Training code never reads the test split.

Layout written::

    OUT/corpus.json                 # the split, per-file durations, source and settings
    OUT/{train,valid,test}/LEVEL/NAME.wav

Writes are atomic and the job is resumable: files already converted are skipped, and
`corpus.json` is written last, so its presence means the corpus is complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from codec.audio import AudioError, load_audio, save_audio
from rvqlm_core.atomic import atomic_write_json

FILLETS_SOUND_DIR = Path(os.environ.get("RVQLM_FILLETS_DIR", "/usr/share/games/fillets-ng/sound"))
DEFAULT_CORPUS_DIR = Path(os.environ.get("RVQLM_CORPUS_DIR", "data/fillets-cs-16k"))
SPLITS = ("train", "valid", "test")
CORPUS_VERSION = 1


class CorpusError(RuntimeError):
    """The built-in corpus is missing, empty, or a folder holds one prepared with other settings."""


@dataclass(frozen=True)
class CorpusFile:
    split: str
    level: str  # the group a file is split by: the game level (fillets), the speaker (voices)
    source: Path
    relpath: str  # relative to the corpus folder, e.g. "train/airplane/let-m-divna.wav"


def split_of_level(level_index: int) -> str:
    """Deterministic split by the level's index in sorted order: 1 in 10 valid, 1 in 10 test."""
    r = level_index % 10
    return "valid" if r == 3 else "test" if r == 7 else "train"


def list_source_files(sound_dir: Path = FILLETS_SOUND_DIR) -> list[CorpusFile]:
    """The Czech voice files of every level, with their split. Raises CorpusError if not installed."""
    if not sound_dir.is_dir():
        raise CorpusError(
            f"the built-in corpus is not installed ({sound_dir} missing). "
            "Install it with `make system-deps` (Debian package fillets-ng-data-cs)."
        )
    levels = sorted(p.name for p in sound_dir.iterdir() if (p / "cs").is_dir())
    files = []
    for i, level in enumerate(levels):
        split = split_of_level(i)
        for src in sorted((sound_dir / level / "cs").glob("*.ogg")):
            files.append(CorpusFile(split, level, src, f"{split}/{level}/{src.stem}.wav"))
    if not files:
        raise CorpusError(f"no Czech voice files under {sound_dir}/*/cs/")
    return files


def prepare_corpus(
    out_dir: str | os.PathLike = DEFAULT_CORPUS_DIR,
    sample_rate: int = 16000,
    *,
    max_files_per_split: int | None = None,
    sound_dir: Path = FILLETS_SOUND_DIR,
    progress: bool = True,
) -> Path:
    """Decode, resample and split the corpus into `out_dir`; return `out_dir`.

    max_files_per_split: keep only the first N files of each split (a quick subset for tests).
    A folder prepared with other settings is refused rather than mixed.
    """
    settings = {"version": CORPUS_VERSION, "sample_rate": sample_rate, "max_files_per_split": max_files_per_split}
    return write_corpus(out_dir, lambda: list_source_files(sound_dir), settings, name="fillets-ng-data-cs",
                        license="GPL-2+", progress=progress)


def write_corpus(out_dir: str | os.PathLike, list_files: Callable[[], list[CorpusFile]], settings: dict, *,
                 name: str, license: str, decode: Callable[[Path, int], torch.Tensor] | None = None,
                 progress: bool = True) -> Path:
    """Decode `list_files()` to 16-bit mono wav at settings["sample_rate"] under `out_dir` (one
    folder per split) and write `corpus.json` last; return `out_dir`. Resumable: converted files
    are kept. `decode(source, rate)` -> [1, S] (default `load_audio`). A folder prepared with other
    settings is refused rather than mixed."""
    out, sample_rate = Path(out_dir), settings["sample_rate"]
    meta_path = out / "corpus.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("settings") == settings:
            return out
        raise CorpusError(f"{out} holds a corpus prepared with {meta.get('settings')}, not {settings}; use another folder")
    files = list_files()
    if settings.get("max_files_per_split") is not None:
        files = _first_per_split(files, settings["max_files_per_split"], lambda f: f.split)
    decode = decode or (lambda source, rate: load_audio(source, rate, 1))
    entries, skipped = [], []
    for f in tqdm(files, desc=f"preparing {name}", unit="file", disable=not progress):
        dest = out / f.relpath
        try:
            if not dest.exists():
                save_audio(dest, decode(f.source, sample_rate), sample_rate)
            frames = _frames(dest)
        except AudioError as e:
            skipped.append({"source": str(f.source), "reason": e.reason})
            continue
        entries.append({"path": f.relpath, "split": f.split, "level": f.level, "source": str(f.source),
                        "seconds": frames / sample_rate})
    atomic_write_json(meta_path, {"name": name, "license": license, "settings": settings,
                                  "minutes": _minutes(entries), "files": entries, "skipped": skipped})
    return out


def corpus_subset(corpus_dir: str | os.PathLike, out_dir: str | os.PathLike, per_split: int) -> Path:
    """The first `per_split` files of each split of a prepared corpus, linked (symlinks) into `out_dir`
    with their own corpus.json: a quick corpus (`rvqlm demo --corpus-files`). Returns `out_dir`."""
    if per_split < 1:
        raise ValueError(f"files per split must be >= 1, got {per_split}")
    source, out = Path(corpus_dir).resolve(), Path(out_dir)
    meta = _read_meta(source)
    settings = {**meta["settings"], "subset_of": str(source), "files_per_split": per_split}
    meta_path = out / "corpus.json"
    if meta_path.exists():
        if json.loads(meta_path.read_text()).get("settings") == settings:
            return out
        raise CorpusError(f"{out} holds another corpus than the first {per_split} files per split of {source}")
    entries = _first_per_split(meta["files"], per_split, lambda e: e["split"])
    for e in entries:
        link = out / e["path"]
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source / e["path"])
    atomic_write_json(meta_path, {**meta, "settings": settings, "minutes": _minutes(entries), "files": entries})
    return out


def corpus_files(corpus_dir: str | os.PathLike, split: str) -> list[Path]:
    """The wav files of one split of a prepared corpus."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    corpus_dir = Path(corpus_dir)
    return [corpus_dir / e["path"] for e in _read_meta(corpus_dir)["files"] if e["split"] == split]


def _read_meta(corpus_dir: Path) -> dict:
    meta_path = corpus_dir / "corpus.json"
    if not meta_path.exists():
        raise CorpusError(f"{corpus_dir} is not a prepared corpus (no corpus.json); run `rvqlm corpus prepare`")
    return json.loads(meta_path.read_text())


def _first_per_split(items: list, n: int, split_of) -> list:
    """The first `n` items of each split, in their order."""
    kept: dict[str, int] = {}
    chosen = []
    for item in items:
        split = split_of(item)
        if kept.get(split, 0) < n:
            kept[split] = kept.get(split, 0) + 1
            chosen.append(item)
    return chosen


def _minutes(entries: list[dict]) -> dict[str, float]:
    return {s: round(sum(e["seconds"] for e in entries if e["split"] == s) / 60, 2) for s in SPLITS}


def _frames(path: Path) -> int:
    import soundfile as sf

    return sf.info(str(path)).frames
