"""The source-filter codec (codec.source_filter.synthesis, codec.source_filter.parts, codec.source_filter.training):
its synthesis follows WORLD's definitions (mel-cepstrum, coded aperiodicity, pulse + noise excitation),
streams exactly, carries the pitch in its first codebook, and trains from a recipe through the CLI."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from codec import Codec, CodecConfig
from codec.core.audio import load_audio
from codec.core.streaming import stream_roundtrip
from codec.source_filter.net import F0_BINS, class_to_f0, f0_to_class
from codec.source_filter.parts import (HALF, LATENT_DIM, f0_of_pitch, latent_dim, mid_f0, pitch_codebook,
                                       pitch_of_class)
from codec.source_filter.synthesis import (SourceFilterSynth, SynthStream, aperiodicity_db, cheaptrick,
                                           mcep_fit_matrix, mcep_matrix)
from codec.source_filter.training import fit_quantizer
from rvqlm.cli import main
from rvqlm_core.token_shards import TokenShards

SR, HOP = 16000, 320


def _config(envelopes: int = 1, **decoder) -> CodecConfig:
    more = {"envelopes": envelopes} if envelopes != 1 else {}
    return CodecConfig.from_dict({"latent_dim": latent_dim(envelopes),
                                  "encoder": {"kind": "source_filter", "width": 32, "layers": 2, **more},
                                  "quantizer": {"n_codebooks": 4, "codebook_size": 300, "kmeans_init": False,
                                                "dropout": 0.0},
                                  "decoder": {"kind": "source_filter", **more, **decoder}})


def _track(frames: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A speech-like parameter track: voiced stretches with gliding F0 between unvoiced ones."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(frames, dtype=torch.float32)
    f0 = 120 + 40 * torch.sin(t / 7)
    f0[(t // 11) % 3 == 2] = 0.0
    mcep = 0.3 * torch.randn(frames, 25, generator=g) / (1 + torch.arange(25.0))
    mcep[:, 0] += -4.0
    ap = -20 + 5 * torch.randn(frames, generator=g)
    return f0, mcep, ap


def test_mcep_matrix_is_the_mel_cepstrum_of_sptk():
    """SPTK's mc2sp: the power spectrum of a mel-cepstrum (all-pass warping alpha) is exp(2 x this @ c)."""
    pysptk = pytest.importorskip("pysptk")
    mc = np.random.RandomState(0).randn(4, 25) * 0.3
    mc[:, 0] -= 5
    power = torch.exp(2 * torch.from_numpy(mc).float() @ mcep_matrix(1024).T).numpy()
    np.testing.assert_allclose(np.log(power), np.log(pysptk.mc2sp(mc, 0.42, 1024)), atol=1e-4)


def test_aperiodicity_decodes_as_worlds_decode_aperiodicity():
    pyworld = pytest.importorskip("pyworld")
    coded = np.array([[-25.0], [-8.0], [-0.5]])
    ours = torch.pow(10, aperiodicity_db(torch.tensor(coded[:, 0]).float(), 1024, SR) / 20).numpy()
    np.testing.assert_allclose(ours, pyworld.decode_aperiodicity(coded, SR, 1024), atol=5e-4)


def test_cheaptrick_is_worlds_and_its_mel_cepstrum_is_sptks(speech_files):
    """WORLD's CheapTrick (F0-adaptive window, DC correction, 2 F0 / 3 smoothing, liftering with q1 =
    -0.15) at Harvest's F0, and SPTK's sp2mc of it, away from the file's edges (WORLD repeats the edge
    sample where we pad zeros)."""
    pyworld = pytest.importorskip("pyworld")
    pysptk = pytest.importorskip("pysptk")
    x = load_audio(speech_files["valid"][1], SR, 1)[0, : 2 * SR].double()
    f0 = pyworld.harvest(x.numpy(), SR, f0_floor=50.0, f0_ceil=550.0, frame_period=20.0)[0]
    ref = pyworld.cheaptrick(x.numpy(), f0, np.arange(len(f0)) * 0.02, SR, f0_floor=50.0)
    ours = cheaptrick(x, torch.from_numpy(f0))
    inner = slice(2, len(f0) - 2)
    db = 10 / math.log(10) * (ours.double().numpy() - np.log(ref))[inner]
    assert np.sqrt((db ** 2).mean(1)).max() < 0.05
    mc = (0.5 * ours[inner]) @ mcep_fit_matrix().T
    np.testing.assert_allclose(mc.numpy(), pysptk.sp2mc(ref[inner], 24, 0.42), atol=0.02)


@pytest.mark.parametrize("chunks", [[1] * 30, [7, 0, 13, 10], [30]])
def test_synthesis_streams_as_it_synthesizes_offline(chunks):
    f0, mcep, ap = _track(30)
    synth = SourceFilterSynth()
    offline = synth.synthesize(f0, mcep, ap)
    assert offline.shape == (30 * HOP,)
    stream, out, at = SynthStream(synth), [], 0
    for n in chunks:
        out.append(stream.push(f0[at:at + n], mcep[at:at + n], ap[at:at + n]))
        at += n
    out.append(stream.flush())
    streamed = torch.cat(out)
    assert streamed.shape == offline.shape
    assert (streamed - offline).abs().max() < 1e-5


def test_voiced_frames_have_the_pitch_and_unvoiced_frames_the_envelopes_power():
    """WORLD's excitation: pulses one period apart, sqrt(period) x the periodic response, so the power is
    the envelope's; unvoiced frames are noise of the same power."""
    frames = 50
    mcep = torch.zeros(frames, 25)
    mcep[:, 0] = math.log(0.1)  # a flat envelope of amplitude 0.1 per bin: power 0.01
    for f0, ap in ((200.0, -60.0), (0.0, 0.0)):
        y = SourceFilterSynth().synthesize(torch.full((frames,), f0), mcep, torch.full((frames,), ap))[2000:-2000]
        power = float(y.pow(2).mean())
        assert 0.006 < power < 0.014, (f0, power)
        ac = np.correlate(y.numpy(), y.numpy(), "full")[len(y) - 1:]
        peak = 40 + int(np.argmax(ac[40:400]))  # lags of 40..400 samples: 40..400 Hz
        if f0:
            assert peak == SR // 200
        else:
            assert ac[peak] < 0.2 * ac[0]  # noise: no period


def test_the_first_codebook_is_the_f0_stream():
    cls = torch.arange(1 + F0_BINS)
    assert torch.equal(f0_to_class(class_to_f0(cls)), cls)
    np.testing.assert_allclose(f0_of_pitch(pitch_of_class(cls)), class_to_f0(cls), rtol=1e-5)
    book = pitch_codebook(1024)
    latent = torch.zeros(1 + F0_BINS, LATENT_DIM)
    latent[:, 0] = pitch_of_class(cls)
    latent[:, 1:] = torch.randn(1 + F0_BINS, LATENT_DIM - 1)  # the envelope does not move the F0 code
    q = Codec(_config()).quantizer
    q.embed[0] = book[:300]
    assert torch.equal(q.encode(latent.T[None], n_q=1)[0, 0], cls)


@pytest.fixture(scope="module", params=[1, 2], ids=["20ms", "10ms"])
def sf_codec(request, speech_files, tmp_path_factory) -> Path:
    """A small source-filter codec, one and two envelopes a frame: random analysis network, quantizer
    fitted on two real files."""
    torch.manual_seed(0)
    codec = Codec(_config(request.param)).eval()
    items = [{"wav": load_audio(f, SR, 1)[0]} for f in speech_files["train"][:2]]
    fit_quantizer(codec, items, frames=20000, iters=2, seed=0)
    return codec.save_pretrained(tmp_path_factory.mktemp("sf") / "codec", decoder_dtype="float16")


def test_a_source_filter_codec_encodes_decodes_any_k_and_streams(sf_codec, speech_files):
    codec = Codec.from_pretrained(sf_codec)
    wav = load_audio(speech_files["valid"][0], SR, 1)[None, :, : 3 * SR]
    codes = codec.encode(wav)
    assert codes.shape == (1, 4, 3 * SR // HOP) and int(codes[:, 0].max()) <= F0_BINS
    for k in range(1, 5):
        assert codec.decode(codes[:, :k]).shape == (1, 1, 3 * SR)
    offline = codec.decode(codes)
    streamed, _ = stream_roundtrip(codec, wav, chunk=321)
    assert (streamed - offline).abs().max() < 1e-4
    assert codec.streaming_decoder().latency_ms == 40.0  # the frame, then the next frame's look-ahead


def test_a_long_file_streams_to_the_whole_file_latents_and_codes(sf_codec, speech_files):
    """Issue 49: on a 3-minute file `reconstruct --stream` and `reconstruct` chose one code differently, as
    the stream computed each frame in a window of a dozen frames, whose matmuls, convolutions and
    elementwise tails round otherwise than the whole file's pass. The stream now computes each frame once,
    layer by layer, with the whole file's kernels: latents bit for bit (but in the last frames, which the
    whole-file pass computes in its scalar tails), codes equal, for any chunking."""
    from codec.core.streaming import StreamingEncoder

    codec = Codec.from_pretrained(sf_codec)
    files = [f for split in ("test", "valid", "train") for f in speech_files[split]]
    parts, total = [], 0
    while total < 180 * SR:
        parts.append(load_audio(files[len(parts)], SR, 1))
        total += parts[-1].shape[-1]
    wav = torch.cat(parts, -1)[None, :, : 180 * SR - 123]  # 3 minutes less a partial frame
    with torch.no_grad():
        offline = codec.encoder(codec.pad_to_hop(wav))
    codes = codec.quantizer.encode(offline)
    g = torch.Generator().manual_seed(0)
    stream, latents, at = StreamingEncoder(codec).chain, [], 0
    while at < wav.shape[-1]:
        n = int(torch.randint(1, 400 if at < SR else 16000, (1,), generator=g))  # short chunks, then longer
        latents.append(stream.step(wav[..., at: at + n]))
        at += n
    latents.append(stream.step(torch.zeros(1, 1, (-wav.shape[-1]) % HOP)))
    streamed = torch.cat(latents, -1)
    assert streamed.shape == offline.shape
    assert torch.equal(streamed[..., :-4], offline[..., :-4])
    assert torch.equal(codec.quantizer.encode(streamed), codes)


def test_tokenize_gives_the_whole_file_codes(sf_codec, speech_files, tmp_path):
    src = tmp_path / "audio"
    src.mkdir()
    for f in speech_files["valid"][:3]:
        shutil.copy(f, src / f.name)
    out = tmp_path / "tokens"
    assert main(["tokenize", str(src), str(out), "--codec", str(sf_codec), "--chunk-seconds", "0.5"]) == 0
    codec = Codec.from_pretrained(sf_codec)
    shards = TokenShards.open(out, verify=True)
    for entry in shards.entries:
        ref = codec.encode(load_audio(src / entry.path, SR, 1)[None])[0].T.numpy()
        np.testing.assert_array_equal(np.asarray(shards.read(entry)), ref)


def test_the_f0_target_keeps_harvests_voicing_and_values_in_pyins_octave():
    """Issue 38's measurement (docs/experiments.md): pYIN's values cost quality, Harvest's octave slips
    cost pitch; the target moves Harvest's F0 by whole octaves only."""
    from codec.source_filter.world_analysis import target_f0

    harvest = np.array([0.0, 100.0, 200.0, 210.0, 90.0, 0.0])
    pyin = np.array([150.0, 0.0, 101.0, 220.0, 370.0, 0.0])
    np.testing.assert_allclose(target_f0(harvest, pyin), [0.0, 100.0, 100.0, 210.0, 360.0, 0.0])


def test_two_envelopes_a_frame_decode_to_the_measured_envelopes_every_10_ms(speech_files):
    """Issue 48: a frame carries its centre envelope and the one 10 ms before it, as the residual from the
    mean of the centre envelopes around it; the decoder's 10 ms frames are those envelopes, measured at
    their own F0, and a codec saved with one envelope a frame keeps its config.json and fingerprints."""
    torch.manual_seed(0)
    codec = Codec(_config(2)).eval()
    wav = load_audio(speech_files["valid"][0], SR, 1)[None, :, : 2 * SR]
    with torch.no_grad():
        z = codec.encoder(wav)  # [1, 52, T]
        logits, _ = codec.encoder.net(wav)
        from codec.source_filter.parts import voiced_class
        f0 = class_to_f0(voiced_class(logits.transpose(1, 2)))
        centre = codec.encoder.envelope(wav, f0)[0]  # [T, 25]
        mid = codec.encoder.envelope(wav, mid_f0(f0), HALF)[0]
    f0s, mceps, aps = codec.decoder.parameters_of(z[0])
    T = z.shape[-1]
    assert z.shape[1] == 52 and mceps.shape == (2 * T - 1, 25) and f0s.shape == aps.shape == (2 * T - 1,)
    torch.testing.assert_close(mceps[0::2], centre, atol=1e-4, rtol=0)
    torch.testing.assert_close(mceps[1::2], mid[1:], atol=1e-4, rtol=0)
    torch.testing.assert_close(f0s[1::2], mid_f0(f0[0].double())[1:], rtol=1e-5, atol=0)
    assert codec.decoder(z).shape == (1, 1, T * HOP)
    assert "envelopes" not in _config(1).to_dict()["encoder"] and _config(2).to_dict()["decoder"]["envelopes"] == 2


def test_the_quantizer_can_see_telephone_copies_of_the_training_files(speech_files):
    """Issue 48: codebooks fitted on wideband files only lost the words of audio through 8 kHz; a recipe's
    `narrowband_every: n` adds every n-th training file, band-limited, to the k-means set."""
    from codec.source_filter.training import narrowband_copies, read_recipe

    items = [{"wav": load_audio(f, SR, 1)[0]} for f in speech_files["train"][:4]]
    copies = narrowband_copies(items, 3)
    assert len(copies) == 2 and narrowband_copies(items, 0) == []
    for item, copy in zip(items[::3], copies):
        assert copy["wav"].shape == item["wav"].shape
        high = lambda w: torch.fft.rfft(w)[int(0.28 * len(w)):].abs().pow(2).sum()  # noqa: E731 - above 4.5 kHz
        assert high(copy["wav"]) < 1e-2 * high(item["wav"])
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "codec_source_filter.yaml"
    assert read_recipe(recipe).narrowband_every == 3


def test_the_f0_half_a_frame_before_is_the_geometric_mean_where_both_are_voiced():
    f0 = torch.tensor([100.0, 400.0, 0.0, 150.0])
    torch.testing.assert_close(mid_f0(f0), torch.tensor([100.0, 200.0, 0.0, 0.0]))
    torch.testing.assert_close(mid_f0(f0, torch.tensor(25.0)), torch.tensor([50.0, 200.0, 0.0, 0.0]))


def test_the_parts_refuse_another_frame_grid():
    with pytest.raises(ValueError, match="latent_dim 27"):
        CodecConfig.from_dict({"latent_dim": 8, "encoder": {"kind": "source_filter"}})


def test_train_source_filter_runs_from_a_recipe_and_resumes(speech_files, tmp_path, capsys):
    pytest.importorskip("pyworld")
    corpus = tmp_path / "corpus"
    for split in ("train", "valid"):
        (corpus / split).mkdir(parents=True)
        for f in speech_files[split][:2]:
            shutil.copy(f, corpus / split / f.name)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"corpora: [{corpus}]\nrun_dir: {tmp_path / 'run'}\nsteps: 4\nbatch: 2\ncheckpoint_every: 2\n"
                      "kmeans_frames: 2000\nkmeans_iters: 2\nworkers: 1\n"
                      "codec: {encoder: {kind: source_filter, width: 16, layers: 1}}\n")
    assert main(["train-source-filter", str(recipe), "--threads", "1"]) == 0
    codec = Codec.from_pretrained(tmp_path / "run" / "pretrained")
    assert codec.n_codebooks == 8 and codec.config.decoder.kind == "source_filter"
    assert main(["train-source-filter", str(recipe), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 of 4 files analysed already" in out and "resumed at step 4 of 4" in out
    again = Codec.from_pretrained(tmp_path / "run" / "pretrained")
    assert again.token_fingerprint() == codec.token_fingerprint()


def test_a_codec_saved_before_two_envelopes_keeps_its_config_and_so_its_fingerprints():
    """The 20 ms codec shipped until issue 48 (fingerprint d2a1253ab2e5): `envelopes`, added later, stays out
    of its config.json at its default, so its fingerprints and the token folders made with it still match."""
    saved = {"causal": True, "channels": 1, "decoder": {"kind": "source_filter", "n_fft": 1024},
             "encoder": {"kernel": 3, "kind": "source_filter", "layers": 4, "width": 256},
             "latent_dim": 27,
             "quantizer": {"codebook_size": 1024, "commitment_weight": 1.0, "dead_code_threshold": 0.02,
                           "dropout": 0.0, "ema_decay": 0.99, "kmeans_init": False, "kmeans_iters": 10,
                           "n_codebooks": 8},
             "sample_rate": 16000, "strides": [4, 4, 5, 4]}
    config = CodecConfig.from_dict(saved)
    assert config.encoder.envelopes == 1 and config.decoder.envelopes == 1
    assert config.to_dict() == saved  # what shaping_settings and token_settings hash
    assert config.shaping_settings() == {"format_version": 2, **saved}
    two = CodecConfig.from_dict({**saved, "latent_dim": 52, "encoder": {**saved["encoder"], "envelopes": 2},
                                 "decoder": {**saved["decoder"], "envelopes": 2}})
    assert two.to_dict()["encoder"]["envelopes"] == 2 and two.to_dict() != saved
