"""Token windows for LM training and evaluation, read from the token shards of `rvqlm tokenize`.

The shards are memory-mapped: a window costs one small read, never a shard load.

Splits are **by file**, never by window, so no held-out frame shares a file with training frames
(lm.splits: by the corpus's ``train/ valid/ test/`` folders, or by a hash of each path).

Training windows (`TrainWindowStream`) are random but reproducible: window ``i`` of the run is a
pure function of ``(seed, i)`` (a counter-based RNG), so the data position of a run is one
integer, the number of batches consumed, and resuming from a checkpoint continues the exact
same stream. A window picks a file with probability proportional to its length (every frame is
equally likely; ``sample_weights`` scales that per group of files, e.g. real speech beside a larger
synthetic set) and a uniform start inside it; files shorter than the window are padded and
masked (``frame_mask`` False). With W ranks, global batch ``g`` is cut into W rank batches, so
W ranks with batch B see exactly the windows that 1 rank with batch W*B sees.

Validation windows (`ValidWindows`) tile every held-out file with consecutive windows, the last
one padded, so every held-out frame is scored exactly once; they are the same on every run.

Batches are dicts: ``codes`` [B, N_c, T] int64, ``frame_mask`` [B, T] bool, and for training
``batch_index`` (the batch's position in the run's stream).

Conditions (``conditions=True``, for a conditioned LM): each window also carries its file's
``text`` and ``speaker`` (lists of B strings from the token folder's metadata, "" = none) and
``ends`` [B] bool (the window reaches its file's last frame: the end-of-audio token follows).
A text says what a whole file says, so only a window that starts at its file's first frame gets
it; a window that starts inside a file gets the null text "" (it does not hold the start the
text begins with) but keeps the speaker, whose voice is the same throughout. Which windows are
drawn does not depend on conditions, so a conditioned run sees the windows an unconditioned one does.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Sequence

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from lm.aligned_text import aligned_durations, frame_units_from_durations
from lm.config import LMConfig
from lm.text_units import build_alphabet
from rvqlm_core.batch_stream import BatchStream, StreamLoader, StreamPosition, worker_share
from lm.splits import SPLIT_NAMES, SplitBy, file_weights, hash_fraction, select_split  # noqa: F401
from rvqlm_core.token_shards import TokenShards

@dataclass(frozen=True)
class TokenFiles:
    """The files of one split: which shard entries, how many frames each holds, and each file's text
    and speaker from its metadata ("" when it has none)."""

    tokens_dir: str
    entry_indices: tuple[int, ...]
    n_frames: tuple[int, ...]
    relpaths: tuple[str, ...]
    texts: tuple[str, ...] = ()
    speakers: tuple[str, ...] = ()
    durations: tuple[tuple[int, ...], ...] | None = None  # aligned text: frames per unit (() for no text)

    @classmethod
    def of_split(cls, tokens_dir: str | os.PathLike, split: str, split_by: SplitBy = "prefix",
                 valid_fraction: float = 0.1, shards: TokenShards | None = None,
                 text_field: str = "text", alignments: bool = False) -> "TokenFiles":
        shards = shards or TokenShards.open(tokens_dir)
        relpaths = [e.path for e in shards.entries]
        chosen = [i for i in select_split(relpaths, split, split_by, valid_fraction)
                  if shards.entries[i].n_frames > 0]
        if not chosen:
            raise ValueError(f"every file of the '{split}' split of {tokens_dir} has 0 frames")
        texts = tuple(metadata_string(shards.entries[i].metadata, text_field, tokens_dir, relpaths[i]) for i in chosen)
        speakers = tuple(metadata_string(shards.entries[i].metadata, "speaker", tokens_dir, relpaths[i])
                         for i in chosen)
        durations = None
        if alignments:
            durations = aligned_durations(tokens_dir, [shards.entries[i] for i in chosen], texts)
        return cls(str(tokens_dir), tuple(chosen), tuple(shards.entries[i].n_frames for i in chosen),
                   tuple(relpaths[i] for i in chosen), texts, speakers, durations)

    @cached_property
    def _file_of_entry(self) -> dict[int, int]:
        return {entry: i for i, entry in enumerate(self.entry_indices)}

    def conditions(self, spans: Sequence[tuple[int, int, int]]) -> dict:
        """The conditions of windows (entry index, start, n frames): text ("" unless the window starts
        the file), speaker and ends [B] bool (see the module docstring)."""
        files = [self._file_of_entry[entry] for entry, _, _ in spans]
        says = [(bool(self.durations[f]) if self.durations is not None else start == 0) for f, (_, start, _)
                in zip(files, spans)]
        out = {"text": [self.texts[f] if say else "" for f, say in zip(files, says)],
               "speaker": [self.speakers[f] for f in files],
               "ends": torch.tensor([start + n == self.n_frames[f] for f, (_, start, n) in zip(files, spans)])}
        if self.durations is not None:  # every window reads its file's whole text, placed on its frames
            rows = [self.durations[f] for f in files]
            units = frame_units_from_durations([d or [0] for d in rows], max(self.n_frames[f] for f in files))
            units = torch.where(torch.tensor([bool(d) for d in rows])[:, None], units, -1)
            width = max(span[2] for span in spans)
            out["frame_units"] = torch.stack([torch.nn.functional.pad(units[row, start:start + n], (0, width - n),
                                                                      value=-1)
                                              for row, (_, start, n) in enumerate(spans)])
            out["durations"] = torch.full((len(rows), max([1, *(len(d) for d in rows)])), -1.0)
            for row, d in enumerate(rows):
                out["durations"][row, :len(d)] = torch.tensor(d, dtype=torch.float32)
        return out

    def conditions_sha256(self) -> str:
        """A hash of every file's text, speaker (and durations): a resumed run must read the same conditions."""
        data = [self.texts, self.speakers] + ([self.durations] if self.durations is not None else [])
        return hashlib.sha256(json.dumps(data, ensure_ascii=False).encode()).hexdigest()

    @property
    def total_frames(self) -> int:
        return sum(self.n_frames)

    def __len__(self) -> int:
        return len(self.entry_indices)


def metadata_string(metadata: dict, key: str, tokens_dir, relpath: str) -> str:
    """metadata[key] as a string ("" when absent or null); ValueError naming the file for anything else."""
    value = metadata.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{tokens_dir}/manifest.jsonl: {relpath}: metadata {key!r} must be a string, "
                         f"got {type(value).__name__}")
    return value


# ---- reading windows --------------------------------------------------------------------------------

class _WindowReader:
    """Reads [N_c, T] windows out of the shards; opens them lazily, once per process.

    The open TokenShards (memory maps) is never pickled: DataLoader workers open their own.
    """

    def __init__(self, tokens_dir: str):
        self.tokens_dir = tokens_dir
        self._shards: TokenShards | None = None

    @property
    def shards(self) -> TokenShards:
        if self._shards is None:
            self._shards = TokenShards.open(self.tokens_dir)
        return self._shards

    def __getstate__(self) -> dict:
        return {"tokens_dir": self.tokens_dir, "_shards": None}

    def read_batch(self, spans: Sequence[tuple[int, int, int]], window: int, n_codebooks: int
                   ) -> dict[str, torch.Tensor]:
        """spans: (entry index, start frame, n frames <= window) per row -> a padded batch.

        Returns codes [B, n_codebooks, window] int64, the first n_codebooks codebooks of the folder's
        (padding frames hold 0), and frame_mask [B, window].
        """
        codes = np.zeros((len(spans), window, n_codebooks), dtype=np.int64)
        mask = np.zeros((len(spans), window), dtype=bool)
        entries = self.shards.entries
        for row, (entry_index, start, length) in enumerate(spans):
            codes[row, :length] = self.shards.read(entries[entry_index], start, length)[:, :n_codebooks]
            mask[row, :length] = True
        return {"codes": torch.from_numpy(codes).transpose(1, 2).contiguous(),
                "frame_mask": torch.from_numpy(mask)}


class TrainWindowStream(BatchStream):
    """Random training windows, yielded as whole batches (see BatchStream for ranks, epochs, workers).

    Sample i of the run (counted over all ranks) is drawn by ``np.random.default_rng([seed, i])``;
    the stream never repeats a sample index. A file is drawn in proportion to its frames, times its
    entry of `weights` [n_files] when given.
    """

    def __init__(self, files: TokenFiles, n_codebooks: int, window_frames: int, batch_size: int,
                 batches_per_epoch: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 position: StreamPosition | None = None, conditions: bool = False,
                 weights: Sequence[float] | None = None):
        if window_frames < 1:
            raise ValueError(f"window_frames must be >= 1, got {window_frames}")
        super().__init__(batch_size, batches_per_epoch, rank, world_size, position)
        self.files = files
        self.reader = _WindowReader(files.tokens_dir)
        self.n_codebooks = n_codebooks
        self.window_frames = window_frames
        self.seed = seed
        self.conditions = conditions
        frames = np.asarray(files.n_frames, dtype=np.float64)
        self.weights = None if weights is None else list(weights)
        if weights is not None:
            if len(weights) != len(frames) or not all(w >= 0 and math.isfinite(w) for w in weights) or \
                    not (frames * np.asarray(weights)).sum() > 0:
                raise ValueError(f"weights must be {len(frames)} finite values >= 0, not all zero")
            frames = frames * np.asarray(weights, dtype=np.float64)
        self._cum_frames = np.cumsum(frames)

    def sample_span(self, sample_index: int) -> tuple[int, int, int]:
        """(entry index, start, length) of sample `sample_index`: a pure function of (seed, index)."""
        rng = np.random.default_rng([self.seed, sample_index])
        file = self._draw_file(rng)
        n = self.files.n_frames[file]
        length = min(n, self.window_frames)
        start = int(rng.integers(n - length + 1))
        return self.files.entry_indices[file], start, length

    def _draw_file(self, rng: np.random.Generator) -> int:
        """A file index, drawn with probability proportional to its (weighted) frames."""
        total = self._cum_frames[-1]
        if self.weights is None:  # the integer draw of every unweighted run (resumes stay exact)
            frame = int(rng.integers(int(total)))
        else:
            frame = float(rng.random() * total)
        return min(int(np.searchsorted(self._cum_frames, frame, side="right")), len(self._cum_frames) - 1)

    def batch(self, batch_index: int) -> dict[str, torch.Tensor]:
        """Rank batch `batch_index` of the stream."""
        first = self.first_sample(batch_index)
        spans = [self.sample_span(first + j) for j in range(self.batch_size)]
        out = self.reader.read_batch(spans, self.window_frames, self.n_codebooks)
        if self.conditions:
            out.update(self.files.conditions(spans))
        out["batch_index"] = torch.tensor(batch_index)
        return out


class ValidWindows(IterableDataset):
    """Every frame of the held-out files, in consecutive windows (the last of a file padded).

    Rank r takes windows r, r + W, ...; DataLoader workers split a rank's windows the same way.
    `max_windows` keeps evenly spaced windows only (for quick validation during training).
    """

    def __init__(self, files: TokenFiles, n_codebooks: int, window_frames: int, batch_size: int,
                 rank: int = 0, world_size: int = 1, max_windows: int | None = None, conditions: bool = False):
        if window_frames < 1 or batch_size < 1:
            raise ValueError(f"window_frames and batch_size must be >= 1, got {window_frames}, {batch_size}")
        self.reader = _WindowReader(files.tokens_dir)
        self.files = files
        self.conditions = conditions
        self.n_codebooks = n_codebooks
        self.window_frames = window_frames
        self.batch_size = batch_size
        spans = [(entry, start, min(window_frames, n - start))
                 for entry, n in zip(files.entry_indices, files.n_frames)
                 for start in range(0, n, window_frames)]
        if max_windows is not None and max_windows < len(spans):
            if max_windows < 1:
                raise ValueError(f"max_windows must be >= 1, got {max_windows}")
            keep = np.linspace(0, len(spans) - 1, max_windows).round().astype(int)
            spans = [spans[i] for i in keep]
        self.all_spans = spans
        self.spans = spans[rank::world_size]

    def __len__(self) -> int:
        return math.ceil(len(self.spans) / self.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        worker, n_workers = worker_share()
        for b in range(worker, len(self), n_workers):
            chunk = self.spans[b * self.batch_size:(b + 1) * self.batch_size]
            out = self.reader.read_batch(chunk, self.window_frames, self.n_codebooks)
            if self.conditions:
                out.update(self.files.conditions(chunk))
            yield out


# ---- the DataModule ---------------------------------------------------------------------------------

class TokenDataModule(pl.LightningDataModule):
    """Training and validation batches from a folder of token shards.

    Args:
        tokens_dir: the OUT_DIR of `rvqlm tokenize` (manifest.jsonl, codec.json, shards).
        window_frames: T, frames per training/validation window.
        batch_size: windows per batch and per rank.
        batches_per_epoch: length of one training "epoch" (windows are sampled, not enumerated).
        split_by, valid_fraction: how held-out files are chosen (see the module docstring).
        valid_batch_size: defaults to batch_size.
        max_valid_windows: cap on validation windows (evenly spaced); None = every held-out frame.
        num_workers: DataLoader worker processes (reading is a memory-map copy: 0 is usually best).
        seed: the training stream's seed.
        conditions: give each window its file's text, speaker and end (a conditioned LM; see the
            module docstring); `text_field` names the metadata column of the text.
        alignments: an aligned-text LM's data (lm.aligned_text): every window reads its file's whole text,
            each frame's unit and the units' durations from the folder's alignments.jsonl (`rvqlm align`).
        sample_weights: {glob: weight}: training files whose path in the token folder matches a glob
            (fnmatch, the first that matches) are drawn weight times as often per frame; others 1.
        keep_codebooks: model only the first k codebooks of the folder's N_c (None: all), e.g. 8 of
            Mimi's 32: a residual quantizer's first k codes are a coarser code of the same audio.

    The token layout (n_codebooks, i.e. keep_codebooks or all, codebook_size, codec_fingerprint, frame_rate) is read from
    the shards at construction, so a model can be sized from it (LightningCLI links them), and so
    is `speakers`: every speaker name in the folder's metadata, sorted (a conditioned LM's table).
    The data position (batches consumed) is saved in checkpoints through state_dict.
    """

    def __init__(self, tokens_dir: str, window_frames: int = 500, batch_size: int = 8,
                 batches_per_epoch: int = 1000, split_by: SplitBy = "prefix", valid_fraction: float = 0.1,
                 valid_batch_size: int | None = None, max_valid_windows: int | None = None,
                 num_workers: int = 0, seed: int = 0, conditions: bool = False, text_field: str = "text",
                 sample_weights: dict[str, float] | None = None, keep_codebooks: int | None = None,
                 alignments: bool = False):
        super().__init__()
        if not Path(tokens_dir).is_dir():
            raise FileNotFoundError(f"token folder {tokens_dir} does not exist (make it with `rvqlm tokenize`)")
        self.tokens_dir = str(tokens_dir)
        shards = TokenShards.open(self.tokens_dir)
        self.n_codebooks = int(shards.n_codebooks)
        if keep_codebooks is not None:
            if isinstance(keep_codebooks, bool) or not isinstance(keep_codebooks, int) \
                    or not 1 <= keep_codebooks <= self.n_codebooks:
                raise ValueError(f"data.keep_codebooks must be in 1..{self.n_codebooks} (the codebooks of "
                                 f"{tokens_dir}), got {keep_codebooks!r}")
            self.n_codebooks = keep_codebooks
        self.codebook_size = int(shards.codebook_size)
        self.codec_fingerprint = str(shards.fingerprint)
        self.frame_rate = float(shards.frame_rate)
        if alignments and not conditions:
            raise ValueError("data.alignments places texts on frames: it needs data.conditions: true")
        self.alignments = alignments
        self.train_files = TokenFiles.of_split(self.tokens_dir, "train", split_by, valid_fraction, shards, text_field,
                                               alignments)
        self.valid_files = TokenFiles.of_split(self.tokens_dir, "valid", split_by, valid_fraction, shards, text_field,
                                               alignments)
        self.speakers = sorted({str(e.metadata["speaker"]) for e in shards.entries if e.metadata.get("speaker")})
        # an aligned-text LM's units: every letter the training and held-out texts use (lm.text_units)
        self.alphabet = build_alphabet(self.train_files.texts + self.valid_files.texts) if alignments else None
        self.conditions = conditions
        self.window_frames = window_frames
        self.batch_size = batch_size
        self.batches_per_epoch = batches_per_epoch
        self.valid_batch_size = valid_batch_size or batch_size
        self.max_valid_windows = max_valid_windows
        self.num_workers = num_workers
        self.seed = seed
        self.sample_weights = dict(sample_weights or {})
        self.train_weights = file_weights(self.train_files.relpaths, self.sample_weights)
        self.position = StreamPosition()

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        stream = TrainWindowStream(self.train_files, self.n_codebooks, self.window_frames, self.batch_size,
                                   self.batches_per_epoch, self.seed, rank, world, self.position, self.conditions,
                                   self.train_weights)
        # batch_size=None: the stream yields whole batches. No persistent workers: each epoch's
        # workers must start from the current position.
        return StreamLoader(stream, batch_size=None, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        windows = ValidWindows(self.valid_files, self.n_codebooks, self.window_frames, self.valid_batch_size,
                               rank, world, self.max_valid_windows, self.conditions)
        return DataLoader(windows, batch_size=None, num_workers=self.num_workers)

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        # Runs when the training loop takes a batch for its step (after any prefetching), so the
        # position counts batches actually trained on.
        if self.trainer is not None and self.trainer.training and "batch_index" in batch:
            self.position.consumed_batches = int(batch["batch_index"]) + 1
        return batch

    def _stream_settings(self) -> dict:
        """What the training stream depends on besides its position: a resume must not change it."""
        settings = {"seed": self.seed, "batch_size": self.batch_size, "window_frames": self.window_frames,
                    "train_files": len(self.train_files), "codec_fingerprint": self.codec_fingerprint}
        if self.conditions:
            settings["conditions_sha256"] = self.train_files.conditions_sha256()
        settings["sample_weights"] = self.sample_weights
        return settings

    def state_dict(self) -> dict:
        return {"consumed_batches": self.position.consumed_batches, **self._stream_settings()}

    def load_state_dict(self, state: dict) -> None:
        now = self._stream_settings()
        changed = [f"{k}: checkpoint {state[k]!r}, now {now[k]!r}" for k in now if k in state and state[k] != now[k]]
        if changed:
            raise ValueError("cannot resume the training data stream exactly, the data settings changed ("
                             + "; ".join(changed) + ")")
        self.position.consumed_batches = int(state["consumed_batches"])


def check_conditions(cfg: LMConfig, dm: TokenDataModule) -> None:
    """A conditioned LM needs data with conditions (and the other way round), texts within its
    limit and speakers in its table: ValueError naming the file or the speakers."""
    if (cfg.condition is not None) != dm.conditions:
        raise ValueError(f"the LM {'is' if cfg.condition is not None else 'is not'} conditioned but "
                         f"data.conditions is {dm.conditions}: set both (model.config.condition and "
                         "data.conditions: true) or neither")
    if cfg.condition is None:
        return
    if bool(cfg.condition.alphabet) != dm.alignments:
        raise ValueError(f"the LM {'reads' if cfg.condition.alphabet else 'does not read'} aligned text "
                         f"(condition.alphabet) but data.alignments is {dm.alignments}: set both or neither")
    known = set(cfg.condition.speakers)
    for files in (dm.train_files, dm.valid_files):
        for path, text, speaker in zip(files.relpaths, files.texts, files.speakers):
            if len(text.encode("utf-8")) > cfg.condition.text_max_bytes:
                raise ValueError(f"{dm.tokens_dir}: {path}: its text has {len(text.encode('utf-8'))} UTF-8 bytes, "
                                 f"over the LM's text_max_bytes={cfg.condition.text_max_bytes}")
            if speaker and speaker not in known:
                raise ValueError(f"{dm.tokens_dir}: {path}: speaker {speaker!r} is not in the LM's table "
                                 f"({', '.join(cfg.condition.speakers) or 'empty'})")


# ---- a batch's conditions, as the model's loss takes them -------------------------------------------

def batch_conditions(model, batch: dict, ends: bool = True) -> dict[str, Any]:
    """The `loss` arguments of a batch's conditions for a conditioned LM ({} for an unconditioned
    one): condition (texts and speakers, "" = null) and, with `ends`, the file ends."""
    if model.config.condition is None:
        return {}
    n = batch["codes"].shape[0]
    condition = model.condition_inputs([t or None for t in batch["text"]], [s or None for s in batch["speaker"]], n)
    if "frame_units" in batch:  # aligned text (lm.aligned_text): where each unit is said, and the durations
        condition.frame_units = batch["frame_units"].to(condition.text.device)
        condition.durations = batch["durations"].to(condition.text.device)
    return {"condition": condition, "ends": batch["ends"] if ends else None}
