"""Tokenize a folder of audio files into token shards (`rvqlm_core.token_shards`), fast and resumable.

    summary = tokenize_folder("audio/", "tokens/", codec, workers=1)

Pipeline (one process encodes, `workers` processes decode):

1. Walk AUDIO_DIR (recursively, sorted) for files with an audio suffix. Files already in the
   manifest with the same size and mtime are skipped (resume); changed ones are reported.
2. Decode each file to the codec's rate and channels (codec/tokenize/audio_folder.py). Short files are read
   whole by the worker pool; files longer than `STREAM_BLOCK_SECONDS` are streamed block by block
   in the main process (a background thread reads ahead), so memory never depends on a file's length.
3. Cut every file into *pieces* (codec/tokenize/pieces.py): the whole file, or chunks of `chunk_seconds`
   widened by the encoder's exact context, so that the tokens are those of encoding the whole
   file at once, whatever the chunk size. A Hugging Face codec (codec/hf/adapter.py), whose exact context
   is not known, encodes every file whole and alone (`WholeFilePlan`).
4. Batch pieces (sorted by length inside a look-ahead buffer) into encoder calls of about
   `batch_seconds` of audio, zero-padded on the right (exact too: see codec/tokenize/pieces.py).
5. Hand each file's frames, in file order, to a `ShardWriter`, which seals shards atomically.
   A kill at any moment loses at most the unsealed shard; the rerun redoes exactly that, so the
   final folder equals an uninterrupted run's.

Files that cannot be decoded go to `errors.jsonl` with the reason; the run goes on.

Metadata: an `audiofolder` metadata.jsonl / metadata.csv in AUDIO_DIR or a sub-folder
(`rvqlm_core.audio_metadata`) gives files their `metadata` in the manifest (text, speaker, ...).
Rows that cannot be attached go to errors.jsonl (`"kind": "metadata"`); a metadata file that
cannot be parsed stops the run before anything is written. A rerun brings the metadata of files
already tokenized up to date without re-encoding them. Tokens never depend on metadata.

Many processes and nodes: codec/tokenize/distributed.py runs `tokenize_files` on each rank's share.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn.utils.parametrize

from codec.core.audio import AUDIO_SUFFIXES, AudioError
from codec.core.interface import AudioCodec
from codec.tokenize.audio_folder import OrderedDecoder, SourceFile, find_audio_files, stream_blocks
from codec.tokenize.pieces import Piece, Plan, batches
from rvqlm_core.audio_metadata import read_folder_metadata
from rvqlm_core.shard_writer import ShardWriter, write_errors
from rvqlm_core.token_shards import DEFAULT_SHARD_FRAMES, ShardEntry


@dataclass(frozen=True)
class TokenizeSettings:
    """How a run goes; none of these change the tokens (shard_frames only where they are stored)."""

    workers: int = 1  # decoding processes (0: decode inline)
    batch_seconds: float = 20.0  # audio per encoder call
    chunk_seconds: float = 10.0  # longer files are encoded in chunks of this length
    max_file_seconds: float | None = None  # longer files are listed as errors
    shard_frames: int = DEFAULT_SHARD_FRAMES
    progress: bool = True  # a progress bar
    progress_desc: str = "tokenizing"

    def __post_init__(self):
        if self.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {self.workers}")
        if not self.batch_seconds > 0 or not self.chunk_seconds > 0:
            raise ValueError("--batch-seconds and --chunk-seconds must be > 0")
        if self.max_file_seconds is not None and not self.max_file_seconds > 0:
            raise ValueError("--max-file-seconds must be > 0")
        if self.shard_frames < 1:
            raise ValueError(f"--shard-frames must be >= 1, got {self.shard_frames}")


@dataclass
class TokenizeSummary:
    files_found: int = 0
    files_skipped: int = 0  # already tokenized (resume)
    files_tokenized: int = 0
    files_failed: int = 0
    audio_seconds: float = 0.0  # tokenized in this run
    wall_seconds: float = 0.0
    errors: list[dict] = field(default_factory=list)
    metadata_files: list[str] = field(default_factory=list)  # metadata.jsonl / .csv read (relative)
    files_with_metadata: int = 0  # files found whose metadata is not empty
    metadata_updated: int = 0  # files already tokenized whose manifest metadata this run changed
    metadata_errors: list[dict] = field(default_factory=list)  # rows that could not be attached

    @property
    def realtime_factor(self) -> float:
        return self.audio_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def lines(self) -> list[str]:
        return [
            f"files: {self.files_found} found, {self.files_tokenized} tokenized, "
            f"{self.files_skipped} already done, {self.files_failed} failed",
            f"audio: {self.audio_seconds / 3600:.3f} h in {self.wall_seconds:.1f} s "
            f"({self.realtime_factor:.1f}x real time)",
        ] + ([f"metadata: {self.files_with_metadata} of {self.files_found} files have some, from "
              f"{', '.join(self.metadata_files)}; {self.metadata_updated} already-tokenized files updated, "
              f"{len(self.metadata_errors)} rows with problems"] if self.metadata_files else [])


@dataclass
class _FileState:
    source: SourceFile
    parts: dict[int, np.ndarray] = field(default_factory=dict)  # keep_lo -> codes
    emitted: int = 0
    n_frames: int | None = None  # known once the file is fully decoded
    seconds: float = 0.0
    failed: str | None = None
    begun: bool = False


def codec_meta(codec: AudioCodec) -> dict[str, Any]:
    """What codec.json records about a codec: its token fingerprint (what decides and means the token
    ids; a decoder-only fine-tune keeps it), plus the layout and the full config."""
    return {"fingerprint": codec.token_fingerprint(), "n_codebooks": codec.n_codebooks,
            "codebook_size": codec.codebook_size, "frame_rate": float(codec.frame_rate),
            "sample_rate": codec.sample_rate, "codec_config": codec.config_dict()}


def tokenize_folder(
    audio_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    codec: AudioCodec,
    *,
    workers: int = 1,
    batch_seconds: float = 20.0,
    chunk_seconds: float = 10.0,
    max_file_seconds: float | None = None,
    shard_frames: int = DEFAULT_SHARD_FRAMES,
    progress: bool = True,
    on_progress: Callable[[TokenizeSummary], None] | None = None,
) -> TokenizeSummary:
    """Tokenize every audio file under `audio_dir` into the token folder `out_dir` (see module doc).

    Returns a summary; `summary.errors` lists the files that failed (also in errors.jsonl).
    """
    settings = TokenizeSettings(workers, batch_seconds, chunk_seconds, max_file_seconds, shard_frames, progress)
    return tokenize_plain(audio_dir, out_dir, codec, settings, on_progress)


def tokenize_plain(audio_dir: str | os.PathLike, out_dir: str | os.PathLike, codec: AudioCodec, settings: TokenizeSettings,
                   on_progress: Callable[[TokenizeSummary], None] | None = None) -> TokenizeSummary:
    """`tokenize_folder` with its settings in one object."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    files = list_audio_files(audio_dir, out)
    summary = TokenizeSummary(files_found=len(files))
    metadata = read_metadata(audio_dir, files, out, summary)
    tokenize_files(out, files, codec, metadata, summary, settings, on_progress=on_progress, t0=t0)
    write_errors(out, summary.errors + summary.metadata_errors)
    return summary


def list_audio_files(audio_dir: str | os.PathLike, out: Path) -> list[SourceFile]:
    """The audio files under audio_dir (sorted, `out` left out); FileNotFoundError when there are none."""
    files = find_audio_files(audio_dir, exclude=out)
    if not files:
        raise FileNotFoundError(f"no audio files ({', '.join(AUDIO_SUFFIXES)}) under {audio_dir}")
    return files


def read_metadata(audio_dir, files: list[SourceFile], out: Path, summary: TokenizeSummary) -> dict[str, dict]:
    """Every found file's metadata ({} without a row), from the folder's audiofolder metadata files;
    the summary's metadata fields are filled in."""
    found = read_folder_metadata(audio_dir, [f.rel for f in files], exclude=out)
    summary.metadata_files, summary.metadata_errors = found.files, found.errors
    summary.files_with_metadata = sum(1 for columns in found.by_path.values() if columns)
    return {f.rel: found.by_path.get(f.rel, {}) for f in files}


def tokenize_files(out: Path, files: list[SourceFile], codec: AudioCodec, metadata: Mapping[str, dict],
                   summary: TokenizeSummary, settings: TokenizeSettings, *,
                   done_elsewhere: Mapping[str, ShardEntry] | None = None,
                   on_progress: Callable[[TokenizeSummary], None] | None = None, t0: float | None = None) -> None:
    """Tokenize `files` into the token folder `out`, creating or resuming it, and count in `summary`.

    Files that `out` (or `done_elsewhere`: path -> entry, e.g. another part of a distributed
    folder) already holds with the same size and mtime are skipped; changed ones are reported in
    `summary.errors`, as are files that fail. Committed files' metadata is brought up to date.
    errors.jsonl is the caller's to write.
    """
    t0 = time.perf_counter() if t0 is None else t0
    writer = ShardWriter(out, codec_meta(codec), shard_frames=settings.shard_frames)
    summary.metadata_updated += len(writer.update_metadata({f.rel: metadata[f.rel] for f in files}))
    todo = _todo(files, {**(done_elsewhere or {}), **writer.done}, summary)
    codec.eval()
    plan = Plan.for_codec(codec, settings.chunk_seconds)
    run = _Run(codec, plan, writer, todo, metadata, summary, settings, on_progress, t0)
    decoder = OrderedDecoder(settings.workers, codec.sample_rate, codec.channels, settings.max_file_seconds)
    try:
        # Weight-normed convs recompute their weights on every call unless cached: ~30% of a call.
        with torch.nn.utils.parametrize.cached():
            run.tokenize_all(decoder)
        writer.close()
    finally:
        decoder.close()
        run.close_bar()
        writer.discard()
    summary.files_failed = len(summary.errors)
    summary.wall_seconds = time.perf_counter() - t0


def _todo(files: list[SourceFile], done: Mapping[str, ShardEntry], summary: TokenizeSummary) -> list[SourceFile]:
    """The files not yet tokenized; done ones are counted as skipped, changed ones as errors."""
    todo = []
    for f in files:
        entry = done.get(f.rel)
        if entry is None:
            todo.append(f)
        elif (entry.size, entry.mtime_ns) != (f.size, f.mtime_ns):
            summary.errors.append({"path": f.rel, "reason": "changed since it was tokenized (size or mtime differ "
                                   "from the manifest); its old tokens are kept - tokenize into a new folder to "
                                   "refresh them"})
        else:
            summary.files_skipped += 1
    return todo


class _Run:
    """The state of one tokenize run: decoded pieces -> batches -> codes -> files in order."""

    def __init__(self, codec: AudioCodec, plan: Plan, writer: ShardWriter, todo: list[SourceFile],
                 metadata: Mapping[str, dict], summary: TokenizeSummary, settings: TokenizeSettings,
                 on_progress, t0: float):
        self.codec, self.plan, self.writer, self.summary = codec, plan, writer, summary
        self.metadata = metadata
        self.files = [_FileState(f) for f in todo]
        self.head = 0  # index of the next file to hand to the writer
        self.buffer: list[Piece] = []
        self.buffered_frames = 0
        self.batch_frames = max(1, int(settings.batch_seconds * codec.frame_rate))
        self.lookahead_frames = 8 * self.batch_frames
        self.on_progress = on_progress
        self.t0 = t0
        self.bar = None
        if settings.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=len(todo), unit="file", desc=settings.progress_desc, dynamic_ncols=True)

    def tokenize_all(self, decoder: OrderedDecoder) -> None:
        """Decode every file, encode its pieces in batches and write the files' tokens in order."""
        sr, ch = self.codec.sample_rate, self.codec.channels
        for d in decoder.map([s.source for s in self.files]):
            state = self.files[d.index]
            if d.error is not None:
                self._fail(d.index, d.error)
                continue
            if d.stream:
                blocks = stream_blocks(state.source.path, sr, ch)
                pieces = self.plan.stream(d.index, blocks)
            else:
                pieces = self.plan.whole(d.index, torch.from_numpy(d.wav))
            try:
                for item in pieces:
                    if isinstance(item, int):
                        state.n_frames, state.seconds = self.plan.frames(item), item / sr
                    else:
                        self._add(item)
            except AudioError as e:
                self._fail(d.index, e.reason)
            except Exception as e:
                self._fail(d.index, f"unexpected {type(e).__name__}: {e}")
            self._emit()
        self._flush()
        self._emit()

    def _add(self, piece: Piece) -> None:
        self.buffer.append(piece)
        self.buffered_frames += piece.frames
        if self.buffered_frames >= self.lookahead_frames:
            self._flush()
            self._emit()

    def _flush(self) -> None:
        """Encode everything buffered: sorted by length, in batches of about batch_frames."""
        pieces = sorted((p for p in self.buffer if self.files[p.index].failed is None), key=lambda p: -p.frames)
        self.buffer, self.buffered_frames = [], 0
        tails: dict[int, list[Piece]] = {}
        for batch in batches(pieces, self.batch_frames):
            longest = batch[0].frames
            for p, codes in self.plan.encode(self.codec, batch):
                self.files[p.index].parts[p.keep_lo] = codes
            for p in batch:
                if p.at_end and p.frames < longest and self.plan.right > 0:
                    t = self.plan.tail(p)
                    tails.setdefault(t.frames, []).append(t)
        for same_length in tails.values():  # equal lengths: no padding, so every frame is exact
            for batch in batches(same_length, self.batch_frames):
                for p, codes in self.plan.encode(self.codec, batch):
                    self.files[p.index].parts[p.keep_lo] = codes

    def _emit(self) -> None:
        """Hand finished frames to the writer, strictly in file order."""
        while self.head < len(self.files):
            s = self.files[self.head]
            if s.failed is None:
                while s.emitted in s.parts:
                    codes = s.parts.pop(s.emitted)
                    if not s.begun:
                        f = s.source
                        self.writer.begin(f.rel, f.size, f.mtime_ns, self.metadata[f.rel])
                        s.begun = True
                    self.writer.write(codes)
                    s.emitted += len(codes)
                if s.n_frames is None or s.emitted < s.n_frames:
                    return
                self.writer.end(s.seconds)
                self.summary.files_tokenized += 1
                self.summary.audio_seconds += s.seconds
            self.files[self.head] = None  # free the memory
            self.head += 1
            self._tick()

    def _fail(self, index: int, reason: str) -> None:
        s = self.files[index]
        s.failed = reason
        s.parts.clear()
        if s.begun:
            self.writer.abort()
        self.summary.errors.append({"path": s.source.rel, "reason": reason})

    def _tick(self) -> None:
        self.summary.wall_seconds = time.perf_counter() - self.t0
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{self.summary.audio_seconds / 3600:.2f} h audio, "
                                     f"{self.summary.realtime_factor:.0f}x real time, "
                                     f"{len(self.summary.errors)} failed", refresh=False)
        if self.on_progress is not None:
            self.on_progress(self.summary)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
