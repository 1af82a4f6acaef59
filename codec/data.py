"""Audio crops for codec training: a dataset of random crops, one of fixed crops, and the DataModule.

Training crops: item i takes file `i % n_files` and a random offset in it (so every file is seen
once per pass of `len(files)` items, whatever its length); validation crops: the middle of each
chosen file, the same every time. Audio is read with `codec.audio.load_audio` (any format
libsndfile reads, resampled and down/up-mixed to the codec's layout); a file shorter than the crop
is zero-padded at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from codec.audio import AUDIO_SUFFIXES, audio_info, load_audio


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

    def _load(self, index: int, offset: float) -> torch.Tensor:
        wav = load_audio(self.files[index], self.sample_rate, self.channels, offset_seconds=offset,
                         duration_seconds=self.crop_seconds)
        return _fit_length(wav, self.crop)


class RandomCropDataset(_CropDataset):
    """`items` random crops [C, crop] per pass; item i reads file i % len(files) at a random offset.

    Offsets come from torch's global RNG (seeded per worker by Lightning's `seed_everything`).
    """

    def __init__(self, files, sample_rate: int, channels: int = 1, crop_seconds: float = 1.0,
                 items: int | None = None):
        super().__init__(files, sample_rate, channels, crop_seconds)
        self.items = items or len(self.files)
        if self.items < 1:
            raise ValueError(f"items must be >= 1, got {self.items}")

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int) -> torch.Tensor:
        f = i % len(self.files)
        slack = max(self.durations[f] - self.crop_seconds, 0.0)
        offset = float(torch.rand(())) * slack
        return self._load(f, offset)


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
    built-in corpus at `corpus_dir` (its train / valid splits; the test split is never read).
    `sample_rate` / `channels` must be the codec's (the recipes link them to the model's config).
    """

    def __init__(self, train_dir: str | None = None, valid_dir: str | None = None,
                 corpus_dir: str | None = "data/fillets-cs-16k", sample_rate: int = 16000, channels: int = 1,
                 crop_seconds: float = 1.0, valid_crop_seconds: float = 2.0, batch_size: int = 8,
                 valid_batch_size: int | None = None, num_workers: int = 0, items_per_epoch: int | None = None,
                 max_valid_files: int | None = 32, max_train_files: int | None = None):
        super().__init__()
        if train_dir is None and corpus_dir is None:
            raise ValueError("give train_dir (a folder of audio files) or corpus_dir (the built-in corpus)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.save_hyperparameters()
        self.train_set: RandomCropDataset | None = None
        self.valid_set: FixedCropDataset | None = None

    def _files(self, split: str) -> list[Path]:
        hp = self.hparams
        folder = hp.train_dir if split == "train" else hp.valid_dir
        if folder is not None:
            return list_audio_files(folder)
        if split == "valid" and hp.train_dir is not None:
            raise ValueError("train_dir is set but valid_dir is not; give a held-out folder for validation")
        from rvqlm.corpus import corpus_files

        files = corpus_files(hp.corpus_dir, split)
        if not files:
            raise ValueError(f"the corpus at {hp.corpus_dir} has no {split} files")
        return files

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if self.train_set is None and stage in (None, "fit"):
            files = evenly_spaced(self._files("train"), hp.max_train_files)
            self.train_set = RandomCropDataset(files, hp.sample_rate, hp.channels, hp.crop_seconds,
                                               items=max(hp.items_per_epoch or len(files), hp.batch_size))
        if self.valid_set is None and stage in (None, "fit", "validate"):
            files = evenly_spaced(self._files("valid"), hp.max_valid_files)
            self.valid_set = FixedCropDataset(files, hp.sample_rate, hp.channels, hp.valid_crop_seconds)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        return DataLoader(self.train_set, batch_size=hp.batch_size, shuffle=True, drop_last=True,
                          num_workers=hp.num_workers, persistent_workers=hp.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        hp = self.hparams
        return DataLoader(self.valid_set, batch_size=hp.valid_batch_size or hp.batch_size, shuffle=False,
                          num_workers=hp.num_workers, persistent_workers=hp.num_workers > 0)
