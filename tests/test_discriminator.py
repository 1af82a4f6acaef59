"""The codec's discriminators: the period fold, settings, and their files."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from codec.discriminator import CodecDiscriminator, PeriodDiscriminator, load_discriminator, save_discriminator


def test_a_period_discriminator_sees_a_signal_of_its_period_as_constant_down_each_column():
    """Folded by its own period, a periodic signal is the same in every row: away from the zero
    padding at the ends, every feature map is constant along the folded time axis. Folded by
    another period it is not."""
    torch.manual_seed(0)
    d = PeriodDiscriminator(5, filters=4)
    wav = torch.randn(1, 1, 5).repeat(1, 1, 600)  # period 5 samples
    _, features = d(wav)
    first = features[0][0, :, 10:-10]  # [C, rows, 5]
    assert torch.allclose(first, first[:, :1].expand_as(first), atol=1e-5)
    _, other = PeriodDiscriminator(7, filters=4)(wav)
    inner = other[0][0, :, 10:-10]
    assert not torch.allclose(inner, inner[:, :1].expand_as(inner), atol=1e-3)


def test_period_discriminator_shapes_and_lengths_not_a_multiple_of_the_period():
    d = PeriodDiscriminator(3, channels=2, filters=4)
    logits, features = d(torch.randn(2, 2, 1001))  # padded to 1002 = 334 rows of 3
    assert logits.shape[:2] == (2, 1) and logits.shape[-1] == 3
    assert [f.shape[1] for f in features] == [4, 8, 16, 16]
    with pytest.raises(ValueError, match="period >= 2"):
        PeriodDiscriminator(1)


def test_codec_discriminator_holds_stft_scales_then_periods_and_saves_both(tmp_path):
    disc = CodecDiscriminator((256,), filters=4, periods=(2, 5), period_filters=4)
    logits, features = disc(torch.randn(1, 1, 3000))
    assert len(logits) == len(features) == 3 and logits[1].shape[-1] == 2 and logits[2].shape[-1] == 5
    save_discriminator(disc, tmp_path / "d.safetensors")
    back = load_discriminator(tmp_path / "d.safetensors")
    assert back.config == disc.config
    x = torch.randn(1, 1, 3000)
    assert all(torch.equal(a, b) for a, b in zip(back(x)[0], disc(x)[0]))
    with pytest.raises(ValueError, match="at least one"):
        CodecDiscriminator((), periods=())


def test_a_discriminator_file_without_all_its_settings_is_refused(tmp_path):
    """A file's metadata must name every constructor setting: none is filled in from defaults."""
    disc = CodecDiscriminator((256, 128), filters=4)
    partial = {k: v for k, v in disc.config.items() if k not in ("periods", "period_filters")}
    path = tmp_path / "partial.safetensors"
    save_file({k: v.contiguous() for k, v in disc.state_dict().items()}, str(path),
              metadata={"config": json.dumps(partial)})
    with pytest.raises(ValueError, match="discriminator settings .* expected .*periods"):
        load_discriminator(path)
    with pytest.raises(FileNotFoundError, match="no discriminator weights"):
        load_discriminator(tmp_path / "missing.safetensors")
