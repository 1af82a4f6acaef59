"""Changes to training crops that users' audio brings and one corpus does not: level, telephone
band and background noise. The codec is an autoencoder, so the changed crop is both its input and
its target. Each change is drawn per crop from a generator the caller seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torchaudio.functional as AF

TELEPHONE_RATE = 8000  # band-limited crops pass through this rate (content below 4 kHz)


@dataclass(frozen=True)
class Augmentation:
    """What to draw for each training crop; the defaults change nothing."""

    level_dbfs: tuple[float, float] | None = None  # peak level drawn uniformly in [lo, hi] dBFS (e.g. [-30, 0])
    band_limit_prob: float = 0.0  # share of crops resampled through 8 kHz (telephone band)
    noise_prob: float = 0.0  # share of crops with white noise added
    noise_snr_db: tuple[float, float] = (20.0, 40.0)  # that noise's SNR, drawn uniformly in [lo, hi] dB

    def __post_init__(self) -> None:
        if self.level_dbfs is not None:
            lo, hi = (float(v) for v in self.level_dbfs)
            if not -60.0 <= lo <= hi <= 0.0:
                raise ValueError(f"level_dbfs must be [lo, hi] with -60 <= lo <= hi <= 0, got {self.level_dbfs}")
            object.__setattr__(self, "level_dbfs", (lo, hi))
        lo, hi = (float(v) for v in self.noise_snr_db)
        if not lo <= hi:
            raise ValueError(f"noise_snr_db must be [lo, hi] with lo <= hi, got {self.noise_snr_db}")
        object.__setattr__(self, "noise_snr_db", (lo, hi))
        for name in ("band_limit_prob", "noise_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def active(self) -> bool:
        return self.level_dbfs is not None or self.band_limit_prob > 0 or self.noise_prob > 0

    def apply(self, wav: torch.Tensor, sample_rate: int, rng: np.random.Generator) -> torch.Tensor:
        """wav [C, S] -> [C, S]: noise, then the telephone band, then the level, each as drawn.

        The draws are made in a fixed order whatever is enabled, so a crop's changes depend only
        on the generator's seed."""
        if not self.active:
            return wav
        noisy, snr, band, level = (rng.random() < self.noise_prob, rng.uniform(*self.noise_snr_db),
                                   rng.random() < self.band_limit_prob, rng.random())
        noise_seed = int(rng.integers(2**31))
        if noisy:
            power = wav.pow(2).mean()
            if power > 0:
                gen = torch.Generator().manual_seed(noise_seed)
                noise = torch.randn(wav.shape, generator=gen, dtype=wav.dtype)
                wav = wav + noise * torch.sqrt(power / 10 ** (snr / 10))
        if band:
            wav = telephone_band(wav, sample_rate)
        if self.level_dbfs is not None:
            peak = float(wav.abs().max())
            if peak > 0:
                lo, hi = self.level_dbfs
                wav = wav * (10 ** ((lo + level * (hi - lo)) / 20) / peak)
        return wav.clamp(-1.0, 1.0)


def telephone_band(wav: torch.Tensor, sample_rate: int) -> torch.Tensor:
    """wav [C, S] -> [C, S] band-limited as a telephone source resampled to `sample_rate` would be."""
    if sample_rate <= TELEPHONE_RATE:
        return wav
    n = wav.shape[-1]
    out = AF.resample(AF.resample(wav, sample_rate, TELEPHONE_RATE), TELEPHONE_RATE, sample_rate)
    return torch.nn.functional.pad(out, (0, max(0, n - out.shape[-1])))[..., :n]
