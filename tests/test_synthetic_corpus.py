"""rvqlm/corpora/synthetic.py: the built-in corpus plus its train and valid lines in espeak-ng voices."""

from __future__ import annotations

import json
import math

import pytest
import torch

from codec.core.audio import audio_info, load_audio
from codec.source_filter.pitch import yin
from rvqlm.corpora.folder import SPLITS, CorpusError, corpus_subset
from rvqlm.corpora.synthetic import PEAK, VOICES, espeak, prepare_synthetic, synthetic_relpath

TWO = ("synth-m1", "synth-f2")


def rows(folder, split):
    path = folder / split / "metadata.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


@pytest.fixture(scope="module")
def small(corpus_dir, tmp_path_factory):
    """(source, out): 3 files per split of the built-in corpus, and its synthetic corpus in two voices."""
    root = tmp_path_factory.mktemp("synth")
    source = corpus_subset(corpus_dir, root / "sub", 3)
    return source, prepare_synthetic(root / "out", source, voices=TWO, progress=False)


def test_every_train_and_valid_line_is_spoken_in_each_voice_and_test_stays_real(small):
    source, out = small
    meta = json.loads((out / "corpus.json").read_text())
    for split in SPLITS:
        real = rows(source, split)
        with_text = [r for r in real if r.get("text")]
        mine = rows(out, split)
        assert mine[:len(real)] == real  # the real rows first, unchanged
        synthetic = mine[len(real):]
        if split == "test":
            assert synthetic == [] and not any(e["level"] in VOICES for e in meta["files"] if e["split"] == "test")
            continue
        assert len(with_text) > 0 and len(synthetic) == len(TWO) * len(with_text)
        for r in with_text:
            for voice in TWO:
                rel = synthetic_relpath(f"{split}/{r['file_name']}", voice)
                row = next(s for s in synthetic if f"{split}/{s['file_name']}" == rel)
                assert row["speaker"] == voice and row["text"] == r["text"]
                info = audio_info(out / rel)
                assert info.sample_rate == 16000 and info.channels == 1 and info.duration > 0.3
    real_files = [e for e in meta["files"] if e["level"] not in VOICES]
    assert len(real_files) == 3 * len(SPLITS)
    for e in real_files:
        assert torch.allclose(load_audio(out / e["path"], 16000, 1), load_audio(source / e["path"], 16000, 1),
                              atol=1e-4)


def test_the_voices_differ_and_are_scaled_to_the_peak():
    text = "Co je to za divnou loď? To není skleněné oko, ale gyroskop."
    low, high = (espeak(text, v, 16000) for v in ("synth-m3", "synth-f4"))
    assert low.shape[0] == 1 and float(low.abs().max()) == pytest.approx(PEAK, rel=1e-4)
    medians = []
    for x in (low, high):
        f0, voiced = yin(x[0], 16000, 160)
        assert voiced.float().mean() > 0.1
        medians.append(float(f0[voiced].median()))
    assert 12 * math.log2(medians[1] / medians[0]) > 5  # semitones (about 17): a woman's variant over a man's


def test_a_rerun_resynthesizes_nothing_and_other_settings_are_refused(small, monkeypatch):
    source, out = small
    monkeypatch.setattr("rvqlm.corpora.synthetic.espeak", lambda *a: pytest.fail("re-synthesized"))
    assert prepare_synthetic(out, source, voices=TWO, progress=False) == out
    with pytest.raises(CorpusError, match="prepared with"):
        prepare_synthetic(out, source, voices=("synth-m1",), progress=False)
    with pytest.raises(CorpusError, match="unknown synthetic voice"):
        prepare_synthetic(out.parent / "other", source, voices=("synth-x",), progress=False)


def test_without_espeak_ng_one_line_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(CorpusError, match="espeak-ng is not installed"):
        espeak("ahoj", "synth-m1", 16000)
