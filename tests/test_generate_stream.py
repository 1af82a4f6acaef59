"""`rvqlm generate --stream` (rvqlm/commands/stream_generate.py): the continuation's wav grows while the LM
generates, is a valid file at every moment, and holds what `rvqlm generate` writes without --stream."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from codec import Codec, CodecConfig
from codec.core.audio import save_audio
from lm import LMConfig, MultiCodebookLM
from lm.conditioning import Condition
from lm.generate import generate
from lm.sampling import SamplingOptions
from rvqlm.cli import main
from rvqlm.commands.stream_generate import ContinuationWriter, GrowingWav

N_C, V = 2, 16


@pytest.fixture(scope="module", params=["seanet", "istft"])
def pair(request, tmp_path_factory):
    """A tiny random codec (50 frames/s; SEANet decoder, or iSTFT with a 10 ms look-ahead) and a tiny LM."""
    root = tmp_path_factory.mktemp("pair")
    torch.manual_seed(0)
    codec = Codec(CodecConfig.from_flat(dict(encoder_channels=2, decoder_channels=2, latent_dim=8, n_codebooks=N_C,
                              codebook_size=V, dilations=(1,), decoder=request.param, decoder_dim=16,
                              decoder_layers=1, istft_hop=80))).eval()
    codec.save_pretrained(root / "codec")
    cfg = LMConfig(n_codebooks=N_C, codebook_size=V, d_model=16, n_layers=1, n_heads=2, max_seq_len=40,
                   codec_fingerprint=codec.token_fingerprint())
    MultiCodebookLM(cfg).save_pretrained(root / "lm")
    return root


def pcm(path) -> np.ndarray:
    return sf.read(str(path), dtype="int16", always_2d=True)[0]


def test_growing_wav_is_valid_after_every_block_and_rounds_as_save_audio(tmp_path):
    wav = torch.randn(2, 5000).clamp(-1.2, 1.2) * 0.7
    wav[0, :4] = torch.tensor([1.5, -1.5, 0.5 / 32768, -0.5 / 32768])  # clipped; halves of a step
    f = GrowingWav(tmp_path / "g.wav", 16000, 2)
    assert sf.info(str(tmp_path / "g.wav")).frames == 0  # valid before any sample
    at = 0
    for n in (1, 7, 320, 0, 4672):
        f.append(wav[:, at: at + n])
        at += n
        info = sf.info(str(tmp_path / "g.wav"))
        assert (info.frames, info.samplerate, info.channels) == (at, 16000, 2)
        assert (tmp_path / "g.wav").stat().st_size == 44 + at * 2 * 2
    f.close()
    save_audio(tmp_path / "ref.wav", wav, 16000)
    assert np.array_equal(pcm(tmp_path / "g.wav"), pcm(tmp_path / "ref.wav"))
    with pytest.raises(ValueError, match="NaN"):
        GrowingWav(tmp_path / "h.wav", 16000, 1).append(torch.tensor([[float("nan")]]))


def test_frames_come_as_generated_and_are_generates_codes(pair):
    model = MultiCodebookLM.from_pretrained(pair / "lm")
    prompt = torch.randint(0, V, (2, N_C, 5), generator=torch.Generator().manual_seed(0))
    got = []
    codes = generate(model, prompt, 9, sampling=SamplingOptions(temperature=0.9, top_k=8, seed=3), on_frames=lambda c,
                     ends: got.append((c, ends)))
    assert [c.shape[-1] for c, _ in got] == [5] + [1] * 9  # the prompt, then one frame per step
    assert torch.equal(torch.cat([c for c, _ in got], dim=-1), codes)
    assert torch.equal(codes, generate(model, prompt, 9,
                                       sampling=SamplingOptions(temperature=0.9, top_k=8, seed=3)))  # same without on_frames
    assert all(ends.tolist() == [14, 14] for _, ends in got)


def test_frames_past_a_rows_end_come_as_zeros_with_the_rows_ends():
    from test_lm_conditioning import cond_model, rigged

    model = cond_model()
    prompt = torch.randint(0, 16, (2, 3, 4))
    handle = rigged(model, lambda b: torch.tensor([1e4, -1e4] * (b // 2), dtype=torch.float64)[:, None])
    got = []
    codes, lengths = generate(model, prompt, 10, sampling=SamplingOptions(seed=0, cfg_scale=1.0),
                              condition=Condition(text=["a", "b"], speaker="font_big"), return_lengths=True,
                              on_frames=lambda c, ends: got.append((c, ends)))
    handle.remove()
    assert lengths.tolist() == [4, 14] and got[-1][1].tolist() == [4, 14]  # row 0 ended right after its prompt
    assert torch.equal(torch.cat([c for c, _ in got], dim=-1), codes)


def test_each_row_is_written_from_the_prompts_end_to_its_own_end(pair, tmp_path):
    codec = Codec.from_pretrained(pair / "codec")
    codes = torch.randint(0, V, (2, N_C, 12), generator=torch.Generator().manual_seed(1))
    writer = ContinuationWriter(codec, [tmp_path / "a.wav", tmp_path / "b.wav"], prompt_frames=4)
    ends = torch.tensor([12, 9])
    for t in range(12):
        writer.frames(codes[..., t: t + 1], ends)
        for f in writer.files:  # every moment: a complete wav of what was written so far
            assert sf.info(str(f.path)).frames == f.frames
    audio = writer.finish(ends)
    expected = codec.decode(codes)
    assert audio.shape == expected.shape and (audio - expected).abs().max() < 1e-5
    hop = codec.hop_length
    for row, name in enumerate(("a.wav", "b.wav")):
        ref = tmp_path / f"ref-{name}"
        save_audio(ref, expected[row, :, 4 * hop: int(ends[row]) * hop], codec.sample_rate)
        assert np.abs(pcm(tmp_path / name).astype(int) - pcm(ref)).max() <= 1  # float rounding of the decoders


def test_cli_stream_writes_what_generate_writes(pair, speech_files, tmp_path, capsys):
    common = ["generate", "--lm", str(pair / "lm"), "--codec", str(pair / "codec"), "--prompt",
              str(speech_files["test"][0]), "--prompt-seconds", "0.3", "--seconds", "0.2", "--seed", "1",
              "--num-samples", "2", "--top-k", "8", "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "plain" / "x.wav")]) == 0
    assert main([*common, "--out", str(tmp_path / "live" / "x.wav"), "--stream"]) == 0
    printed = capsys.readouterr().out
    assert "first audio after" in printed and "real-time factor" in printed
    names = sorted(p.name for p in (tmp_path / "live").iterdir())
    assert names == ["x-1.full.wav", "x-1.wav", "x-2.full.wav", "x-2.wav"]  # no temporary files left
    for name in names:
        plain, live = pcm(tmp_path / "plain" / name), pcm(tmp_path / "live" / name)
        assert plain.shape == live.shape and np.abs(plain.astype(int) - live).max() <= 1
    assert sf.info(str(tmp_path / "live" / "x-1.wav")).duration == pytest.approx(0.2)
