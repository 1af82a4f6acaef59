"""`rvqlm tokenize` on many processes and nodes: under torchrun each rank tokenizes its share.

    torchrun --nproc-per-node 4 -m rvqlm tokenize AUDIO_DIR OUT_DIR --codec CODEC_DIR

A run of R ranks (torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE; process group
over gloo, env:// rendezvous):

1. Every rank walks AUDIO_DIR and reads its metadata (the same list on a shared filesystem) and
   checks OUT read-only (`check_distributed_folder`); after a barrier rank 0 creates it.
2. Rank r tokenizes the files whose path hashes to r (`owner`: a hash of the relative path alone,
   so adding files moves none) into its own part folder OUT/parts/worldRRRR-rankrrrr, a complete
   token folder written by `codec.tokenize.folder.tokenize_files`: the same pieces, batches and
   ShardWriter as one process, so a file's tokens are the same bit for bit, and a killed rank
   loses at most its unsealed shard.
3. After a barrier, rank 0 merges the parts into OUT's own manifest.jsonl, shards.jsonl, shards/
   and errors.jsonl (`rvqlm_core.token_parts.merge_parts`): OUT is then an ordinary token folder.

Rerun the same command after a kill: finished files are skipped, the rest redone. A rerun with
another number of ranks (or without torchrun) continues the folder too: files already in a part
of another rank count are skipped, the rest are shared among the new ranks. A folder tokenized by
a single process is refused under torchrun (continue it with one process).

The process group uses gloo on CPU and GPU alike: it carries barriers and a few sums, never
tensors of the model, and a rank may wait at a barrier for hours while others finish (`WAIT`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Mapping

import torch
import torch.distributed as dist

from codec.core.interface import AudioCodec
from codec.tokenize.audio_folder import SourceFile
from codec.tokenize.folder import (TokenizeSettings, TokenizeSummary, codec_meta, list_audio_files, read_metadata,
                                   tokenize_files, tokenize_plain)
from rvqlm_core.shard_writer import write_errors
from rvqlm_core.token_parts import (check_distributed_folder, claim_distributed_folder, done_in_other_parts,
                                    merge_parts, part_name)
from rvqlm_core.token_shards import PARTS_DIR, read_errors

#: How long a rank waits at a barrier for the others (ranks finish their shares at different times).
WAIT = timedelta(days=7)


@dataclass(frozen=True)
class Launch:
    """Where this process stands in a torchrun launch (one process: rank 0 of 1)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Launch":
        """From the variables torchrun (or a SLURM script exporting them) sets."""
        env = os.environ if env is None else env
        values = {}
        for field_name, var, default in (("rank", "RANK", 0), ("world", "WORLD_SIZE", 1),
                                         ("local_rank", "LOCAL_RANK", 0), ("local_world", "LOCAL_WORLD_SIZE", 1)):
            try:
                values[field_name] = int(env.get(var, default))
            except ValueError:
                raise ValueError(f"environment variable {var}={env[var]!r} is not an integer") from None
        launch = cls(**values)
        if launch.world < 1 or not 0 <= launch.rank < launch.world or not 0 <= launch.local_rank < launch.local_world:
            raise ValueError(f"inconsistent launch: RANK={launch.rank} WORLD_SIZE={launch.world} "
                             f"LOCAL_RANK={launch.local_rank} LOCAL_WORLD_SIZE={launch.local_world}")
        return launch

    def device(self, requested: str = "auto") -> torch.device:
        """`auto`: cuda:LOCAL_RANK when CUDA is there, else cpu; `cuda`: cuda:LOCAL_RANK; else as given."""
        if requested == "auto":
            requested = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.device(f"cuda:{self.local_rank}" if requested == "cuda" else requested)


def owner(path: str, world: int) -> int:
    """The rank (0 .. world-1) that tokenizes the file at relative POSIX `path`."""
    return int.from_bytes(hashlib.sha256(path.encode("utf-8")).digest()[:8], "big") % world


class Group:
    """The collectives a run needs, barriers and sums, over gloo; nothing at all for one process."""

    def __init__(self, launch: Launch):
        self.launch = launch
        self.owned = launch.world > 1 and not dist.is_initialized()
        if self.owned:
            dist.init_process_group("gloo", timeout=WAIT)
        if launch.world > 1 and dist.get_world_size() != launch.world:
            raise RuntimeError(f"the process group has {dist.get_world_size()} ranks, WORLD_SIZE says {launch.world}")

    def barrier(self) -> None:
        if self.launch.world > 1:
            dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        if self.launch.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def close(self) -> None:
        if self.owned:
            dist.destroy_process_group()
            self.owned = False


def tokenize(audio_dir: str | os.PathLike, out_dir: str | os.PathLike, codec: AudioCodec, settings: TokenizeSettings,
             launch: Launch | None = None) -> TokenizeSummary:
    """`rvqlm tokenize`: one process into a plain token folder, or (under torchrun, or continuing a
    folder that has parts) this rank's share, merged by rank 0. Every rank returns the run's totals;
    `errors` holds every failed file on rank 0, this rank's own elsewhere."""
    launch = launch or Launch.from_env()
    if launch.world == 1 and not (Path(out_dir) / PARTS_DIR).is_dir():
        return tokenize_plain(audio_dir, out_dir, codec, settings)
    group = Group(launch)
    try:
        return tokenize_distributed(audio_dir, out_dir, codec, settings, launch, group)
    finally:
        group.close()


def tokenize_distributed(audio_dir: str | os.PathLike, out_dir: str | os.PathLike, codec: AudioCodec,
                         settings: TokenizeSettings, launch: Launch, group: Group) -> TokenizeSummary:
    """Steps 1-3 of the module docstring on this rank."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    files = list_audio_files(audio_dir, out)
    summary = TokenizeSummary(files_found=len(files))
    metadata = read_metadata(audio_dir, files, out, summary)
    check_distributed_folder(out, codec_meta(codec))
    group.barrier()  # nobody writes before every rank has checked the folder as it was
    if launch.rank == 0:
        claim_distributed_folder(out, codec_meta(codec))
    group.barrier()
    if launch.rank != 0:
        settings = dataclasses.replace(settings, progress=False)
    own = tokenize_share(out, files, codec, metadata, settings, launch.rank, launch.world, t0=t0)
    group.barrier()  # every part is complete
    if launch.rank == 0:
        summary.errors = merge_run(out, launch.world, metadata, summary.metadata_errors)
    else:
        summary.errors = own.errors
    totals = group.sum([own.files_tokenized, own.files_skipped, own.files_failed, own.audio_seconds,
                        own.metadata_updated])
    summary.files_tokenized, summary.files_skipped, summary.files_failed = (int(v) for v in totals[:3])
    summary.audio_seconds, summary.metadata_updated = totals[3], int(totals[4])
    summary.wall_seconds = time.perf_counter() - t0
    return summary


def tokenize_share(out: Path, files: list[SourceFile], codec: AudioCodec, metadata: Mapping[str, dict],
                   settings: TokenizeSettings, rank: int, world: int, *, t0: float | None = None) -> TokenizeSummary:
    """Tokenize the files `owner` gives `rank` into its part folder (created or resumed), skipping
    files that parts of other rank counts hold; writes the part's errors.jsonl. OUT must be claimed."""
    mine = [f for f in files if owner(f.rel, world) == rank]
    summary = TokenizeSummary(files_found=len(mine))
    if settings.progress:
        settings = dataclasses.replace(settings, progress_desc=f"tokenizing (rank {rank} of {world})")
    part = out / PARTS_DIR / part_name(rank, world)
    tokenize_files(part, mine, codec, metadata, summary, settings, done_elsewhere=done_in_other_parts(out, world),
                   t0=t0)
    write_errors(part, summary.errors)
    return summary


def merge_run(out: Path, world: int, metadata: Mapping[str, dict], metadata_errors: list[dict]) -> list[dict]:
    """Rank 0, once every part of this run is complete: merge OUT. Returns the failed files (the
    errors.jsonl rows of this run's parts; OUT's errors.jsonl adds `metadata_errors`)."""
    written = [part_name(rank, world) for rank in range(world)]
    errors = [row for name in written for row in read_errors(out / PARTS_DIR / name)]
    merge_parts(out, written=written, metadata=metadata, errors=errors + metadata_errors)
    return errors
