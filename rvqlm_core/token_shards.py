"""The on-disk token-shard format: codec tokens of a folder of audio, ready for LM training.

Pure numpy + json; knows nothing of the codec model or the LM. Layout of a token folder::

    OUT/codec.json          # format/version, the codec's config + token fingerprint, N_c, |V|,
                            # token dtype, frame_rate, sample_rate
    OUT/shards/shard-00000.npy   # uint8/16/32 array [frames, N_c]: the tokens of whole files, back to back
    OUT/shards.jsonl        # one line per sealed shard: name, n_frames, bytes, sha256 of the .npy
                            # file, sha256 of that shard's manifest lines
    OUT/manifest.jsonl      # one line per source file: path (relative), size, mtime_ns, seconds,
                            # n_frames, shard, offset  (its tokens: shard[offset : offset + n_frames]),
                            # and `metadata` (the file's audiofolder columns) when it has any
    OUT/errors.jsonl        # one line per file the last run could not tokenize: path, reason
    OUT/parts/              # only when several processes wrote the folder: one token folder per
                            # rank, merged into the files above (rvqlm_core/token_parts.py)

Commit protocol (`ShardWriter.seal`, in rvqlm_core/shard_writer.py): the shard's rows are streamed
to a hidden `.pending` file, then written as `shard-NNNNN.npy` under a temporary name and renamed; then `shards.jsonl` and
finally `manifest.jsonl` are rewritten atomically. `manifest.jsonl` is the commit point: it only
ever names complete shards, and a kill at any moment leaves a readable folder. (A kill between
the last two renames leaves one trailing `shards.jsonl` line that no manifest line names; readers
ignore it and the next `ShardWriter` drops it.)

Damage detection on `TokenShards.open`: always the cheap checks (JSON syntax and types, every
shard's header shape/dtype/byte size against the index, manifest entries tiling each shard
exactly, the per-shard hash of the manifest lines, so a hand edit of where a file's tokens lie is
caught); with `verify=True` also the sha256 of every shard file and the token range. A line's
`metadata` is left out of that hash (checked for syntax only), so that it can be updated by one
atomic rewrite of manifest.jsonl without touching shards.jsonl (`ShardWriter.update_metadata`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

FORMAT = "rvqlm-token-shards"
VERSION = 1
CODEC_JSON, MANIFEST, INDEX, ERRORS, SHARD_DIR = "codec.json", "manifest.jsonl", "shards.jsonl", "errors.jsonl", "shards"
PARTS_DIR = "parts"  # written by several processes: one part folder per rank (rvqlm_core/token_parts.py)
DEFAULT_SHARD_FRAMES = 1 << 20  # ~5.8 h of 50 Hz tokens per shard (16 MiB at N_c=8, uint16)
SHARD_FILE = re.compile(r"^shard-\d{5}\.npy$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
COPY_BLOCK = 1 << 22


class TokenShardError(ValueError):
    """A token folder is missing, damaged, edited by hand, or made by another codec."""


@dataclass(frozen=True)
class ShardEntry:
    """One source file's tokens: rows `offset : offset + n_frames` of `shards/<shard>`."""

    path: str  # relative to the audio folder, POSIX separators
    shard: str  # file name inside OUT/shards/
    offset: int
    n_frames: int
    seconds: float  # duration of the source audio
    size: int  # source file size in bytes when tokenized
    mtime_ns: int  # source file mtime when tokenized
    # the file's metadata (audiofolder columns but file_name, e.g. text, speaker); {} when none
    metadata: dict = field(default_factory=dict, hash=False)


def token_dtype(codebook_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds ids 0 .. codebook_size - 1."""
    if codebook_size < 1:
        raise ValueError(f"codebook_size must be >= 1, got {codebook_size}")
    for dt in (np.uint8, np.uint16, np.uint32):
        if codebook_size - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.uint64)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.npy"


def json_line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def entry_line(e: ShardEntry) -> str:
    """The manifest line of an entry; `metadata` only when non-empty (so lines without are as in
    folders written before metadata existed)."""
    obj = dataclasses.asdict(e)
    if not obj["metadata"]:
        del obj["metadata"]
    return json_line(obj)


def placement_line(e: ShardEntry) -> str:
    """The manifest line without metadata: what a shard's `entries_sha256` hashes."""
    return entry_line(dataclasses.replace(e, metadata={}))


def lines_sha256(lines: Iterable[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8") + b"\n")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(COPY_BLOCK):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# codec.json
# --------------------------------------------------------------------------------------------

_META_TYPES = {"fingerprint": str, "n_codebooks": int, "codebook_size": int, "frame_rate": (int, float),
               "sample_rate": int, "codec_config": dict}


def make_codec_meta(codec_meta: Mapping[str, Any]) -> dict:
    """Validate the caller's codec description and complete it into the codec.json document.

    Required keys: fingerprint (str), n_codebooks, codebook_size, sample_rate (int), frame_rate
    (number), codec_config (dict, JSON-serialisable).
    """
    for key, typ in _META_TYPES.items():
        if key not in codec_meta:
            raise ValueError(f"codec meta lacks {key!r}")
        val = codec_meta[key]
        if not isinstance(val, typ) or isinstance(val, bool):
            raise ValueError(f"codec meta {key!r} has the wrong type ({type(val).__name__})")
    if codec_meta["n_codebooks"] < 1 or codec_meta["codebook_size"] < 1:
        raise ValueError("codec meta: n_codebooks and codebook_size must be >= 1")
    doc = {k: codec_meta[k] for k in _META_TYPES}
    doc["frame_rate"] = float(doc["frame_rate"])
    doc.update(format=FORMAT, version=VERSION, dtype=token_dtype(doc["codebook_size"]).name)
    json.dumps(doc)  # fail here, not halfway through a run, if the config is not JSON
    return doc


def read_codec_json(out: Path) -> dict:
    path = out / CODEC_JSON
    if not path.is_file():
        raise TokenShardError(f"{out} is not a token folder (no {CODEC_JSON}); run `rvqlm tokenize` first")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenShardError(f"{path} is damaged (not valid JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TokenShardError(f"{path} is not an {FORMAT} description")
    if doc.get("version") != VERSION:
        raise TokenShardError(f"{path} has format version {doc.get('version')!r}; this rvqlm reads version {VERSION}")
    try:
        expected = make_codec_meta(doc)
    except ValueError as e:
        raise TokenShardError(f"{path} is damaged or edited: {e}") from None
    if doc.get("dtype") != expected["dtype"]:
        raise TokenShardError(f"{path}: dtype {doc.get('dtype')!r} does not match codebook_size "
                              f"{doc['codebook_size']} (expected {expected['dtype']})")
    return expected


# --------------------------------------------------------------------------------------------
# jsonl files
# --------------------------------------------------------------------------------------------

def _read_jsonl(path: Path) -> list[tuple[str, dict]]:
    """(raw line, parsed object) for every line; a missing file is empty."""
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TokenShardError(f"{path} is damaged (not UTF-8 text)") from None
    if text and not text.endswith("\n"):
        raise TokenShardError(f"{path} is damaged (its last line is cut off)")
    out = []
    for n, raw in enumerate(text.split("\n")[:-1], 1):  # not splitlines: strings may hold U+2028
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            raise TokenShardError(f"{path} line {n} is not valid JSON (damaged or edited by hand)") from None
        if not isinstance(obj, dict):
            raise TokenShardError(f"{path} line {n} is not a JSON object")
        out.append((raw, obj))
    return out


_ENTRY_TYPES = {"path": str, "shard": str, "offset": int, "n_frames": int, "seconds": (int, float),
                "size": int, "mtime_ns": int}
_INDEX_TYPES = {"shard": str, "n_frames": int, "bytes": int, "sha256": str, "entries_sha256": str}


def _check_fields(obj: dict, types: dict, where: str, optional: dict | None = None) -> None:
    optional = optional or {}
    types = {**types, **{k: t for k, t in optional.items() if k in obj}}
    if set(obj) != set(types):
        missing, extra = sorted(set(types) - set(obj)), sorted(set(obj) - set(types))
        raise TokenShardError(f"{where}: unexpected fields (missing {missing}, unknown {extra}); edited by hand?")
    for key, typ in types.items():
        if not isinstance(obj[key], typ) or isinstance(obj[key], bool):
            raise TokenShardError(f"{where}: field {key!r} has the wrong type ({type(obj[key]).__name__})")


def _parse_index(out: Path) -> list[dict]:
    rows = []
    for n, (_, obj) in enumerate(_read_jsonl(out / INDEX), 1):
        where = f"{out / INDEX} line {n}"
        _check_fields(obj, _INDEX_TYPES, where)
        if not SHARD_FILE.match(obj["shard"]) or obj["shard"] != shard_name(n - 1):
            raise TokenShardError(f"{where}: expected shard {shard_name(n - 1)}, found {obj['shard']!r}")
        if obj["n_frames"] < 1 or obj["bytes"] < 1 or not _HEX64.match(obj["sha256"]) \
                or not _HEX64.match(obj["entries_sha256"]):
            raise TokenShardError(f"{where}: invalid values (edited by hand?)")
        rows.append(obj)
    return rows


def _parse_manifest(out: Path) -> list[tuple[str, ShardEntry]]:
    rows = []
    for n, (raw, obj) in enumerate(_read_jsonl(out / MANIFEST), 1):
        where = f"{out / MANIFEST} line {n}"
        _check_fields(obj, _ENTRY_TYPES, where, optional={"metadata": dict})
        e = ShardEntry(**obj)
        if e.n_frames < 1 or e.offset < 0 or e.seconds < 0 or not e.path or e.path.startswith("/") \
                or ("metadata" in obj and not e.metadata):
            raise TokenShardError(f"{where}: invalid values for {e.path!r} (edited by hand?)")
        if raw != entry_line(e):
            raise TokenShardError(f"{where}: not in canonical form (edited by hand?)")
        rows.append((raw, e))
    return rows


def committed_state(out: Path) -> tuple[list[dict], list[ShardEntry], list[dict]]:
    """Read and cross-check shards.jsonl and manifest.jsonl (not the .npy files).

    Returns (committed index rows, entries in manifest order, uncommitted trailing index rows).
    """
    index = _parse_index(out)
    manifest = _parse_manifest(out)
    by_shard: dict[str, list[tuple[str, ShardEntry]]] = {}
    seen: set[str] = set()
    for raw, e in manifest:
        if e.path in seen:
            raise TokenShardError(f"{out / MANIFEST}: {e.path!r} is listed twice (edited by hand?)")
        seen.add(e.path)
        by_shard.setdefault(e.shard, []).append((raw, e))
    names = {row["shard"]: row for row in index}
    for shard in by_shard:
        if shard not in names:
            raise TokenShardError(f"{out / MANIFEST} names shard {shard!r}, which {INDEX} does not list "
                                  "(unsealed, deleted or edited by hand)")
    n_committed = len(index)
    while n_committed and index[n_committed - 1]["shard"] not in by_shard:
        n_committed -= 1  # trailing shards sealed but not yet in the manifest (a kill mid-commit)
    for row in index[:n_committed]:
        rows = by_shard.get(row["shard"])
        if not rows:
            raise TokenShardError(f"{out / MANIFEST} has no entries for {row['shard']} although later shards "
                                  "have them (lines deleted by hand?)")
        if lines_sha256(placement_line(e) for _, e in rows) != row["entries_sha256"]:
            raise TokenShardError(f"{out / MANIFEST}: the entries of {row['shard']} do not match their checksum "
                                  f"in {INDEX} (edited by hand or damaged)")
        pos = 0
        for _, e in sorted(rows, key=lambda r: r[1].offset):
            if e.offset != pos:
                raise TokenShardError(f"{out / MANIFEST}: {e.path!r} starts at row {e.offset} of {e.shard}, "
                                      f"expected {pos} (entries overlap or leave a gap)")
            pos += e.n_frames
        if pos != row["n_frames"]:
            raise TokenShardError(f"{out / MANIFEST}: entries of {row['shard']} cover {pos} rows, "
                                  f"the shard has {row['n_frames']}")
    return index[:n_committed], [e for _, e in manifest], index[n_committed:]


# --------------------------------------------------------------------------------------------
# reader
# --------------------------------------------------------------------------------------------

class TokenShards:
    """Read-only view of a token folder; every shard is memory-mapped, never loaded whole.

    >>> ts = TokenShards.open("tokens/")
    >>> e = ts.entries[0]
    >>> ts.read(e, start=100, length=50).shape    # (50, ts.n_codebooks)
    """

    def __init__(self, root: Path, meta: dict, entries: list[ShardEntry], index: list[dict],
                 shards: dict[str, np.ndarray]):
        self.root = root
        self.meta = meta
        self.entries = entries
        self.index = index
        self._shards = shards
        self._by_path = {e.path: e for e in entries}

    # -- codec.json --------------------------------------------------------------------------
    n_codebooks = property(lambda self: self.meta["n_codebooks"])
    codebook_size = property(lambda self: self.meta["codebook_size"])
    fingerprint = property(lambda self: self.meta["fingerprint"])
    frame_rate = property(lambda self: self.meta["frame_rate"])
    sample_rate = property(lambda self: self.meta["sample_rate"])
    codec_config = property(lambda self: self.meta["codec_config"])
    dtype = property(lambda self: np.dtype(self.meta["dtype"]))

    @property
    def total_frames(self) -> int:
        return sum(e.n_frames for e in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, path: str) -> bool:
        return path in self._by_path

    def entry(self, path: str) -> ShardEntry:
        try:
            return self._by_path[path]
        except KeyError:
            raise KeyError(f"{path!r} is not in {self.root / MANIFEST}") from None

    def shard(self, name: str) -> np.ndarray:
        """A whole shard, memory-mapped: [frames, N_c]."""
        return self._shards[name]

    def read(self, entry: ShardEntry | str, start: int = 0, length: int | None = None) -> np.ndarray:
        """Frames `start : start + length` of one file's tokens: [length, N_c], memory-mapped."""
        if isinstance(entry, str):
            entry = self.entry(entry)
        if length is None:
            length = entry.n_frames - start
        if start < 0 or length < 0 or start + length > entry.n_frames:
            raise IndexError(f"frames {start}:{start + length} are outside {entry.path!r} "
                             f"({entry.n_frames} frames)")
        lo = entry.offset + start
        return self._shards[entry.shard][lo : lo + length]

    @classmethod
    def open(cls, out_dir: str | os.PathLike, *, verify: bool = False) -> "TokenShards":
        """Open and check a token folder (see the module docstring for what is checked)."""
        root = Path(out_dir)
        meta = read_codec_json(root)
        index, entries, _ = committed_state(root)
        shards = {}
        for row in index:
            shards[row["shard"]] = _open_shard(root / SHARD_DIR / row["shard"], row, meta, verify)
        return cls(root, meta, entries, index, shards)


def _open_shard(path: Path, row: dict, meta: dict, verify: bool) -> np.ndarray:
    if not path.is_file():
        raise TokenShardError(f"{path} is missing (listed in {INDEX})")
    size = path.stat().st_size
    if size != row["bytes"]:
        raise TokenShardError(f"{path} has {size} bytes, {INDEX} says {row['bytes']} (truncated or replaced)")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise TokenShardError(f"{path} is not a readable .npy array ({e})") from None
    expect_shape, expect_dtype = (row["n_frames"], meta["n_codebooks"]), np.dtype(meta["dtype"])
    if arr.shape != expect_shape or arr.dtype != expect_dtype or not arr.flags.c_contiguous:
        raise TokenShardError(f"{path} holds {arr.dtype}{list(arr.shape)}, expected "
                              f"{expect_dtype}{list(expect_shape)} in C order (replaced or damaged)")
    if verify:
        if file_sha256(path) != row["sha256"]:
            raise TokenShardError(f"{path} does not match its sha256 in {INDEX} (damaged or edited)")
        top = max((int(arr[i : i + COPY_BLOCK].max()) for i in range(0, len(arr), COPY_BLOCK)), default=0)
        if top >= meta["codebook_size"]:
            raise TokenShardError(f"{path} holds token id {top} >= codebook_size {meta['codebook_size']}")
    return arr


# --------------------------------------------------------------------------------------------
# writer
def read_errors(out_dir: str | os.PathLike) -> list[dict]:
    return [obj for _, obj in _read_jsonl(Path(out_dir) / ERRORS)]
