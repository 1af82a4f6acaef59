"""Audio crops for codec training: a dataset of random crops, one of fixed crops, and the DataModule.

Training crops: a stream of batches in which crop i of the run is a pure function of (seed, i)
(every file seen once per pass, in a seeded order, at a seeded random offset), so an interrupted
run resumes on exactly the batches it would have read (the position is saved in checkpoints);
validation crops: the middle of each chosen file, the same every time. Training crops may be
speed-perturbed (`speeds`: each crop is played at one of these speeds, drawn per crop, which moves
pitch, formants and tempo together). Audio is read with `codec.core.audio.load_audio` (any format
libsndfile reads, resampled and down/up-mixed to the codec's layout); a file shorter than the crop
is zero-padded at the end.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torchaudio.functional as AF
from torch.utils.data import DataLoader, Dataset

from codec.core.audio import AUDIO_SUFFIXES, audio_info, load_audio
from codec.neural.augment import Augmentation
from rvqlm_core.batch_stream import BatchStream, StreamLoader, StreamPosition


def list_audio_files(folder: str | os.PathLike) -> list[Path]:
    """Every audio file under `folder` (recursive, sorted). Raises if there is none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no audio folder at {folder}")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
    if not files:
        raise ValueError(f"no audio files ({', '.join(AUDIO_SUFFIXES)}) under {folder}")
    return files


def _fit_length(wav: torch.Tensor, length: int) -> torch.Tensor:
    """Trim or zero-pad [C, S] to exactly `length` samples."""
    if wav.shape[-1] >= length:
        return wav[:, :length]
    return torch.nn.functional.pad(wav, (0, length - wav.shape[-1]))


class _CropDataset(Dataset):
    def __init__(self, files: list[str | os.PathLike], sample_rate: int, channels: int, crop_seconds: float):
        if not files:
            raise ValueError("no audio files given")
        if crop_seconds <= 0:
            raise ValueError(f"crop_seconds must be > 0, got {crop_seconds}")
        self.files = [Path(f) for f in files]
        self.sample_rate, self.channels = sample_rate, channels
        self.crop_seconds = crop_seconds
        self.crop = int(round(crop_seconds * sample_rate))
        self.durations = [audio_info(f).duration for f in self.files]  # header reads only

    def _load(self, index: int, offset: float, speed: float = 1.0) -> torch.Tensor:
        """crop_seconds of file `index` from `offset`, played at `speed` (see RandomCropDataset)."""
        wav = load_audio(self.files[index], self.sample_rate, self.channels, offset_seconds=offset,
                         duration_seconds=speed * self.crop_seconds)
        if speed != 1.0:
            wav = AF.resample(wav, int(round(speed * self.sample_rate)), self.sample_rate)
        return _fit_length(wav, self.crop)


class RandomCropDataset(_CropDataset):
    """`items` random crops [C, crop] per pass; crop i of the run is a pure function of (seed, i).

    Pass e (items e * items ... (e + 1) * items - 1) visits the files in the order of a permutation
    drawn by ``np.random.default_rng([seed, e])`` (item j of the pass reads file perm[j] % n_files,
    so every file is seen once per pass of `len(files)` items, whatever its length); the crop's
    offset is drawn by ``np.random.default_rng([seed, i, 1])``. `dataset[i]` is that crop for any
    i >= 0: a run's data does not depend on worker count, and a resumed run reads exactly what
    the uninterrupted one would have.

    speeds: playback speeds to draw from, one per crop by ``np.random.default_rng([seed, i, 2])``
    (None or [1.0]: none). At speed s the crop is ``s * crop_seconds`` of the file resampled from
    ``round(s * sample_rate)`` to `sample_rate` Hz: s > 1 is faster and higher. Each
    ``s * sample_rate`` must be a whole number of Hz, so that the resampling kernel is exact.

    augment: level, telephone band and noise drawn per crop by ``np.random.default_rng([seed, i, 3])``
    (codec/neural/augment.py).
    """

    def __init__(self, files, sample_rate: int, channels: int = 1, crop_seconds: float = 1.0,
                 items: int | None = None, seed: int = 0, speeds: list[float] | None = None,
                 augment: Augmentation | None = None):
        super().__init__(files, sample_rate, channels, crop_seconds)
        self.augment = augment or Augmentation()
        self.items = items or len(self.files)
        if self.items < 1:
            raise ValueError(f"items must be >= 1, got {self.items}")
        self.seed = seed
        self.speeds = [float(s) for s in speeds] if speeds else [1.0]
        for s in self.speeds:
            if not 0.5 <= s <= 2.0 or abs(s * sample_rate - round(s * sample_rate)) > 1e-6:
                raise ValueError(f"speed {s}: speeds must lie in [0.5, 2] and make speed * {sample_rate} a whole "
                                 "number of Hz")
        self._perm: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.items

    def speed(self, i: int) -> float:
        """The playback speed of crop i of the run."""
        if len(self.speeds) == 1:
            return self.speeds[0]
        return self.speeds[int(np.random.default_rng([self.seed, i, 2]).integers(len(self.speeds)))]

    def file_and_offset(self, i: int) -> tuple[int, float]:
        """(file index, offset in seconds) of crop i of the run."""
        epoch, j = divmod(i, self.items)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.items))
        f = int(self._perm[1][j]) % len(self.files)
        slack = max(self.durations[f] - self.speed(i) * self.crop_seconds, 0.0)
        return f, float(np.random.default_rng([self.seed, i, 1]).random()) * slack

    def __getitem__(self, i: int) -> torch.Tensor:
        if i < 0:
            raise IndexError(f"crop index {i} < 0")
        wav = self._load(*self.file_and_offset(i), self.speed(i))
        if self.augment.active:
            wav = self.augment.apply(wav, self.sample_rate, np.random.default_rng([self.seed, i, 3]))
        return wav


class CropBatchStream(BatchStream):
    """Training batches {"audio": [B, C, crop], "batch_index"}: rank r's batch b holds crops
    ``(b * world_size + r) * batch_size + j`` of the RandomCropDataset (see BatchStream)."""

    def __init__(self, crops: RandomCropDataset, batch_size: int, batches_per_epoch: int, rank: int = 0,
                 world_size: int = 1, position: StreamPosition | None = None):
        super().__init__(batch_size, batches_per_epoch, rank, world_size, position)
        self.crops = crops

    def batch(self, batch_index: int) -> dict[str, torch.Tensor]:
        first = self.first_sample(batch_index)
        audio = torch.stack([self.crops[first + j] for j in range(self.batch_size)])
        return {"audio": audio, "batch_index": torch.tensor(batch_index)}


class FixedCropDataset(_CropDataset):
    """Deterministic crops [C, crop]: the middle `crop_seconds` of each file (padded if shorter)."""

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        offset = max(self.durations[i] - self.crop_seconds, 0.0) / 2
        return self._load(i, offset)


def evenly_spaced(items: list, n: int | None) -> list:
    """n items spread evenly over the list (all of them when n is None or >= len)."""
    if n is None or n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


class CodecDataModule(L.LightningDataModule):
    """Training / validation crops for the codec.

    Sources: `train_dir` / `valid_dir` (folders of audio files), or, when they are not given, the
    folder `corpus_dir` (or a list of such folders, mixed) split into `train/` and `valid/`
    subfolders, as the prepared corpora are (their `test/` is never read).
    `sample_rate` / `channels` must be the codec's (the recipes link them to the model's config).
    `speeds`, `augment`: changes to the training crops (see RandomCropDataset; validation crops
    are never changed).
    """

    def __init__(self, train_dir: str | None = None, valid_dir: str | None = None,
                 corpus_dir: str | list[str] | None = "data/fillets-cs-16k", sample_rate: int = 16000, channels: int = 1,
                 crop_seconds: float = 1.0, valid_crop_seconds: float = 2.0, batch_size: int = 8,
                 valid_batch_size: int | None = None, num_workers: int = 0, items_per_epoch: int | None = None,
                 max_valid_files: int | None = 32, max_train_files: int | None = None, seed: int = 0,
                 speeds: list[float] | None = None, augment: Augmentation | None = None):
        super().__init__()
        # Checkpoints hold only plain types (they load with torch.load(weights_only=True)).
        augment = dataclasses.asdict(augment) if isinstance(augment, Augmentation) else augment
        if train_dir is None and corpus_dir is None:
            raise ValueError("give train_dir (a folder of audio files) or corpus_dir (the built-in corpus)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.save_hyperparameters()
        self.train_set: RandomCropDataset | None = None
        self.valid_set: FixedCropDataset | None = None
        self.position = StreamPosition()

    def _files(self, split: str) -> list[Path]:
        hp = self.hparams
        folder = hp.train_dir if split == "train" else hp.valid_dir
        if folder is not None:
            return list_audio_files(folder)
        if split == "valid" and hp.train_dir is not None:
            raise ValueError("train_dir is set but valid_dir is not; give a held-out folder for validation")
        folders = [hp.corpus_dir] if isinstance(hp.corpus_dir, (str, os.PathLike)) else list(hp.corpus_dir)
        files = []
        for corpus in folders:
            folder = Path(corpus) / split
            if not folder.is_dir():
                raise FileNotFoundError(f"{corpus} has no {split}/ folder: corpus_dir must be split into train/ "
                                        "and valid/ folders (`rvqlm corpus prepare fillets` makes one)")
            files += list_audio_files(folder)
        return files

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if self.train_set is None and stage in (None, "fit"):
            files = evenly_spaced(self._files("train"), hp.max_train_files)
            self.train_set = RandomCropDataset(files, hp.sample_rate, hp.channels, hp.crop_seconds,
                                               items=max(hp.items_per_epoch or len(files), hp.batch_size),
                                               seed=hp.seed, speeds=hp.speeds,
                                               augment=Augmentation(**(hp.augment or {})))
        if self.valid_set is None and stage in (None, "fit", "validate"):
            files = evenly_spaced(self._files("valid"), hp.max_valid_files)
            self.valid_set = FixedCropDataset(files, hp.sample_rate, hp.channels, hp.valid_crop_seconds)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        batches = max(len(self.train_set) // (hp.batch_size * world), 1)
        stream = CropBatchStream(self.train_set, hp.batch_size, batches, rank, world, self.position)
        # batch_size=None: the stream yields whole batches. No persistent workers: each epoch's
        # workers must start from the current position.
        return StreamLoader(stream, batch_size=None, num_workers=hp.num_workers)

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        # Runs when the training loop takes a batch for its step (after any prefetching): the
        # position counts batches actually trained on. The step sees the audio only.
        if isinstance(batch, dict):
            if self.trainer is not None and self.trainer.training:
                self.position.consumed_batches = int(batch["batch_index"]) + 1
            return batch["audio"]
        return batch

    def _stream_settings(self) -> dict:
        """What the training stream depends on besides its position: a resume must not change it."""
        hp = self.hparams
        return {"seed": hp.seed, "batch_size": hp.batch_size, "crop_seconds": hp.crop_seconds,
                "speeds": [float(s) for s in hp.speeds or [1.0]],
                "augment": dataclasses.asdict(Augmentation(**(hp.augment or {}))),
                "train_items": len(self.train_set) if self.train_set is not None else None}

    def state_dict(self) -> dict:
        return {"consumed_batches": self.position.consumed_batches, **self._stream_settings()}

    def load_state_dict(self, state: dict) -> None:
        now = self._stream_settings()
        changed = [f"{k}: checkpoint {state[k]!r}, now {now[k]!r}" for k in now
                   if k in state and now[k] is not None and state[k] != now[k]]
        if changed:
            raise ValueError("cannot resume the codec's training crops exactly, the data settings changed ("
                             + "; ".join(changed) + ")")
        self.position.consumed_batches = int(state.get("consumed_batches", 0))

    def val_dataloader(self) -> DataLoader:
        hp = self.hparams
        return DataLoader(self.valid_set, batch_size=hp.valid_batch_size or hp.batch_size, shuffle=False,
                          num_workers=hp.num_workers, persistent_workers=hp.num_workers > 0)
