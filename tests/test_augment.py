"""Training-crop augmentation (codec/neural/augment.py) and corpus mixes in the codec's data module."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from codec.neural.augment import Augmentation, telephone_band
from codec.neural.data import CodecDataModule, RandomCropDataset

SR = 16000


def band_energy_above(wav: torch.Tensor, sample_rate: int, hz: float = 4000.0) -> float:
    """Share of wav's [C, S] energy above `hz` (0..1)."""
    spec = torch.fft.rfft(wav, dim=-1).abs().pow(2).sum(0)
    cut = int(math.ceil(hz / (sample_rate / 2) * (spec.numel() - 1)))
    total = float(spec.sum())
    return float(spec[cut:].sum()) / total if total > 0 else 0.0


def _speechlike(seconds: float = 1.0, seed: int = 0) -> torch.Tensor:
    """White noise with a slow envelope: energy at every frequency up to 8 kHz."""
    gen = torch.Generator().manual_seed(seed)
    n = int(seconds * SR)
    envelope = 0.5 + 0.5 * torch.sin(torch.linspace(0, 6.28 * 3, n)).abs()
    return 0.3 * envelope * torch.randn(1, n, generator=gen)


def test_the_defaults_change_nothing():
    wav = _speechlike()
    assert not Augmentation().active
    assert torch.equal(Augmentation().apply(wav, SR, np.random.default_rng(0)), wav)


def test_level_puts_the_peak_at_the_drawn_level():
    aug = Augmentation(level_dbfs=(-30.0, -10.0))
    peaks = []
    for seed in range(20):
        out = aug.apply(_speechlike(seed=seed), SR, np.random.default_rng(seed))
        peaks.append(20 * np.log10(float(out.abs().max())))
    assert min(peaks) >= -30.0 - 1e-4 and max(peaks) <= -10.0 + 1e-4
    assert max(peaks) - min(peaks) > 10  # drawn across the range, not one level


def test_band_limit_removes_what_lies_above_the_telephone_band():
    wav = _speechlike()
    assert band_energy_above(wav, SR) > 0.4  # white: half the energy above 4 kHz
    limited = telephone_band(wav, SR)
    assert limited.shape == wav.shape
    assert band_energy_above(limited, SR) < 0.01
    always = Augmentation(band_limit_prob=1.0).apply(wav, SR, np.random.default_rng(0))
    assert band_energy_above(always, SR) < 0.01
    # what lies inside the band is kept: the 300-3400 Hz energy, bin for bin
    def band_power(x):
        spec = torch.fft.rfft(x, dim=-1).abs().pow(2).sum(0)
        hz = torch.fft.rfftfreq(x.shape[-1], 1 / SR)
        return float(spec[(hz > 300) & (hz < 3400)].sum())
    assert 0.95 < band_power(limited) / band_power(wav) < 1.05


def test_noise_lands_at_the_drawn_snr():
    wav = _speechlike()
    out = Augmentation(noise_prob=1.0, noise_snr_db=(25.0, 25.0)).apply(wav, SR, np.random.default_rng(3))
    snr = 10 * torch.log10(wav.pow(2).sum() / (out - wav).pow(2).sum())
    assert abs(float(snr) - 25.0) < 0.5


def test_draws_are_a_function_of_the_seed_only():
    aug = Augmentation(level_dbfs=(-30.0, 0.0), band_limit_prob=0.5, noise_prob=0.5)
    wav = _speechlike()
    a = aug.apply(wav, SR, np.random.default_rng([1, 2, 3]))
    b = aug.apply(wav, SR, np.random.default_rng([1, 2, 3]))
    c = aug.apply(wav, SR, np.random.default_rng([1, 2, 4]))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("bad, message", [
    (dict(level_dbfs=(-10.0, -20.0)), "level_dbfs"),
    (dict(level_dbfs=(-70.0, 0.0)), "level_dbfs"),
    (dict(band_limit_prob=1.5), "band_limit_prob"),
    (dict(noise_prob=-0.1), "noise_prob"),
    (dict(noise_snr_db=(40.0, 20.0)), "noise_snr_db"),
])
def test_bad_settings_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        Augmentation(**bad)


def test_training_crops_are_augmented_reproducibly(speech_files):
    files = speech_files["train"][:4]
    aug = Augmentation(level_dbfs=(-30.0, -20.0))
    plain = RandomCropDataset(files, SR, crop_seconds=0.5, seed=1)
    changed = RandomCropDataset(files, SR, crop_seconds=0.5, seed=1, augment=aug)
    again = RandomCropDataset(files, SR, crop_seconds=0.5, seed=1, augment=aug)
    for i in range(3):
        assert torch.equal(changed[i], again[i])
        assert float(changed[i].abs().max()) <= 10 ** (-20 / 20) + 1e-6
        assert float(plain[i].abs().max()) > float(changed[i].abs().max())


def test_a_mix_of_corpora_reads_both_and_a_resume_refuses_another_augmentation(corpus_dir, tmp_path):
    other = tmp_path / "other"
    for split in ("train", "valid"):
        (other / split).mkdir(parents=True)
        source = sorted((corpus_dir / split).rglob("*.wav"))[0]
        (other / split / "x.wav").symlink_to(source)
    single = CodecDataModule(corpus_dir=str(corpus_dir), max_valid_files=None)
    mixed = CodecDataModule(corpus_dir=[str(corpus_dir), str(other)], max_valid_files=None,
                            augment=Augmentation(noise_prob=0.2))
    single.setup("fit")
    mixed.setup("fit")
    assert len(mixed.train_set.files) == len(single.train_set.files) + 1
    assert mixed.train_set.files[-1] == other / "train" / "x.wav"
    assert len(mixed.valid_set.files) == len(single.valid_set.files) + 1
    state = mixed.state_dict()
    assert isinstance(state["augment"], dict)  # plain types only in checkpoints
    plain = CodecDataModule(corpus_dir=[str(corpus_dir), str(other)], max_valid_files=None)
    plain.setup("fit")
    with pytest.raises(ValueError, match="augment"):
        plain.load_state_dict(state)
    with pytest.raises(FileNotFoundError, match="no valid/ folder"):
        CodecDataModule(corpus_dir=[str(corpus_dir), str(tmp_path)])._files("valid")
