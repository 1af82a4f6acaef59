"""Token folders written by several processes: a part folder per rank, merged into one token folder.

Layout of a folder tokenized by R ranks (`rvqlm tokenize` under torchrun)::

    OUT/codec.json                  # as in any token folder (rvqlm_core/token_shards.py)
    OUT/shards/shard-NNNNN.npy      # hard links to the parts' shards (copies where links fail)
    OUT/shards.jsonl, OUT/manifest.jsonl, OUT/errors.jsonl   # the merged folder: what readers open
    OUT/parts/world0002-rank0000/   # what rank 0 of a 2-rank run wrote: itself a complete token
    OUT/parts/world0002-rank0001/   # folder (ShardWriter), so each rank resumes like one process

`OUT` is an ordinary token folder (`TokenShards.open` reads it, checksums and all): `merge_parts`
numbers the parts' shards one after the other and rewrites each shard's `entries_sha256` for
its new name. A merge keeps the numbers of an earlier merge and appends the shards that are new,
so it never changes a file that OUT's index names: a reader (or a kill) during a merge sees the
old folder or the new one. Only when the parts no longer hold what OUT names (a part deleted by
hand) does it renumber, emptying OUT's index first.

A file lives in the part of the run that tokenized it. A run with another number of ranks keeps
the parts it finds: its ranks skip files the other parts hold (`done_in_other_parts`).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping

from rvqlm_core.atomic import atomic_path, atomic_write_json, atomic_write_text
from rvqlm_core.shard_writer import ShardWriter, check_token_folder, is_temporary, write_errors
from rvqlm_core.token_shards import (CODEC_JSON, INDEX, MANIFEST, PARTS_DIR, SHARD_DIR, SHARD_FILE, ShardEntry,
                                     TokenShardError, committed_state, entry_line, json_line, lines_sha256,
                                     make_codec_meta, placement_line, read_codec_json, shard_name)

_PART = re.compile(r"^world(\d{4,})-rank(\d{4,})$")


def part_name(rank: int, world: int) -> str:
    """The part folder of `rank` in a run of `world` ranks, e.g. world0008-rank0003."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in 0..{world - 1}")
    return f"world{world:04d}-rank{rank:04d}"


def list_parts(out: str | os.PathLike) -> list[tuple[int, int, Path]]:
    """(world, rank, folder) of every part of OUT, sorted by world size then rank."""
    root = Path(out) / PARTS_DIR
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _PART.match(p.name)
        if m is None:
            if not p.name.startswith("."):
                raise TokenShardError(f"{root} holds {p.name!r}, which is not a part folder (worldNNNN-rankNNNN)")
            continue
        found.append((int(m.group(1)), int(m.group(2)), p))
    return sorted(found, key=lambda t: t[:2])


def check_distributed_folder(out: str | os.PathLike, codec_meta: Mapping[str, Any]) -> bool:
    """Whether OUT is new (True) or a distributed token folder of this codec (False). Read-only, so
    every rank can run it before anyone writes. TokenShardError for anything else: another codec,
    a folder that is not a token folder, one tokenized by a single process."""
    root = Path(out)
    meta = make_codec_meta(codec_meta)
    new = check_token_folder(root, meta)
    if not new and not (root / PARTS_DIR).is_dir() and ((root / SHARD_DIR).exists() or (root / MANIFEST).exists()):
        raise TokenShardError(f"{root} was tokenized by a single process (it has no {PARTS_DIR}/ folder): continue "
                              "it without torchrun, or tokenize into a new folder")
    return new


def claim_distributed_folder(out: str | os.PathLike, codec_meta: Mapping[str, Any]) -> None:
    """Check OUT (as `check_distributed_folder`) and make it a distributed token folder: codec.json,
    then parts/ (a kill between leaves codec.json alone, which the next claim completes)."""
    root = Path(out)
    if check_distributed_folder(root, codec_meta):
        atomic_write_json(root / CODEC_JSON, make_codec_meta(codec_meta))
    (root / PARTS_DIR).mkdir(exist_ok=True)


def done_in_other_parts(out: str | os.PathLike, world: int) -> dict[str, ShardEntry]:
    """path -> entry of every file committed in a part of a run with another number of ranks than
    `world` (those parts are not written while ranks of `world` run)."""
    done: dict[str, ShardEntry] = {}
    for w, _, part in list_parts(out):
        if w != world:
            done.update((e.path, e) for e in committed_state(part)[1])
    return done


@dataclass
class _Shard:
    """One committed shard of a part, in OUT's numbering."""

    part: Path
    row: dict  # the part's shards.jsonl row
    entries: list[ShardEntry]  # sorted by offset

    def placement(self) -> list[tuple]:
        return [(e.path, e.offset, e.n_frames, e.seconds, e.size, e.mtime_ns) for e in self.entries]


def merge_parts(out: str | os.PathLike, *, written: Collection[str] = (),
                metadata: Mapping[str, Mapping[str, Any]] | None = None,
                errors: Iterable[Mapping[str, Any]] = ()) -> list[ShardEntry]:
    """Make OUT the token folder of every file its parts hold (see the module docstring).

    written: names of the parts this run's ranks wrote (they must exist; on a network filesystem a
    listing may not show them yet); metadata: path -> the file's metadata now (files not named keep
    their part's); errors: the rows of OUT/errors.jsonl. Returns OUT's entries in manifest order.
    """
    root = Path(out)
    meta = read_codec_json(root)
    shards = _part_shards(root, meta, written)
    kept, new = _numbering(root, shards)
    if kept is None:  # OUT names shards the parts no longer hold: renumber, never naming a changed file
        atomic_write_text(root / MANIFEST, "")
        atomic_write_text(root / INDEX, "")
        kept, new = [], shards
    (root / SHARD_DIR).mkdir(exist_ok=True)
    for number, shard in enumerate(new, len(kept)):
        _place(shard.part / SHARD_DIR / shard.row["shard"], root / SHARD_DIR / shard_name(number))
    index, entries = [], []
    for number, shard in enumerate(kept + new):
        name = shard_name(number)
        moved = [replace(e, shard=name, metadata=dict(metadata.get(e.path, e.metadata) if metadata else e.metadata))
                 for e in shard.entries]
        index.append({**shard.row, "shard": name, "entries_sha256": lines_sha256(placement_line(e) for e in moved)})
        entries.extend(moved)
    atomic_write_text(root / INDEX, "".join(json_line(r) + "\n" for r in index))
    atomic_write_text(root / MANIFEST, "".join(entry_line(e) + "\n" for e in entries))
    write_errors(root, errors)
    names = {row["shard"] for row in index}
    for p in (root / SHARD_DIR).iterdir():
        if p.name.startswith(".") or (SHARD_FILE.match(p.name) and p.name not in names):
            p.unlink()
    for p in root.iterdir():
        if is_temporary(p):
            p.unlink()
    return entries


def _part_shards(root: Path, meta: dict, written: Collection[str]) -> list[_Shard]:
    """The committed shards of every part, parts in order; a path in two parts is refused."""
    parts = {p.name: (w, r, p) for w, r, p in list_parts(root)}
    for name in written:
        m = _PART.match(name)
        if m is None or not (root / PARTS_DIR / name / CODEC_JSON).is_file():
            raise TokenShardError(f"{root / PARTS_DIR / name} is missing or incomplete, though its rank finished")
        parts[name] = (int(m.group(1)), int(m.group(2)), root / PARTS_DIR / name)
    shards, seen = [], {}
    for _, _, part in sorted(parts.values(), key=lambda t: t[:2]):
        check_token_folder(part, meta)  # the same codec as OUT
        if part.name not in written:
            ShardWriter(part, meta).discard()  # drops what a killed rank left uncommitted
        index, entries, _ = committed_state(part)
        by_shard: dict[str, list[ShardEntry]] = {}
        for e in entries:
            if e.path in seen:
                raise TokenShardError(f"{e.path!r} is in two parts of {root}, {seen[e.path]} and {part.name} "
                                      "(were two runs writing at once?); delete one of the parts and rerun")
            seen[e.path] = part.name
            by_shard.setdefault(e.shard, []).append(e)
        shards += [_Shard(part, row, sorted(by_shard[row["shard"]], key=lambda e: e.offset)) for row in index]
    return shards


def _numbering(root: Path, shards: list[_Shard]) -> tuple[list[_Shard] | None, list[_Shard]]:
    """(the shards OUT already names, in its order; the others, in part order), or (None, ...) when
    OUT names a shard the parts do not hold as it was."""
    try:
        index, entries, _ = committed_state(root)
    except TokenShardError:
        return None, shards
    by_first = {s.entries[0].path: s for s in shards}
    placed: dict[str, list[tuple]] = {}
    for e in entries:
        placed.setdefault(e.shard, []).append((e.path, e.offset, e.n_frames, e.seconds, e.size, e.mtime_ns))
    kept = []
    for row in index:
        rows = sorted(placed[row["shard"]], key=lambda t: t[1])
        shard = by_first.get(rows[0][0])
        file = root / SHARD_DIR / row["shard"]
        if shard is None or shard.placement() != rows or any(shard.row[k] != row[k] for k in ("sha256", "bytes")) \
                or not file.is_file() or file.stat().st_size != row["bytes"]:
            return None, shards
        kept.append(shard)
    return kept, [s for s in shards if all(s is not k for k in kept)]


def _place(src: Path, dest: Path) -> None:
    """Make dest a hard link to src (a copy where the filesystem has no hard links), atomically."""
    if dest.exists() and os.path.samefile(src, dest):
        return
    tmp = dest.parent / f".{dest.name}.tmp-link-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        with atomic_path(dest) as t:
            shutil.copyfile(src, t)
        return
    os.replace(tmp, dest)
