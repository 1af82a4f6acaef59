"""The codec's discriminator: its scales, settings, and their files."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from codec.core.discriminator import CodecDiscriminator, load_discriminator, save_discriminator


def test_codec_discriminator_holds_one_stft_scale_per_fft_size_and_saves_them(tmp_path):
    disc = CodecDiscriminator((256, 128), filters=4)
    logits, features = disc(torch.randn(1, 1, 3000))
    assert len(logits) == len(features) == 2 and all(len(f) == len(features[0]) for f in features)
    save_discriminator(disc, tmp_path / "d.safetensors")
    back = load_discriminator(tmp_path / "d.safetensors")
    assert back.config == disc.config
    x = torch.randn(1, 1, 3000)
    assert all(torch.equal(a, b) for a, b in zip(back(x)[0], disc(x)[0]))
    with pytest.raises(ValueError, match="at least one STFT scale"):
        CodecDiscriminator(())


def test_a_discriminator_file_without_all_its_settings_is_refused(tmp_path):
    """A file's metadata must name every constructor setting: none is filled in from defaults. A
    file written while period discriminators existed loads when it holds none."""
    disc = CodecDiscriminator((256, 128), filters=4)
    path = tmp_path / "d.safetensors"
    tensors = {k: v.contiguous() for k, v in disc.state_dict().items()}
    save_file(tensors, str(path), metadata={"config": json.dumps({**disc.config, "periods": [], "period_filters": 16})})
    assert load_discriminator(path).config == disc.config
    partial = {k: v for k, v in disc.config.items() if k != "dilations"}
    save_file(tensors, str(path), metadata={"config": json.dumps(partial)})
    with pytest.raises(ValueError, match="discriminator settings .* expected .*dilations"):
        load_discriminator(path)
    save_file(tensors, str(path), metadata={"config": json.dumps({**disc.config, "periods": [2]})})
    with pytest.raises(ValueError, match="discriminator settings .*periods"):
        load_discriminator(path)
    with pytest.raises(FileNotFoundError, match="no discriminator weights"):
        load_discriminator(tmp_path / "missing.safetensors")
