"""codec.core.audio: real files in, float32 [C, S] out at the requested layout; clear errors otherwise."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from codec.core.audio import AudioError, audio_info, iter_audio_blocks, load_audio, save_audio


def test_reads_real_vorbis_and_resamples(real_ogg):
    info = audio_info(real_ogg)
    wav = load_audio(real_ogg, 16000, 1)
    assert wav.dtype == torch.float32 and wav.dim() == 2 and wav.shape[0] == 1
    assert abs(wav.shape[1] - info.frames * 16000 / info.sample_rate) <= 1
    assert wav.abs().max() > 0.01  # real speech, not silence


def test_multichannel_and_odd_rate(tmp_path, real_ogg):
    mono = load_audio(real_ogg, 22050, 1)[0].numpy()
    stereo = np.stack([mono, 0.5 * mono], axis=1)
    p = tmp_path / "stereo_11025.flac"
    sf.write(p, stereo[::2], 11025)
    down = load_audio(p, 16000, 1)
    assert down.shape[0] == 1
    up = load_audio(p, 16000, 2)
    assert up.shape[0] == 2
    six = tmp_path / "six.wav"
    sf.write(six, np.zeros((1000, 6), dtype="float32") + 0.1, 8000)
    assert load_audio(six, 16000, 1).shape == (1, 2000)
    with pytest.raises(AudioError, match="cannot map 6 channels to 2"):
        load_audio(six, 16000, 2)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(b""), "empty file"),
        (lambda p: p.write_bytes(b"this is not audio at all" * 40), "not a readable audio file"),
        (lambda p: sf.write(p, np.zeros((0, 1), dtype="float32"), 16000), "zero-length|not a readable|no audio"),
        (lambda p: sf.write(p, np.full((800, 1), np.nan, dtype="float32"), 16000, subtype="FLOAT"), "NaN or infinite"),
    ],
    ids=["empty", "not-audio", "zero-length", "nan"],
)
def test_bad_input_gives_clear_error_naming_the_file(tmp_path, make, message):
    p = tmp_path / "bad.wav"
    make(p)
    with pytest.raises(AudioError, match=message) as e:
        load_audio(p, 16000, 1)
    assert str(p) in str(e.value)


def test_truncated_files_are_refused(tmp_path, real_ogg):
    """libsndfile silently decodes what is left of a cut-off WAV or Ogg file: we refuse it instead."""
    data = real_ogg.read_bytes()
    cut_ogg = tmp_path / "cut.ogg"
    cut_ogg.write_bytes(data[: len(data) // 3])
    with pytest.raises(AudioError, match="truncated") as e:
        load_audio(cut_ogg, 16000, 1)
    assert str(cut_ogg) in str(e.value)
    wav = tmp_path / "whole.wav"
    save_audio(wav, load_audio(real_ogg, 16000, 1), 16000)
    cut_wav = tmp_path / "cut.wav"
    cut_wav.write_bytes(wav.read_bytes()[: wav.stat().st_size // 2])
    with pytest.raises(AudioError, match="truncated"):
        audio_info(cut_wav)


@pytest.mark.parametrize("suffix", ["mp3", "flac"])
def test_cut_off_mp3_and_flac_are_refused_and_whole_ones_read(tmp_path, real_ogg, suffix):
    """A cut-off MP3 still decodes (what is left, 40 % short of its LAME header's count) and a cut-off
    FLAC loses sync: both raise AudioError naming the file, through load_audio and the block reader."""
    speech = load_audio(real_ogg, 16000, 1)
    whole = tmp_path / f"whole.{suffix}"
    save_audio(whole, speech, 16000)
    assert abs(load_audio(whole, 16000, 1).shape[-1] - speech.shape[-1]) <= 1152
    assert sum(b.shape[-1] for b in iter_audio_blocks(whole, 16000, 1, block_seconds=1.0)) > 0
    cut = tmp_path / f"cut.{suffix}"
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) * 6 // 10])
    with pytest.raises(AudioError, match="truncated") as e:
        load_audio(cut, 16000, 1)
    assert str(cut) in str(e.value)
    with pytest.raises(AudioError, match="truncated"):
        list(iter_audio_blocks(cut, 16000, 1, block_seconds=1.0))


def test_missing_and_too_long(tmp_path, real_ogg):
    with pytest.raises(AudioError, match="no such file"):
        load_audio(tmp_path / "nope.wav", 16000)
    with pytest.raises(AudioError, match="too long"):
        load_audio(real_ogg, 16000, max_seconds=0.1)


def test_save_is_atomic_and_round_trips(tmp_path):
    wav = torch.sin(torch.linspace(0, 300, 16000)).unsqueeze(0) * 0.5
    p = save_audio(tmp_path / "sub" / "x.wav", wav, 16000)
    assert sorted(x.name for x in p.parent.iterdir()) == ["x.wav"]  # no temporary left behind
    back = load_audio(p, 16000, 1)
    assert torch.allclose(back, wav, atol=1e-4)
    with pytest.raises(ValueError, match="NaN"):
        save_audio(tmp_path / "y.wav", torch.full((1, 10), float("nan")), 16000)
    assert not (tmp_path / "y.wav").exists()


def test_streamed_blocks_equal_whole_file_resampling(real_ogg):
    whole = load_audio(real_ogg, 16000, 1)
    blocks = list(iter_audio_blocks(real_ogg, 16000, 1, block_seconds=0.5))
    assert len(blocks) > 1
    streamed = torch.cat(blocks, dim=1)
    assert streamed.shape == whole.shape
    assert (streamed - whole).abs().max() < 1e-3


def test_saved_files_get_normal_permissions(tmp_path):
    import os
    import stat

    p = save_audio(tmp_path / "perm.wav", torch.zeros(1, 100), 16000)
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask
