"""Writing token folders (the format: `rvqlm_core.token_shards`): `ShardWriter` appends files' tokens
and seals shards with the commit protocol described there; `write_token_corpus` builds a folder in one call."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from rvqlm_core.atomic import atomic_path, atomic_write_json, atomic_write_text
from rvqlm_core.folder_lock import LOCK_FILE
from rvqlm_core.token_shards import (CODEC_JSON, COPY_BLOCK, DEFAULT_SHARD_FRAMES, ERRORS, INDEX, MANIFEST, PARTS_DIR,
                                     SHARD_DIR, SHARD_FILE, ShardEntry, TokenShardError, TokenShards, committed_state,
                                     entry_line, file_sha256, json_line, lines_sha256, make_codec_meta,
                                     placement_line, read_codec_json, shard_name)


class ShardWriter:
    """Append files' tokens to a token folder, sealing a shard whenever it holds `shard_frames`.

    Files never straddle shards (a shard may exceed `shard_frames` by its last file). Opening a
    folder that already holds tokens resumes it: `done` maps each committed path to its entry,
    leftovers of a killed run (hidden temporaries, sealed-but-uncommitted shards) are removed,
    and a folder made by another codec is refused.

    Per file: `begin(path, size, mtime_ns, metadata)`, any number of `write(rows [n, N_c])`, then
    `end(seconds)` (or `abort()` to drop it). Call `close()` to seal the last partial shard.
    `update_metadata` changes committed files' metadata without touching their tokens.
    """

    def __init__(self, out_dir: str | os.PathLike, codec_meta: Mapping[str, Any], *,
                 shard_frames: int = DEFAULT_SHARD_FRAMES):
        if shard_frames < 1:
            raise ValueError(f"shard_frames must be >= 1, got {shard_frames}")
        self.root = Path(out_dir)
        self.meta = make_codec_meta(codec_meta)
        self.shard_frames = shard_frames
        self.dtype = np.dtype(self.meta["dtype"])
        self.n_codebooks = self.meta["n_codebooks"]
        self._claim_folder()
        self.index, entries, _ = committed_state(self.root)
        self.entries: list[ShardEntry] = entries
        self.done: dict[str, ShardEntry] = {e.path: e for e in entries}
        self._clean_leftovers()
        self._pending: list[ShardEntry] = []
        self._pending_paths: set[str] = set()
        self._pending_frames = 0
        self._pending_file = None
        self._current: dict | None = None

    def _claim_folder(self) -> None:
        if (self.root / PARTS_DIR).is_dir():
            raise TokenShardError(f"{self.root} was tokenized by several processes (it has a {PARTS_DIR}/ folder): "
                                  "continue it with `rvqlm tokenize` (under torchrun or not), which merges the parts")
        if check_token_folder(self.root, self.meta):
            atomic_write_json(self.root / CODEC_JSON, self.meta)  # first: a kill leaves nothing or a token folder

    def _clean_leftovers(self) -> None:
        shard_dir = self.root / SHARD_DIR
        shard_dir.mkdir(parents=True, exist_ok=True)
        keep = {row["shard"] for row in self.index}
        for p in shard_dir.iterdir():
            if p.name.startswith(".") or (SHARD_FILE.match(p.name) and p.name not in keep):
                p.unlink()
        with contextlib.suppress(FileNotFoundError):
            committed = "".join(json_line(row) + "\n" for row in self.index)
            if (self.root / INDEX).read_text(encoding="utf-8") != committed:
                atomic_write_text(self.root / INDEX, committed)
        for p in self.root.iterdir():
            if is_temporary(p):
                p.unlink()

    # -- per file ----------------------------------------------------------------------------
    def begin(self, path: str, size: int, mtime_ns: int, metadata: Mapping[str, Any] | None = None) -> None:
        """Open file `path`; `metadata` (a JSON object, e.g. {"text", "speaker"}) goes to its manifest line."""
        if self._current is not None:
            raise RuntimeError(f"begin({path!r}) while {self._current['path']!r} is still open")
        if path in self.done or path in self._pending_paths:
            raise ValueError(f"{path!r} is already in the token folder")
        if self._pending_file is None:
            self._pending_file = open(self._pending_path(), "wb")
        self._current = {"path": path, "size": int(size), "mtime_ns": int(mtime_ns), "n_frames": 0,
                         "start_byte": self._pending_file.tell(), "metadata": _checked_metadata(path, metadata)}

    def write(self, rows: np.ndarray) -> None:
        """Append token rows [n, N_c] (ints in 0 .. |V|-1) to the open file."""
        if self._current is None:
            raise RuntimeError("write() without begin()")
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.n_codebooks:
            raise ValueError(f"rows must be [frames, {self.n_codebooks}], got {list(rows.shape)}")
        if rows.size and (rows.min() < 0 or rows.max() >= self.meta["codebook_size"]):
            raise ValueError(f"token ids must lie in 0..{self.meta['codebook_size'] - 1}")
        self._pending_file.write(np.ascontiguousarray(rows, dtype=self.dtype).tobytes())
        self._current["n_frames"] += rows.shape[0]

    def abort(self) -> None:
        """Forget the open file's rows (e.g. its audio turned out to be corrupt halfway)."""
        if self._current is None:
            return
        self._pending_file.truncate(self._current["start_byte"])
        self._pending_file.seek(self._current["start_byte"])
        self._current = None

    def end(self, seconds: float) -> ShardEntry:
        cur, self._current = self._current, None
        if cur is None:
            raise RuntimeError("end() without begin()")
        if cur["n_frames"] == 0:
            raise ValueError(f"{cur['path']!r}: no token frames were written")
        entry = ShardEntry(path=cur["path"], shard=shard_name(len(self.index)), offset=self._pending_frames,
                           n_frames=cur["n_frames"], seconds=float(seconds), size=cur["size"],
                           mtime_ns=cur["mtime_ns"], metadata=cur["metadata"])
        self._pending.append(entry)
        self._pending_paths.add(entry.path)
        self._pending_frames += entry.n_frames
        if self._pending_frames >= self.shard_frames:
            self.seal()
        return entry

    def add(self, path: str, tokens: np.ndarray, *, seconds: float, size: int = 0, mtime_ns: int = 0,
            metadata: Mapping[str, Any] | None = None) -> ShardEntry:
        """One file in one call: tokens [frames, N_c]."""
        self.begin(path, size, mtime_ns, metadata)
        try:
            self.write(tokens)
        except BaseException:
            self.abort()
            raise
        return self.end(seconds)

    # -- sealing -----------------------------------------------------------------------------
    def _pending_path(self) -> Path:
        return self.root / SHARD_DIR / f".pending-{len(self.index):05d}.raw"

    def seal(self) -> None:
        """Write the pending rows as the next shard and commit its entries (see module docstring)."""
        if self._current is not None:
            raise RuntimeError(f"seal() while {self._current['path']!r} is open")
        if not self._pending:
            return
        name = shard_name(len(self.index))
        raw_path = self._pending_path()
        self._pending_file.close()
        self._pending_file = None
        dest = self.root / SHARD_DIR / name
        with atomic_path(dest) as tmp:
            with open(tmp, "wb") as out, open(raw_path, "rb") as src:
                header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                          "shape": (self._pending_frames, self.n_codebooks)}
                np.lib.format.write_array_header_1_0(out, header)
                while block := src.read(COPY_BLOCK):
                    out.write(block)
        raw_path.unlink()
        lines = [placement_line(e) for e in self._pending]
        row = {"shard": name, "n_frames": self._pending_frames, "bytes": dest.stat().st_size,
               "sha256": file_sha256(dest), "entries_sha256": lines_sha256(lines)}
        self.index.append(row)
        atomic_write_text(self.root / INDEX, "".join(json_line(r) + "\n" for r in self.index))
        self.entries.extend(self._pending)
        self.done.update((e.path, e) for e in self._pending)
        atomic_write_text(self.root / MANIFEST, "".join(entry_line(e) + "\n" for e in self.entries))
        self._pending, self._pending_paths, self._pending_frames = [], set(), 0

    def update_metadata(self, by_path: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Set the metadata of the committed files named in `by_path` ({} clears it); files not
        named keep theirs. One atomic rewrite of manifest.jsonl; tokens and shards.jsonl are not
        touched. Returns the paths whose metadata changed. Call it with no file open or pending."""
        if self._current is not None or self._pending:
            raise RuntimeError("update_metadata() while files are open or pending; call it before writing")
        changed = []
        for i, e in enumerate(self.entries):
            if e.path in by_path:
                new = _checked_metadata(e.path, by_path[e.path])
                if new != e.metadata:
                    self.entries[i] = self.done[e.path] = dataclasses.replace(e, metadata=new)
                    changed.append(e.path)
        if changed:
            atomic_write_text(self.root / MANIFEST, "".join(entry_line(e) + "\n" for e in self.entries))
        return changed

    def close(self) -> None:
        """Seal what is pending. The folder is then complete and readable."""
        if self._current is not None:
            self.abort()
        self.seal()
        if not (self.root / MANIFEST).exists():
            atomic_write_text(self.root / MANIFEST, "")
            atomic_write_text(self.root / INDEX, "")

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, error_type, *_) -> None:
        """`close` after the block, `discard` when it raised."""
        self.discard() if error_type is not None else self.close()

    def discard(self) -> None:
        """Drop pending (unsealed) rows, e.g. on an error; committed shards stay."""
        self._current = None
        self._pending, self._pending_paths, self._pending_frames = [], set(), 0
        if self._pending_file is not None:
            self._pending_file.close()
            self._pending_file = None
            self._pending_path().unlink(missing_ok=True)


def check_token_folder(root: Path, meta: Mapping[str, Any]) -> bool:
    """Whether `root` is new (missing or empty: True) or a token folder of the codec `meta` describes
    (False); TokenShardError for anything else: a file, a folder of other things, another codec."""
    refuse_foreign_folder(root)
    if (root / CODEC_JSON).exists():
        old = read_codec_json(root)
        if old["fingerprint"] != meta["fingerprint"] or old["n_codebooks"] != meta["n_codebooks"] \
                or old["codebook_size"] != meta["codebook_size"]:
            raise TokenShardError(
                f"{root} already holds tokens from another codec (fingerprint {old['fingerprint'][:16]}, "
                f"N_c={old['n_codebooks']}, |V|={old['codebook_size']}); this codec is "
                f"{meta['fingerprint'][:16]} (N_c={meta['n_codebooks']}, |V|={meta['codebook_size']}). "
                "Tokens of two codecs must never mix: use a new output folder.")
        return False
    return True


def refuse_foreign_folder(root: Path) -> None:
    """TokenShardError for a `root` that is a file, or a folder of other things than a token folder's (no
    codec.json, other files than temporaries and the writer lock): what a token folder's writer checks
    before it takes the folder's lock, so a refused run leaves no lock file in someone's audio folder."""
    if root.exists() and not root.is_dir():
        raise TokenShardError(f"{root} exists and is not a folder")
    if root.is_dir() and not (root / CODEC_JSON).exists() \
            and any(not is_temporary(p) and p.name != LOCK_FILE for p in root.iterdir()):
        raise TokenShardError(f"{root} is not empty and is not a token folder; choose a new output folder")


def is_temporary(p: Path) -> bool:
    """A temporary of an atomic write (rvqlm_core/atomic.py) that a kill left behind."""
    return p.name.startswith(".") and ".tmp-" in p.name


def write_errors(out_dir: str | os.PathLike, errors: Iterable[Mapping[str, Any]]) -> None:
    """Rewrite OUT/errors.jsonl atomically, sorted by path: [{"path", "reason", ...}]."""
    rows = sorted(errors, key=lambda r: r["path"])
    atomic_write_text(Path(out_dir) / ERRORS, "".join(json_line(r) + "\n" for r in rows))


def _checked_metadata(path: str, metadata: Mapping[str, Any] | None) -> dict:
    """A copy of a file's metadata, refused (ValueError) unless it is a JSON object of finite values."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise ValueError(f"{path!r}: metadata must be a mapping with string keys, got {type(metadata).__name__}")
    try:
        return json.loads(json.dumps(dict(metadata), allow_nan=False, ensure_ascii=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path!r}: metadata is not a JSON object of finite values ({e})") from None


def write_token_corpus(out_dir: str | os.PathLike, arrays: Mapping[str, np.ndarray], codec_meta: Mapping[str, Any],
                       *, shard_frames: int = DEFAULT_SHARD_FRAMES,
                       metadata: Mapping[str, Mapping[str, Any]] | None = None) -> TokenShards:
    """Build a complete token folder in one call (tests, synthetic data, conversions).

    arrays: relative path -> tokens [frames, N_c]; written in the mapping's order. `seconds` of
    each entry is frames / frame_rate; `metadata` maps paths to their metadata. Returns the opened folder.
    """
    with ShardWriter(out_dir, codec_meta, shard_frames=shard_frames) as writer:
        for path, tokens in arrays.items():
            writer.add(path, tokens, seconds=len(tokens) / float(codec_meta["frame_rate"]),
                       metadata=(metadata or {}).get(path))
    write_errors(out_dir, [])
    return TokenShards.open(out_dir)
