"""Hugging Face codecs (EnCodec, DAC, Mimi) through rvqlm's own commands (codec/hf/adapter.py, issue 39).

Each family is built with a tiny random configuration and written by transformers' save_pretrained;
nothing is downloaded. The references are transformers' own models loaded from the same folders and
called as their documentation calls them (DAC's input prepared by its DacFeatureExtractor), never
rvqlm's adapters. Real speech: original Vorbis files of the built-in corpus (22.05 kHz), one turned
into a 44.1 kHz stereo mp3, one into a 16 kHz wav, so resampling and downmixing are on the way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

transformers = pytest.importorskip("transformers")

from codec.core.audio import iter_audio_blocks, load_audio, save_audio  # noqa: E402
from codec.core.rvq_file import read_rvq  # noqa: E402
from codec.loading import load_codec  # noqa: E402
from codec.tokenize.audio_folder import STREAM_BLOCK_SECONDS  # noqa: E402
from rvqlm.cli import main  # noqa: E402
from rvqlm_core.token_shards import TokenShards  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FLAGS = ["--workers", "0", "--threads", "1", "--device", "cpu", "--no-progress", "--shard-frames", "100"]
FAMILIES = ("encodec", "dac", "mimi")


def _tiny(family: str, seed: int = 0):
    """A small random model of `family` (about 0.15 M parameters, a few ms per second of audio)."""
    torch.manual_seed(seed)
    if family == "encodec":  # 24 kHz, 75 frames/s, 8 codebooks of 1024 at 6 kbps
        config = transformers.EncodecConfig(target_bandwidths=[1.5, 3.0, 6.0], hidden_size=16, num_filters=4,
                                            num_lstm_layers=1)
        return transformers.EncodecModel(config).eval()
    if family == "dac":  # 16 kHz, 50 frames/s, 4 codebooks of 1024
        config = transformers.DacConfig(encoder_hidden_size=4, downsampling_ratios=[2, 4, 5, 8], decoder_hidden_size=32,
                                        n_codebooks=4, codebook_dim=8, sampling_rate=16000)
        return transformers.DacModel(config).eval()
    config = transformers.MimiConfig(hidden_size=32, num_filters=4, codebook_dim=16, num_quantizers=8,  # 12.5 Hz, 2048
                                     vector_quantization_hidden_dimension=16, num_hidden_layers=1, intermediate_size=64,
                                     num_attention_heads=2, num_key_value_heads=2, upsample_groups=32)
    return transformers.MimiModel(config).eval()


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    dirs = {}
    for family in FAMILIES:
        dirs[family] = root / family
        _tiny(family).save_pretrained(dirs[family])
    dirs["mimi-other"] = root / "mimi-other"  # the same layout, other weights
    _tiny("mimi", seed=1).save_pretrained(dirs["mimi-other"])
    return dirs


@pytest.fixture(scope="module")
def audio(tmp_path_factory, real_ogg) -> Path:
    """train/: an original 22.05 kHz ogg, a 44.1 kHz stereo mp3, a 16 kHz wav; valid/: a 48 kHz wav (12 s in all)."""
    from rvqlm.corpora.fillets import list_source_files

    src = {f.source.name: f.source for f in list_source_files()[:12]}
    d = tmp_path_factory.mktemp("audio") / "speech"
    (d / "train").mkdir(parents=True)
    (d / "valid").mkdir()
    (d / "train" / "divna.ogg").write_bytes(src["let-m-divna.ogg"].read_bytes())
    save_audio(d / "train" / "sedadlo.mp3", load_audio(src["let-m-sedadlo.ogg"], 44100, 2), 44100)
    save_audio(d / "train" / "budrada.wav", load_audio(src["let-v-budrada.ogg"], 16000, 1), 16000)
    save_audio(d / "valid" / "amfornictvi.wav", load_audio(src["kni-m-amfornictvi.ogg"], 48000, 1), 48000)
    assert sf.info(str(d / "train" / "sedadlo.mp3")).channels == 2
    return d


def _reference_model(family: str, folder: Path):
    cls = {"encodec": transformers.EncodecModel, "dac": transformers.DacModel, "mimi": transformers.MimiModel}[family]
    return cls.from_pretrained(str(folder), local_files_only=True).eval()


@torch.inference_mode()
def _reference_encode(family: str, model, wav: torch.Tensor, n_q: int | None = None) -> torch.Tensor:
    """wav [C, S] -> codes [N, T] as transformers' documentation encodes (N: all, or n_q's bandwidth)."""
    if family == "encodec":
        bandwidths = model.config.target_bandwidths
        bandwidth = max(bandwidths) if n_q is None else next(
            b for b in bandwidths if model.quantizer.get_num_quantizers_for_bandwidth(b) == n_q)
        return model.encode(wav[None], bandwidth=bandwidth).audio_codes[0, 0]
    if family == "dac":
        extractor = transformers.DacFeatureExtractor(sampling_rate=model.config.sampling_rate,
                                                     hop_length=model.config.hop_length)
        inputs = extractor(raw_audio=wav[0].numpy(), sampling_rate=model.config.sampling_rate, return_tensors="pt")
        return model.encode(inputs["input_values"], n_quantizers=n_q).audio_codes[0]
    return model.encode(wav[None], num_quantizers=n_q).audio_codes[0]


@torch.inference_mode()
def _reference_decode(family: str, model, codes: torch.Tensor) -> torch.Tensor:
    """codes [k, T] -> audio [C, S'] of transformers' decode."""
    if family == "encodec":
        return model.decode(codes[None, None], [None]).audio_values[0]
    if family == "dac":
        return model.decode(audio_codes=codes[None]).audio_values
    return model.decode(codes[None]).audio_values[0]


def _tokenize(audio: Path, out: Path, codec: Path) -> None:
    assert main(["tokenize", str(audio), str(out), "--codec", str(codec), *FLAGS]) == 0


@pytest.fixture(scope="module")
def tokens(hf_dirs, audio, tmp_path_factory) -> dict[str, Path]:
    """Each family's token folder of `audio`, written by `rvqlm tokenize`."""
    root = tmp_path_factory.mktemp("tokens")
    for family in FAMILIES:
        _tokenize(audio, root / family, hf_dirs[family])
    return {family: root / family for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenize_gives_the_models_own_codes_file_by_file(family, hf_dirs, audio, tokens):
    model = _reference_model(family, hf_dirs[family])
    shards = TokenShards.open(tokens[family], verify=True)
    assert sorted(e.path for e in shards.entries) == ["train/budrada.wav", "train/divna.ogg", "train/sedadlo.mp3",
                                                      "valid/amfornictvi.wav"]
    rate = model.config.sampling_rate
    for e in shards.entries:  # the samples as the tokenizer reads them: resampled, downmixed
        wav = torch.cat(list(iter_audio_blocks(audio / e.path, rate, 1, STREAM_BLOCK_SECONDS)), dim=1)
        ref = _reference_encode(family, model, wav).T.numpy()  # [T, N_c]
        np.testing.assert_array_equal(np.asarray(shards.read(e)), ref, err_msg=f"{family}: {e.path}")
    meta = json.loads((tokens[family] / "codec.json").read_text())
    codec = load_codec(hf_dirs[family])
    assert meta["fingerprint"] == codec.token_fingerprint() and meta["codec_config"]["model_type"] == family
    assert (meta["sample_rate"], meta["frame_rate"], meta["n_codebooks"]) == (
        rate, {"encodec": 75.0, "dac": 50.0, "mimi": 12.5}[family], {"encodec": 8, "dac": 4, "mimi": 8}[family])


def test_two_torchrun_ranks_give_the_one_process_folder(hf_dirs, audio, tokens, tmp_path):
    """Mimi under torchrun (two CPU ranks over gloo): the merged folder equals the one-process one."""
    from test_tokenize_distributed import assert_same_files

    out = tmp_path / "tok"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "rvqlm",
           "tokenize", str(audio), str(out), "--codec", str(hf_dirs["mimi"]), *FLAGS]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_files(tokens["mimi"], out)


@pytest.mark.parametrize("family", FAMILIES)
def test_reconstruct_equals_the_reference_decode(family, hf_dirs, audio, tmp_path, monkeypatch):
    """`rvqlm reconstruct --n-codebooks 2`: the samples it writes (before 16-bit rounding) are the
    reference decode of the reference's 2-codebook codes, within 1e-5; `encode` writes those codes and
    `decode` turns them into the same samples."""
    import codec.core.audio

    written = {}
    real_save = codec.core.audio.save_audio
    monkeypatch.setattr(codec.core.audio, "save_audio", lambda path, wav, rate: written.update(wav=wav, rate=rate)
                        or real_save(path, wav, rate))
    src = audio / "train" / "sedadlo.mp3"
    out = tmp_path / "recon.wav"
    assert main(["reconstruct", str(src), str(out), "--codec", str(hf_dirs[family]), "--n-codebooks", "2"]) == 0
    model = _reference_model(family, hf_dirs[family])
    wav = load_audio(src, model.config.sampling_rate, 1)
    codes = _reference_encode(family, model, wav, n_q=2)
    ref = _reference_decode(family, model, codes)
    n = min(ref.shape[-1], wav.shape[-1])
    assert written["rate"] == model.config.sampling_rate and written["wav"].shape == wav.shape
    torch.testing.assert_close(written["wav"][:, :n], ref[:, :n], atol=1e-5, rtol=0)
    assert sf.info(str(out)).samplerate == model.config.sampling_rate
    rvq = tmp_path / "x.rvq"
    assert main(["encode", str(src), str(rvq), "--codec", str(hf_dirs[family]), "--n-codebooks", "2"]) == 0
    got, header = read_rvq(rvq)
    assert torch.equal(got, codes) and header["codec_fingerprint"] == load_codec(hf_dirs[family]).token_fingerprint()
    reconstructed = written.pop("wav")
    assert main(["decode", str(rvq), str(tmp_path / "back.wav"), "--codec", str(hf_dirs[family])]) == 0
    torch.testing.assert_close(written["wav"], reconstructed, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def mimi_lm(tokens, tmp_path_factory) -> Path:
    """A tiny LM of the first 4 of the tiny Mimi's 8 codebooks, 4 steps of recipes/lm_tiny.yaml."""
    run = tmp_path_factory.mktemp("lm") / "run"
    assert main(["train-lm", "--config", str(REPO / "recipes" / "lm_tiny.yaml"), "--data.tokens_dir",
                 str(tokens["mimi"]), "--data.keep_codebooks", "4", "--data.window_frames", "24",
                 "--trainer.max_steps", "4", "--trainer.val_check_interval", "4",
                 "--trainer.default_root_dir", str(run)]) == 0
    return run / "pretrained"


def test_a_tiny_lm_of_mimi_tokens_continues_a_prompt(mimi_lm, hf_dirs, audio, tmp_path):
    config = json.loads((mimi_lm / "config.json").read_text())["config"]
    assert config["n_codebooks"] == 4 and config["codebook_size"] == 2048
    assert config["codec_fingerprint"] == load_codec(hf_dirs["mimi"]).token_fingerprint()
    out = tmp_path / "cont.wav"
    assert main(["generate", "--lm", str(mimi_lm), "--codec", str(hf_dirs["mimi"]), "--prompt",
                 str(audio / "valid" / "amfornictvi.wav"), "--prompt-seconds", "1", "--seconds", "2", "--out",
                 str(out), "--seed", "0", "--no-progress", "--threads", "1"]) == 0
    info, full = sf.info(str(out)), sf.info(str(tmp_path / "cont.full.wav"))
    assert (info.samplerate, info.channels, info.frames) == (24000, 1, 25 * 1920)  # round(2 s * 12.5 Hz) frames
    assert (full.samplerate, full.frames) == (24000, (12 + 25) * 1920)  # + the prompt's 12 whole frames
    assert np.abs(sf.read(str(out))[0]).max() > 0


def test_eval_lm_scores_the_kept_codebooks_and_a_bad_count_is_refused(mimi_lm, tokens, tmp_path, capsys):
    assert main(["eval-lm", "--lm", str(mimi_lm), "--tokens", str(tokens["mimi"]), "--unigram",
                 "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["nll_per_codebook"]) == len(report["unigram_nll_per_codebook"]) == 4
    err = _one_line_error(capsys, ["train-lm", "--config", str(REPO / "recipes" / "lm_tiny.yaml"), "--data.tokens_dir",
                                   str(tokens["mimi"]), "--data.keep_codebooks", "9",
                                   "--trainer.default_root_dir", str(tmp_path / "run")])
    assert err.endswith(f"data.keep_codebooks must be in 1..8 (the codebooks of {tokens['mimi']}), got 9")


def _one_line_error(capsys, args: list[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_mismatched_codec_is_refused_in_one_line(mimi_lm, hf_dirs, audio, tmp_path, capsys):
    prompt = str(audio / "valid" / "amfornictvi.wav")
    base = ["generate", "--lm", str(mimi_lm), "--prompt", prompt, "--seconds", "1", "--out", str(tmp_path / "x.wav")]
    err = _one_line_error(capsys, base + ["--codec", str(hf_dirs["mimi-other"])])  # same layout, other weights
    assert err.startswith("rvqlm generate: error: codec mismatch: the LM was trained on tokens of codec")
    err = _one_line_error(capsys, base + ["--codec", str(hf_dirs["encodec"])])
    assert "the codec makes N_c=8 codebooks of 1024 codes, the LM models N_c=4 of 2048: not the LM's codec" in err
    assert not list(tmp_path.iterdir())
    rvq = tmp_path / "x.rvq"
    assert main(["encode", prompt, str(rvq), "--codec", str(hf_dirs["mimi"])]) == 0
    err = _one_line_error(capsys, ["decode", str(rvq), str(tmp_path / "y.wav"), "--codec", str(hf_dirs["mimi-other"])])
    assert "decode it with the codec that encoded it" in err


def test_unsupported_folders_and_streaming_are_refused_in_one_line(hf_dirs, audio, tmp_path, capsys):
    other = tmp_path / "whisper"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    src, out = str(audio / "train" / "divna.ogg"), str(tmp_path / "r.wav")
    err = _one_line_error(capsys, ["reconstruct", src, out, "--codec", str(other)])
    assert err.endswith("a Hugging Face model of type 'whisper' is not a codec rvqlm can use; supported model "
                        "types: encodec, dac, mimi")
    err = _one_line_error(capsys, ["reconstruct", src, out, "--codec", str(hf_dirs["encodec"]), "--stream"])
    assert "cannot stream in rvqlm" in err and "run without --stream" in err
    err = _one_line_error(capsys, ["reconstruct", src, out, "--codec", str(hf_dirs["dac"]), "--n-codebooks", "5"])
    assert err.endswith("--n-codebooks must be in 1..4 for this codec, got 5")
    assert not Path(out).exists()


def test_fingerprints_cover_what_makes_the_codes(hf_dirs):
    """A decoder change keeps the token fingerprint (not the full one); an encoder change moves both."""
    codec = load_codec(hf_dirs["mimi"])
    token, full = codec.token_fingerprint(), codec.fingerprint()
    assert load_codec(hf_dirs["mimi"]).token_fingerprint() == token  # stable across loads
    with torch.no_grad():
        next(codec.model.decoder.parameters()).add_(1.0)
        assert codec.token_fingerprint() == token and codec.fingerprint() != full
        next(codec.model.encoder.parameters()).add_(1.0)
        assert codec.token_fingerprint() != token
    assert len({load_codec(hf_dirs[f]).token_fingerprint() for f in (*FAMILIES, "mimi-other")}) == 4
    with pytest.raises(ValueError, match="inference only"):
        codec.train()
    assert not codec.eval().model.training


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_an_audio_codec_that_says_why_it_cannot_stream(family, hf_dirs):
    """The adapter is an AudioCodec (codec/core/interface.py); its capabilities are properties, and the
    streaming codec refuses it with its own `stream_refusal`."""
    from codec.core.interface import AudioCodec
    from codec.core.streaming import StreamingDecoder, StreamingEncoder

    codec = load_codec(hf_dirs[family])
    assert isinstance(codec, AudioCodec) and not codec.can_stream and "cannot stream in rvqlm" in codec.stream_refusal
    assert codec.frame_span is None and codec.tokenizes_whole_files
    assert codec.config_dict() == codec.model.config.to_dict()
    for make in (StreamingEncoder, StreamingDecoder, lambda c: c.streaming_encoder(), lambda c: c.streaming_decoder()):
        with pytest.raises(ValueError) as refused:
            make(codec)
        assert str(refused.value) == codec.stream_refusal
