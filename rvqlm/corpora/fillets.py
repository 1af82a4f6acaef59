"""The built-in real-speech corpus: Czech voice acting from Debian's `fillets-ng-data-cs`.

1,882 Vorbis files, about 101 minutes, ~80 game levels, two main speakers and ~20 minor ones
(GPL-2+). `prepare_corpus` decodes them once to 16-bit mono wav at the codec's rate and splits
them **by level** into train / valid / test, so held-out audio never shares a scene (or a take)
with training audio. Training code never reads the test split.

Layout written::

    OUT/corpus.json                 # the split, per-file durations, source and settings
    OUT/{train,valid,test}/metadata.jsonl   # what each file says, who says it (audiofolder)
    OUT/{train,valid,test}/LEVEL/NAME.wav

Written through `rvqlm.corpora.folder.write_corpus`: atomic and resumable.

`metadata.jsonl` follows Hugging Face's `audiofolder` convention, one per split folder (where
`datasets` looks for it when a folder has split sub-folders), one row per file, `file_name`
relative to the split folder: `{"file_name": "airplane/let-m-divna.wav", "text": <Czech>,
"text_en": <English>, "speaker": "font_small"}`, from the game's dialog scripts (`rvqlm.corpora.dialogs`,
Debian's `fillets-ng-data`). A file without a line with Czech text has `file_name` alone (so
audiofolder keeps it); `speaker` is absent when the script names no font. It is rebuilt from
corpus.json on every `prepare_corpus` without decoding audio, so a corpus prepared before it
existed gains it cheaply.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rvqlm.corpora.dialogs import FILLETS_SCRIPT_DIR, level_dialogs
from rvqlm.corpora.folder import METADATA, SPLITS, CorpusError, CorpusFile, read_corpus_json, write_corpus, \
    write_if_changed

FILLETS_SOUND_DIR = Path(os.environ.get("RVQLM_FILLETS_DIR", "/usr/share/games/fillets-ng/sound"))
DEFAULT_CORPUS_DIR = Path(os.environ.get("RVQLM_CORPUS_DIR", "data/fillets-cs-16k"))
CORPUS_VERSION = 1


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
    script_dir: Path = FILLETS_SCRIPT_DIR,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Decode, resample and split the corpus into `out_dir`, then write its metadata.jsonl from the
    dialog scripts under `script_dir`; return `out_dir`. `log` receives the metadata report's lines.

    max_files_per_split: keep only the first N files of each split (a quick subset for tests).
    A folder prepared with other settings is refused rather than mixed.
    """
    settings = {"version": CORPUS_VERSION, "sample_rate": sample_rate, "max_files_per_split": max_files_per_split}
    out = write_corpus(out_dir, lambda: list_source_files(sound_dir), settings, name="fillets-ng-data-cs",
                       license="GPL-2+", progress=progress)
    report = write_corpus_metadata(out, script_dir)
    for line in report.lines() if log is not None else ():
        log(line)
    return out


@dataclass
class MetadataReport:
    """What `write_corpus_metadata` found: how many files have their line, and which do not."""

    files: int = 0
    speakers: Counter = field(default_factory=Counter)  # rows per speaker ("" for none)
    no_dialog: list[str] = field(default_factory=list)  # corpus paths no script names
    no_text: list[str] = field(default_factory=list)  # named, but with no Czech text
    missing_scripts: Path | None = None  # the script folder, when it is not installed

    @property
    def rows(self) -> int:
        return sum(self.speakers.values())

    def lines(self) -> list[str]:
        if self.missing_scripts is not None:
            return [f"no {METADATA} written: the dialog scripts are not installed ({self.missing_scripts} "
                    "missing; Debian package fillets-ng-data, `make system-deps`)"]
        top = ", ".join(f"{s or '(no font)'} {n}" for s, n in self.speakers.most_common())
        return [f"{', '.join(f'{s}/{METADATA}' for s in SPLITS)}: {self.rows} of {self.files} files have "
                f"their line ({top})",
                *_by_level("no line in the dialog scripts", self.no_dialog),
                *_by_level("a line with no Czech text", self.no_text)]


def _by_level(what: str, paths: list[str]) -> list[str]:
    """'N files with WHAT:' then one line per level naming the files."""
    levels: dict[str, list[str]] = {}
    for p in paths:
        levels.setdefault(Path(p).parent.name, []).append(Path(p).stem)
    if not paths:
        return []
    return [f"{len(paths)} files with {what}:"] + [f"  {level}: {', '.join(names)}" for level, names in levels.items()]


def write_corpus_metadata(corpus_dir: str | os.PathLike, script_dir: Path = FILLETS_SCRIPT_DIR) -> MetadataReport:
    """Write `corpus_dir/<split>/metadata.jsonl` (module docstring) for the files of its corpus.json,
    from the dialog scripts `script_dir/<level>/*dialogs_cs.lua`. Reads no audio; rewrites a file
    only when its content changes. Without the scripts it writes nothing and says so in the report."""
    corpus_dir = Path(corpus_dir)
    entries = read_corpus_json(corpus_dir)["files"]
    report = MetadataReport(files=len(entries))
    if not Path(script_dir).is_dir():
        report.missing_scripts = Path(script_dir)
        return report
    dialogs: dict[str, dict] = {}
    lines: dict[str, list[str]] = {s: [] for s in SPLITS if any(e["split"] == s for e in entries)}
    for e in entries:
        if e["level"] not in dialogs:
            dialogs[e["level"]] = level_dialogs(Path(script_dir) / e["level"])
        d = dialogs[e["level"]].get(Path(e["path"]).stem)
        row = {"file_name": Path(e["path"]).relative_to(e["split"]).as_posix()}
        if d is None:
            report.no_dialog.append(e["path"])
        elif not (d.text or "").strip():
            report.no_text.append(e["path"])
        else:
            row.update(text=d.text.strip(), text_en=d.text_en.strip())
            if d.font:
                row["speaker"] = d.font
            report.speakers[d.font] += 1
        lines[e["split"]].append(json.dumps(row, ensure_ascii=False) + "\n")
    for split, rows in lines.items():
        write_if_changed(corpus_dir / split / METADATA, "".join(rows))
    return report
