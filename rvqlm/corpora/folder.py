"""A prepared corpus folder, whatever the corpus: audio decoded once to 16-bit mono wav, one folder
per split, and `corpus.json` (settings, per-file durations, skipped sources) written last, so its
presence means the corpus is complete. Every corpus module (fillets, voices, synthetic) writes
through `write_corpus`; every reader (demo, benchmarks, tokenize) lists files with `corpus_files`.

Layout::

    OUT/corpus.json
    OUT/{train,valid,test}/GROUP/NAME.wav        GROUP: a game level, a speaker, a voice
    OUT/{train,valid,test}/metadata.jsonl        audiofolder rows (text, speaker), when the corpus has them
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from codec.core.audio import AudioError, load_audio, save_audio
from rvqlm_core.atomic import atomic_write_json, atomic_write_text

SPLITS = ("train", "valid", "test")
METADATA = "metadata.jsonl"


class CorpusError(RuntimeError):
    """A corpus that is not installed or not prepared, or a folder holding one prepared with other settings."""


@dataclass(frozen=True)
class CorpusFile:
    split: str
    level: str  # the group a file is split by: the game level (fillets), the speaker (voices)
    source: Path
    relpath: str  # relative to the corpus folder, e.g. "train/airplane/let-m-divna.wav"


def write_if_changed(path: Path, text: str) -> None:
    """Write `text` to `path` atomically unless it already holds exactly that."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        atomic_write_text(path, text)


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
    meta = read_corpus_json(source)
    settings = {**meta["settings"], "subset_of": str(source), "files_per_split": per_split}
    meta_path = out / "corpus.json"
    entries = _first_per_split(meta["files"], per_split, lambda e: e["split"])
    if meta_path.exists():
        if json.loads(meta_path.read_text()).get("settings") != settings:
            raise CorpusError(f"{out} holds another corpus than the first {per_split} files per split of {source}")
    else:
        for e in entries:
            link = out / e["path"]
            if not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(source / e["path"])
        atomic_write_json(meta_path, {**meta, "settings": settings, "minutes": _minutes(entries), "files": entries})
    for split in SPLITS:  # the rows of the subset's files, as in the source
        if (source / split / METADATA).is_file():
            kept = {e["path"] for e in entries}
            lines = (source / split / METADATA).read_text(encoding="utf-8").split("\n")  # U+2028 may be in texts
            write_if_changed(out / split / METADATA, "".join(
                line + "\n" for line in lines if line and f"{split}/{json.loads(line)['file_name']}" in kept))
    return out


def corpus_files(corpus_dir: str | os.PathLike, split: str) -> list[Path]:
    """The wav files of one split of a prepared corpus."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    corpus_dir = Path(corpus_dir)
    return [corpus_dir / e["path"] for e in read_corpus_json(corpus_dir)["files"] if e["split"] == split]


def read_corpus_json(corpus_dir: Path) -> dict:
    meta_path = corpus_dir / "corpus.json"
    if not meta_path.exists():
        raise CorpusError(f"{corpus_dir} is not a prepared corpus (no corpus.json); run `rvqlm corpus prepare fillets`")
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
