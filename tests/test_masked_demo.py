"""The demo's masked-LM section (rvqlm/demo/masked.py): the same prompts continued by a masked LM with
each clip's generation time, and one line saying how to get a masked LM when none fits the codec."""

from __future__ import annotations

import pytest
import torch

from codec.core.audio import audio_info
from rvqlm.demo.masked import RECIPE, masked_continuations, masked_lm_hint

SHIPPED_CODEC = "models/codec-speech-16k"


@pytest.fixture(scope="module")
def codec():
    from rvqlm.demo.pipeline import load_codec

    return load_codec(SHIPPED_CODEC)


def tiny_masked_dir(root, codec, fingerprint=None, family="masked"):
    from lm import LMConfig, MaskedLM, MultiCodebookLM

    torch.manual_seed(0)
    masked = family == "masked"
    cfg = LMConfig(n_codebooks=8, codebook_size=1024, d_model=16, n_layers=1, n_heads=2, max_seq_len=64,
                   pattern="parallel" if masked else "delay", family=family,
                   codec_fingerprint=fingerprint or codec.token_fingerprint())
    return (MaskedLM if masked else MultiCodebookLM)(cfg).save_pretrained(root)


def test_a_masked_lm_that_does_not_fit_leaves_the_section_as_one_line(codec, tmp_path):
    said = []
    done = masked_continuations(codec, tmp_path / "none", [tmp_path / "p.wav"], 1.0, 1.0, tmp_path, say=said.append)
    assert done.rows == [] and said == [done.description] and RECIPE in done.description
    assert "no masked LM at" in done.description
    assert "not a masked LM" in masked_lm_hint(tiny_masked_dir(tmp_path / "ar", codec, family="ar"), codec)
    assert "another codec" in masked_lm_hint(tiny_masked_dir(tmp_path / "other", codec, "0" * 64), codec)


def test_masked_continuations_have_the_asked_length_and_their_generation_time(codec, speech_files, tmp_path):
    lm_dir = tiny_masked_dir(tmp_path / "lm", codec)
    prompt = next(f for f in speech_files["test"] if audio_info(f).duration > 1.5)
    said = []
    done = masked_continuations(codec, lm_dir, [prompt], 1.0, 1.6, tmp_path / "out", steps="2,1", seed=3,
                                say=said.append)
    assert len(done.rows) == 1 and len(done.table) == 1
    row = done.table[0]
    assert float(row["generation s"]) > 0 and row["model calls"] == str(2 + 1 + 6)  # one pass: 130 frames, within 2.1 x 64
    wav = tmp_path / "out" / "audio" / "masked-prompt1-continuation.wav"
    assert audio_info(wav).duration == pytest.approx(1.0 + 1.6, abs=0.02)
    assert "masked LM: 1 continuations" in said[0]
