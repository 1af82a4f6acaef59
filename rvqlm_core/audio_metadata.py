"""Per-file metadata of an audio folder in the Hugging Face `audiofolder` convention.

A folder (or any sub-folder) may hold `metadata.jsonl` (one JSON object per line) or `metadata.csv`
(a header row, then one row per file). Each row names a file by `file_name`, relative to the folder
the metadata file is in; its other columns (e.g. `text`, `speaker`) are that file's metadata::

    {"file_name": "train/airplane/let-m-divna.wav", "text": "Co je to za divnou loď?", "speaker": "font_small"}

Two kinds of problems, never a silent drop:
- a metadata file that cannot be read as a table (bad JSON or CSV, no `file_name`, text that is not
  UTF-8, NaN, both a .csv and a .jsonl in one folder) raises `MetadataError`, one line naming the
  file and line;
- a row that cannot be attached (it names a missing or non-audio file, a path outside its folder,
  or a file another row names too; its `text` or `speaker` is not a string) becomes an entry of
  `FolderMetadata.errors` ({"path", "reason"}); a file named twice gets no metadata.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterator

METADATA_NAMES = ("metadata.csv", "metadata.jsonl")
STRINGS = ("text", "speaker")  # columns that, when present and not null, must be strings
FILE_NAME = "file_name"


class MetadataError(ValueError):
    """A metadata file that cannot be parsed (the message names the file and the line)."""


@dataclass(frozen=True)
class MetadataRow:
    line: int  # 1-based line of the row in its metadata file
    file_name: Any  # as written (validated when attached to a file)
    columns: dict  # every column but file_name


@dataclass
class FolderMetadata:
    """What the metadata files of a folder say about its audio files."""

    by_path: dict[str, dict] = field(default_factory=dict)  # audio path (relative, POSIX) -> columns
    errors: list[dict] = field(default_factory=list)  # rows that could not be attached: {"path", "reason"}
    files: list[str] = field(default_factory=list)  # the metadata files read (relative, POSIX)


def iter_folder(root: Path, exclude: Path | None = None) -> Iterator[Path]:
    """Every file under `root`, skipping hidden files and folders and the folder `exclude`."""
    exclude = exclude.resolve() if exclude is not None else None
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and (exclude is None or (here / d).resolve() != exclude))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield here / name


def read_metadata_file(path: str | os.PathLike) -> list[MetadataRow]:
    """The rows of one metadata.jsonl / metadata.csv. Raises MetadataError if it cannot be parsed."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise MetadataError(f"{path} line {line}: not UTF-8 text (byte {data[e.start]:#04x})") from None
    text = text.removeprefix("\ufeff")
    rows = _read_csv(path, text) if path.suffix == ".csv" else _read_jsonl(path, text)
    for row in rows:
        _check_utf8(row.columns, f"{path} line {row.line}")
    return rows


def _read_jsonl(path: Path, text: str) -> list[MetadataRow]:
    rows = []
    for n, raw in enumerate(text.split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw, parse_constant=_no_constant)
        except (json.JSONDecodeError, ValueError) as e:
            raise MetadataError(f"{path} line {n}: not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise MetadataError(f"{path} line {n}: not a JSON object")
        if FILE_NAME not in obj:
            raise MetadataError(f"{path} line {n}: no {FILE_NAME!r} field")
        rows.append(MetadataRow(n, obj.pop(FILE_NAME), obj))
    return rows


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _read_csv(path: Path, text: str) -> list[MetadataRow]:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise MetadataError(f"{path}: empty (a header row with {FILE_NAME!r} is needed)")
        if FILE_NAME not in header:
            raise MetadataError(f"{path} line 1: no {FILE_NAME!r} column (columns: {header})")
        if len(set(header)) != len(header):
            raise MetadataError(f"{path} line 1: a column name appears twice ({header})")
        rows = []
        for values in reader:
            if not values:
                continue
            if len(values) != len(header):
                raise MetadataError(f"{path} line {reader.line_num}: {len(values)} values for "
                                    f"{len(header)} columns")
            columns = dict(zip(header, values))
            rows.append(MetadataRow(reader.line_num, columns.pop(FILE_NAME), columns))
        return rows
    except csv.Error as e:
        raise MetadataError(f"{path} line {reader.line_num}: not valid CSV ({e})") from None


def _check_utf8(value: Any, where: str) -> None:
    """Strings from JSON escapes may hold lone surrogates, which no UTF-8 file can store."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise MetadataError(f"{where}: not UTF-8 text (a lone surrogate escape)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_utf8(k, where)
            _check_utf8(v, where)
    elif isinstance(value, list):
        for v in value:
            _check_utf8(v, where)
    elif isinstance(value, float) and not math.isfinite(value):
        raise MetadataError(f"{where}: {value} is not a JSON number")


def find_metadata_files(root: Path, exclude: Path | None = None) -> list[Path]:
    """The metadata files under `root` (sorted); two kinds in one folder are refused."""
    found = [p for p in iter_folder(root, exclude) if p.name in METADATA_NAMES]
    folders = [p.parent for p in found]
    for p in found:
        if folders.count(p.parent) > 1:
            raise MetadataError(f"{p.parent} holds both {' and '.join(METADATA_NAMES)}; keep one")
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def read_folder_metadata(root: str | os.PathLike, audio_paths: Collection[str], *,
                         exclude: Path | None = None) -> FolderMetadata:
    """Attach the rows of every metadata file under `root` to the audio files `audio_paths`
    (relative to root, POSIX). Raises MetadataError for a file that cannot be parsed."""
    root = Path(root)
    audio = set(audio_paths)
    out = FolderMetadata()
    named: dict[str, list[str]] = {}  # audio path -> where rows name it
    for meta_path in find_metadata_files(root, exclude):
        rel_meta = meta_path.relative_to(root).as_posix()
        base = posixpath.dirname(rel_meta)
        out.files.append(rel_meta)
        for row in read_metadata_file(meta_path):
            where = f"{rel_meta} line {row.line}"
            rel, problem = _resolve(base, row.file_name)
            if problem is None and rel not in audio:
                problem = f"names {rel!r}, which is not an audio file under the folder"
            problem = problem or next((f"{name!r} must be a string, got {row.columns[name]!r}" for name in STRINGS
                                       if not isinstance(row.columns.get(name, ""), (str, type(None)))), None)
            if problem is not None:
                out.errors.append({"path": rel or rel_meta, "reason": f"{where}: {problem}", "kind": "metadata"})
                continue
            named.setdefault(rel, []).append(where)
            out.by_path[rel] = row.columns
    for rel, wheres in named.items():
        if len(wheres) > 1:
            del out.by_path[rel]
            out.errors.append({"path": rel, "reason": f"named by {len(wheres)} metadata rows ({', '.join(wheres)}); "
                                                      "its metadata is left empty", "kind": "metadata"})
    return out


def _resolve(base: str, file_name: Any) -> tuple[str | None, str | None]:
    """(audio path relative to the root, None) or (None, the problem)."""
    if not isinstance(file_name, str) or not file_name.strip():
        return None, f"{FILE_NAME} must be a non-empty string, got {file_name!r}"
    name = file_name.replace("\\", "/")
    if name.startswith("/"):
        return None, f"{FILE_NAME} {file_name!r} is absolute; it must be relative to the metadata file's folder"
    rel = posixpath.normpath(posixpath.join(base, name))
    if rel == ".." or rel.startswith("../") or (base and not rel.startswith(base + "/")):
        return None, f"{FILE_NAME} {file_name!r} points outside the metadata file's folder"
    return rel, None
