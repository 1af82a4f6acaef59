"""The forced aligner (rvqlm/align/, issue 47): features on the codec's frames, durations from a forced
CTC path, the saved model folder, and `rvqlm train-aligner` / `rvqlm align` on a tiny corpus."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from lm.text_units import unit_ids, units
from rvqlm.align.ctc import AlignerConfig, CTCAligner
from rvqlm.align.durations import align_units, even_durations, path_durations, loud_frames
from rvqlm.align.features import N_MELS, log_mel
from rvqlm.cli import main

ALPHABET = "_ ab"  # ids: EDGE 0, WORD 1, a 2, b 3; CTC classes: blank 0, WORD 1, a 2, b 3


@pytest.mark.parametrize("samples", [1, 319, 320, 321, 513, 640, 16000, 16001, 48317])
def test_one_feature_frame_per_codec_frame(samples):
    feats = log_mel(torch.randn(samples))
    assert feats.shape == (math.ceil(samples / 320), N_MELS)
    assert torch.isfinite(feats).all()


def _log_probs(path: list[int], classes: int = 4) -> torch.Tensor:
    """Log-probs [T, classes] whose best path is `path` (every frame sure of its class)."""
    lp = torch.full((len(path), classes), -8.0)
    lp[torch.arange(len(path)), torch.tensor(path)] = 0.0
    return lp.log_softmax(dim=-1)


def test_durations_follow_the_forced_path():
    """"ab a": leading silence to the edge, each unit's run and the blanks after it to the unit, the last
    unit's run + 2 frames, the rest of the trailing silence to the edge."""
    ids = unit_ids("ab a", ALPHABET)
    assert ids == [0, 2, 3, 1, 2, 0]
    path = [0, 0, 0, 2, 2, 0, 3, 0, 1, 1, 2, 2, 0, 0, 0, 0]
    found = align_units(_log_probs(path), ids)
    assert found.frames == [3, 3, 2, 2, 4, 2] and sum(found.frames) == len(path)
    assert not found.fallback and -0.1 < found.confidence <= 0
    assert path_durations(path, 4) == found.frames


def _loud(first: int, last: int, total: int = 16, quiet: tuple = ()) -> list[bool]:
    return [first <= t <= last and t not in quiet for t in range(total)]


def test_the_silences_follow_the_speech_by_energy():
    """CTC's spikes sit off the sound: with the loud frames (by energy) the first unit starts where speech
    starts, the last ends where it ends, and a pause before a WORD is the WORD's."""
    path = [0, 0, 0, 2, 2, 0, 3, 0, 1, 1, 2, 2, 0, 0, 0, 0]  # "_ab a_"
    assert path_durations(path, 4, _loud(1, 13)) == [1, 5, 2, 2, 4, 2]  # speech before the first spike, after the last
    assert path_durations(path, 4, _loud(5, 10)) == [5, 1, 2, 2, 4, 2]  # a spike in silence: moved, never past unit 2
    assert path_durations(path, 4, _loud(1, 13, quiet=(7,))) == [1, 5, 1, 3, 4, 2]  # b ends at the pause
    wav = torch.zeros(16 * 320)
    wav[4 * 320:11 * 320] = torch.sin(torch.arange(7 * 320) * 0.3)
    assert loud_frames(wav + 1e-4 * torch.randn(len(wav)), 16) == _loud(4, 10)
    assert loud_frames(torch.zeros(100), 1) == [False]


def test_repeated_units_are_two_runs():
    """"aa": the two a's are two units on the path (a blank between them)."""
    ids = unit_ids("aa", ALPHABET)
    found = align_units(_log_probs([0, 2, 0, 2, 0, 0]), ids)
    assert found.frames == [1, 2, 3, 0] and not found.fallback


def test_too_few_frames_fall_back_to_even_durations():
    """"aa" needs 3 frames (a, blank, a): 2 frames are spread evenly over the 4 units, flagged."""
    found = align_units(_log_probs([2, 2]), unit_ids("aa", ALPHABET))
    assert found.fallback and found.confidence is None and found.frames == [1, 1, 0, 0]
    assert even_durations(3, 10) == [4, 3, 3]


def test_the_model_folder_round_trips(tmp_path):
    model = CTCAligner(AlignerConfig(alphabet=ALPHABET, channels=16, hidden=8)).eval()
    model.save_pretrained(tmp_path / "aligner")
    back = CTCAligner.from_pretrained(tmp_path / "aligner")
    feats = torch.randn(1, 30, N_MELS)
    assert back.config == model.config
    assert torch.equal(back(feats), model(feats))
    assert json.loads((tmp_path / "aligner" / "config.json").read_text())["alphabet"] == ALPHABET
    with pytest.raises(FileNotFoundError, match="no aligner folder"):
        CTCAligner.from_pretrained(tmp_path / "missing")


TEXTS = {"train": ["Ahoj, rybko.", "Co je to?", "Ano ano.", None], "valid": ["Pojď sem!", "abcdefghij" * 4],
         "test": ["Tady."]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A corpus folder of short noise-and-tone lines (one without text) with metadata.jsonl, and its
    token folder (random tokens of ceil(S / 320) frames a file, the texts in its metadata)."""
    from codec.core.audio import save_audio
    from rvqlm_core.shard_writer import write_token_corpus

    root = tmp_path_factory.mktemp("align")
    rng = np.random.default_rng(0)
    arrays, meta = {}, {}
    for split, texts in TEXTS.items():
        rows = []
        for i, text in enumerate(texts):
            samples = 8000 + 3217 * i
            t = np.arange(samples) / 16000
            wav = 0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t) * (t > 0.1) + 0.01 * rng.standard_normal(samples)
            name = f"level/f{i}.wav"
            save_audio(root / "corpus" / split / name, torch.tensor(wav, dtype=torch.float32)[None], 16000)
            rows.append({"file_name": name, **({"text": text} if text else {})})
            arrays[f"{split}/{name}"] = rng.integers(0, 16, (math.ceil(samples / 320), 3))
            meta[f"{split}/{name}"] = {"text": text} if text else {}
        (root / "corpus" / split / "metadata.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    codec = dict(fingerprint="0" * 64, n_codebooks=3, codebook_size=16, frame_rate=50.0, sample_rate=16000,
                 codec_config={"synthetic": True})
    write_token_corpus(root / "tokens", arrays, codec, metadata=meta)
    return root


def test_train_aligner_and_align_a_token_folder(tiny, capsys):
    from rvqlm_core.token_shards import TokenShards

    assert main(["train-aligner", str(tiny / "corpus"), str(tiny / "aligner"), "--steps", "3", "--threads", "1"]) == 0
    assert "greedy CER" in capsys.readouterr().out
    assert main(["align", str(tiny / "tokens"), "--corpus", str(tiny / "corpus"), "--aligner", str(tiny / "aligner"),
                 "--threads", "1"]) == 0
    assert "aligned 6 lines (1 spread evenly" in capsys.readouterr().out  # 40 letters on 36 frames
    text = (tiny / "tokens" / "alignments.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines()]
    shards = TokenShards.open(tiny / "tokens")  # the extra file leaves the token folder readable
    texts = {e.path: e.metadata.get("text") for e in shards.entries}
    assert sorted(r["path"] for r in rows) == sorted(p for p, t in texts.items() if t)
    for r in rows:
        assert r["units"] == units(texts[r["path"]]) and len(r["durations"]) == len(r["units"])
        assert sum(r["durations"]) == shards.entry(r["path"]).n_frames and min(r["durations"]) >= 0


def test_align_errors_are_one_line(tiny, capsys):
    args = ["align", str(tiny / "tokens"), "--corpus", str(tiny / "corpus"), "--threads", "1"]
    assert main([*args, "--aligner", str(tiny / "no-aligner")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rvqlm align: error: no aligner folder at") and err.count("\n") == 1
    assert main(["align", str(tiny / "tokens"), "--corpus", str(tiny / "no-corpus"), "--aligner", "x"]) == 2
    assert "no corpus folder" in capsys.readouterr().err
