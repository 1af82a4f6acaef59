"""The audio side of `codec.tokenize.folder`: walk a folder for audio files, decode them in order in worker
processes (short files whole, long ones streamed in blocks by the caller), and read blocks ahead."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from codec.core.audio import AUDIO_SUFFIXES, AudioError, audio_info, iter_audio_blocks
from rvqlm_core.audio_metadata import iter_folder

#: Files longer than this are streamed in blocks of this length; shorter ones are read whole.
#: Fixed (not a user setting) so the decoded samples, hence the tokens, never depend on options.
STREAM_BLOCK_SECONDS = 60.0


# ---------------------------------------------------------------------------------------------
# walking
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceFile:
    path: Path  # absolute
    rel: str  # relative to the audio folder, POSIX
    size: int
    mtime_ns: int


def find_audio_files(audio_dir: str | os.PathLike, *, exclude: Path | None = None) -> list[SourceFile]:
    """Every file under audio_dir with an audio suffix, sorted by relative path (hidden ones skipped)."""
    root = Path(audio_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no audio folder at {root}")
    found = []
    for p in iter_folder(root, exclude):
        if not p.name.lower().endswith(AUDIO_SUFFIXES):
            continue
        try:
            st = p.stat()
        except OSError:
            continue
        found.append(SourceFile(p, p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
    return sorted(found, key=lambda f: f.rel)


# ---------------------------------------------------------------------------------------------
# decoding (runs in worker processes)
# ---------------------------------------------------------------------------------------------

@dataclass
class Decoded:
    """A file's samples [C, S] at the codec's rate (None when streamed), or the reason it failed."""

    index: int
    wav: np.ndarray | None = None
    stream: bool = False
    error: str | None = None


def decode_file(index: int, path: str, sample_rate: int, channels: int, max_seconds: float | None) -> Decoded:
    """File `index` whole, or `stream=True` when longer than STREAM_BLOCK_SECONDS, or its error."""
    try:
        info = audio_info(path)
        if max_seconds is not None and info.duration > max_seconds:
            raise AudioError(path, f"too long ({info.duration:.1f} s > --max-file-seconds {max_seconds:g})")
        if info.duration > STREAM_BLOCK_SECONDS:
            return Decoded(index, stream=True)
        blocks = list(iter_audio_blocks(path, sample_rate, channels, STREAM_BLOCK_SECONDS))
        wav = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)
        return Decoded(index, wav=wav.numpy())
    except AudioError as e:
        return Decoded(index, error=e.reason)
    except Exception as e:  # an unreadable file must never stop the run
        return Decoded(index, error=f"unexpected {type(e).__name__}: {e}")


def stream_blocks(path: str | os.PathLike, sample_rate: int, channels: int) -> Iterator[torch.Tensor]:
    """A long file's consecutive sample blocks [C, s_i], read ahead in a background thread."""
    return read_ahead(iter_audio_blocks(path, sample_rate, channels, STREAM_BLOCK_SECONDS))


def _worker_init() -> None:
    torch.set_num_threads(1)


class OrderedDecoder:
    """Decode files in order with a bounded read-ahead, in `workers` processes (0: inline)."""

    def __init__(self, workers: int, sample_rate: int, channels: int, max_seconds: float | None):
        self.args = (sample_rate, channels, max_seconds)
        self.pool = mp.get_context("spawn").Pool(workers, initializer=_worker_init) if workers > 0 else None
        self.ahead = max(2, 4 * workers)

    def map(self, files: list[SourceFile]) -> Iterator[Decoded]:
        if self.pool is None:
            for i, f in enumerate(files):
                yield decode_file(i, str(f.path), *self.args)
            return
        pending: deque = deque()
        todo = iter(enumerate(files))
        for i, f in todo:
            pending.append(self.pool.apply_async(decode_file, (i, str(f.path), *self.args)))
            if len(pending) >= self.ahead:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def read_ahead(blocks: Iterator[torch.Tensor], depth: int = 2) -> Iterator[torch.Tensor]:
    """Run a block iterator in a background thread (libsndfile and resampling release the GIL)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run():
        try:
            for b in blocks:
                if stop.is_set():
                    return
                q.put(b)
            q.put(done)
        except BaseException as e:  # re-raised in the consumer
            q.put(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.01)
