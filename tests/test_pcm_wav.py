"""codec.core.audio without the soundfile package (a stock CUDA PyTorch image): 16-bit PCM WAV reads
to the very samples libsndfile gives, anything else fails with one line naming soundfile."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

import codec.core.audio
from codec.core.audio import AudioError, audio_info, iter_audio_blocks, load_audio, save_audio


@pytest.fixture
def stereo_wav(tmp_path):
    rng = np.random.default_rng(0)
    data = np.clip(rng.normal(0, 0.3, (12345, 2)), -1, 1).astype(np.float32)
    data[:4, 0] = [-1.0, 1.0, 0.0, -0.5]
    path = tmp_path / "noise.wav"
    sf.write(path, data, 22050, subtype="PCM_16")
    return path


def test_pcm16_wav_reads_the_same_without_soundfile(stereo_wav, monkeypatch):
    with_sf = (audio_info(stereo_wav), load_audio(stereo_wav, 22050, 2), load_audio(stereo_wav, 16000, 1),
               load_audio(stereo_wav, 22050, 2, offset_seconds=0.1, duration_seconds=0.2),
               torch.cat(list(iter_audio_blocks(stereo_wav, 16000, 1, block_seconds=0.1)), dim=1))
    monkeypatch.setattr(codec.core.audio, "_soundfile", lambda: None)
    without = (audio_info(stereo_wav), load_audio(stereo_wav, 22050, 2), load_audio(stereo_wav, 16000, 1),
               load_audio(stereo_wav, 22050, 2, offset_seconds=0.1, duration_seconds=0.2),
               torch.cat(list(iter_audio_blocks(stereo_wav, 16000, 1, block_seconds=0.1)), dim=1))
    a, b = with_sf[0], without[0]
    assert (a.sample_rate, a.channels, a.frames) == (b.sample_rate, b.channels, b.frames) == (22050, 2, 12345)
    for x, y in zip(with_sf[1:], without[1:]):
        assert torch.equal(x, y)


def test_other_formats_and_writing_name_soundfile_when_it_is_missing(stereo_wav, tmp_path, monkeypatch):
    flac, float_wav = tmp_path / "a.flac", tmp_path / "f.wav"
    sf.write(flac, np.zeros((100, 1), np.float32), 16000)
    sf.write(float_wav, np.zeros((100, 1), np.float32), 16000, subtype="FLOAT")
    monkeypatch.setattr(codec.core.audio, "_soundfile", lambda: None)
    for path in (flac, float_wav):
        with pytest.raises(AudioError, match=r"^.*: .*pip install soundfile"):
            load_audio(path, 16000)
    with pytest.raises(RuntimeError, match="writing audio needs the soundfile package"):
        save_audio(tmp_path / "out.wav", torch.zeros(1, 10), 16000)
    cut = tmp_path / "cut.wav"
    cut.write_bytes(stereo_wav.read_bytes()[:20000])
    with pytest.raises(AudioError, match="truncated"):
        load_audio(cut, 22050, 2)
