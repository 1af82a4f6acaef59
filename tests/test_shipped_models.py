"""The models in models/ load, belong together, and do what their cards say on real speech."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from codec import Codec
from codec.core.audio import load_audio
from codec.neural.losses import mel_distance
from lm import MultiCodebookLM

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec.from_pretrained(MODELS / "codec-speech-16k")


@pytest.fixture(scope="module")
def lm() -> MultiCodebookLM:
    return MultiCodebookLM.from_pretrained(MODELS / "lm-speech-16k")


def test_the_shipped_codec_keeps_its_fingerprints(codec):
    """Token folders, .rvq files and the shipped LM record these: loading must not change them."""
    assert codec.fingerprint() == "8cc03eff9dec133b46e0bf4f71ad2f5f9b49e05a275c186f012e91854753bc9d"
    assert codec.token_fingerprint().startswith("2335577b91b5")
    assert codec.accepts_tokens(codec.token_fingerprint()) and not codec.accepts_tokens(codec.fingerprint())


def test_the_shipped_lm_models_the_shipped_codecs_tokens(codec, lm):
    assert lm.config.codec_fingerprint == codec.token_fingerprint()
    assert (lm.config.n_codebooks, lm.config.codebook_size) == (codec.n_codebooks, codec.codebook_size)
    card = (MODELS / "codec-speech-16k" / "MODEL_CARD.md").read_text()
    assert codec.fingerprint()[:12] in card and codec.token_fingerprint()[:12] in card
    assert codec.token_fingerprint()[:12] in (MODELS / "lm-speech-16k" / "MODEL_CARD.md").read_text()


def test_the_shipped_codec_reconstructs_real_held_out_speech(codec, speech_files):
    """A test-split file (a game level training never read) comes back close in mel distance, and
    better with 8 codebooks than with 1, as the card's table says."""
    wav = load_audio(speech_files["test"][0], codec.sample_rate, codec.channels)[None]
    codes = codec.encode(wav)
    assert codes.shape[1] == 8 and 0 <= int(codes.min()) and int(codes.max()) < 1024
    n = wav.shape[-1]
    full = mel_distance(codec.decode(codes)[..., :n], wav, codec.sample_rate).item()
    one = mel_distance(codec.decode(codes[:, :1])[..., :n], wav, codec.sample_rate).item()
    silence = mel_distance(torch.zeros_like(wav), wav, codec.sample_rate).item()
    assert full < one and full < 0.5 * silence


def test_the_shipped_lm_predicts_held_out_speech_tokens_better_than_chance(codec, lm, speech_files):
    wav = load_audio(speech_files["test"][0], codec.sample_rate, codec.channels)[None]
    codes = codec.encode(wav)[..., : lm.config.max_frames]
    with torch.no_grad():
        nll, valid = lm.token_nll(codes)
    per_token = float(nll.sum() / valid.sum())
    assert per_token < math.log(codec.codebook_size) - 0.5  # uniform guessing: log 1024 = 6.93 nats


@pytest.mark.parametrize("name", ["codec_quality_test.json", "codec_pitch_test.json", "codec_quality_foreign.json",
                                  "codec_quality_men.json", "codec_quality_narrowband.json", "codec_pitch_foreign.json"])
def test_the_codec_cards_benchmark_files_are_this_codec(codec, name):
    result = json.loads((MODELS / "codec-speech-16k" / name).read_text())
    assert result["codec_fingerprint"] == codec.fingerprint() and result["split"] == "test"


def test_the_shipped_masked_lm_fills_held_out_speech_better_than_chance(codec, lm, speech_files):
    """The masked LM models the shipped codec's tokens (its card names them), is the AR LM's shape, and
    predicts hidden codes of a held-out file better than uniform guessing."""
    from lm import MaskedLM, load_lm

    masked = load_lm(MODELS / "lm-masked-speech-16k").eval()
    assert isinstance(masked, MaskedLM) and masked.config.codec_fingerprint == codec.token_fingerprint()
    assert (masked.config.d_model, masked.config.n_layers, masked.config.max_seq_len) == (lm.config.d_model, lm.config.n_layers,
                                                                                 lm.config.max_seq_len)
    assert codec.token_fingerprint()[:12] in (MODELS / "lm-masked-speech-16k" / "MODEL_CARD.md").read_text()
    wav = load_audio(speech_files["test"][0], codec.sample_rate, codec.channels)[None]
    codes = codec.encode(wav)[..., : masked.config.max_frames]
    with torch.no_grad():  # level 0, half its frames hidden, the finer levels hidden: 3.0 nats on the card
        out = masked.loss(codes, generator=torch.Generator().manual_seed(0), level=0, ratio=0.5, prefix_prob=0.0)
    assert out.count[0] > 0 and out.loss < math.log(codec.codebook_size) - 1.0  # uniform: 6.93 nats


def test_the_shipped_conditioned_lm_hears_who_speaks_in_held_out_speech(codec, lm, corpus_dir):
    """The conditioned LM models the shipped codec's tokens, knows both fish and the synthetic voices,
    and scores real held-out files of the two fish better with their own speaker than with the other
    fish (its card: +0.021 +- 0.002 nats/token over the test split)."""
    from lm import load_lm

    folder = MODELS / "lm-speech-conditioned-16k"
    model = load_lm(folder).eval()
    cond = model.config.condition
    assert cond is not None and model.config.codec_fingerprint == codec.token_fingerprint()
    assert {"font_small", "font_big", "synth-m1", "synth-f2"} <= set(cond.speakers)
    assert (model.config.d_model, model.config.n_layers) == (lm.config.d_model, lm.config.n_layers)
    assert codec.token_fingerprint()[:12] in (folder / "MODEL_CARD.md").read_text()
    rows = [json.loads(line) for line in (corpus_dir / "test" / "metadata.jsonl").read_text().splitlines()]
    other = {"font_small": "font_big", "font_big": "font_small"}
    files = sorted((r["file_name"], r["speaker"]) for r in rows if r.get("speaker") in other)
    files = [f for v in other for f in [f for f in files if f[1] == v][:8]]  # the first 8 of each fish
    gains = []
    for name, speaker in files:
        codes = codec.encode(load_audio(corpus_dir / "test" / name, codec.sample_rate, codec.channels)[None])
        codes = codes[..., : model.config.max_frames - 1]
        nll = []
        for who in (speaker, other[speaker]):
            with torch.no_grad():
                out, valid = model.token_nll(codes, condition=model.condition_inputs(None, who, 1))
            nll.append(float(out.sum() / valid.sum()))
        gains.append(nll[1] - nll[0])
    gains = torch.tensor(gains)
    assert len(gains) == 16 and gains.mean() > 3 * gains.std() / 4, gains  # > 3 standard errors of 16 files
