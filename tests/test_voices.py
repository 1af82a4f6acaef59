"""The voices corpus (rvqlm/voices.py): speakers held out whole, G.722 decoded, the common layout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from rvqlm.corpus import CorpusError, corpus_files
from rvqlm.voices import SPEAKERS, list_voice_files, prepare_voices, split_of_voice


def _g722(wav: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-i", str(wav), "-ar", "16000", "-ac", "1",
                    "-c:a", "g722", "-f", "g722", str(out)], check=True)


@pytest.fixture(scope="module")
def sounds(tmp_path_factory, speech_files) -> Path:
    """A stand-in for /usr/share/asterisk/sounds: real speech encoded to G.722, 12 prompts a speaker
    (one in a subfolder, as the packages have digits/ and letters/), one empty file."""
    root = tmp_path_factory.mktemp("sounds")
    sources = speech_files["valid"]
    for k, speaker in enumerate(SPEAKERS):
        for j in range(12):
            name = f"digits/{j}.g722" if j == 0 else f"prompt-{j}.g722"
            _g722(sources[(12 * k + j) % len(sources)], root / speaker / name)
    (root / "ru_RU_f_IvrvoiceRU" / "empty.g722").write_bytes(b"")
    _g722(sources[0], root / "fr_CA_f_June" / "silence" / "1.g722")  # the packages' silences: not listed
    return root


def test_test_speakers_are_never_trained_or_validated_on(sounds):
    files = list_voice_files(sounds)
    assert files == list_voice_files(sounds)  # deterministic
    assert not any("/silence/" in f.relpath for f in files)
    by_speaker: dict[str, set[str]] = {}
    for f in files:
        by_speaker.setdefault(f.level, set()).add(f.split)
        assert f.relpath.startswith(f"{f.split}/{f.level}/") and f.relpath.endswith(".wav")
    for speaker, (_, role) in SPEAKERS.items():
        assert by_speaker[speaker] == {"test"} if role == "test" else by_speaker[speaker] <= {"train", "valid"}
    assert split_of_voice("test", "anything.wav") == "test"
    names = [f"p{i}.wav" for i in range(1000)]
    valid = sum(split_of_voice("train", n) == "valid" for n in names)
    assert 60 < valid < 140  # about 1 in 10


def test_prepare_decodes_g722_into_the_corpus_layout(sounds, tmp_path, speech_files):
    out = prepare_voices(tmp_path / "voices", sounds_dir=sounds, progress=False)
    meta = json.loads((out / "corpus.json").read_text())
    assert [s["source"].endswith("empty.g722") for s in meta["skipped"]] == [True]
    test = corpus_files(out, "test")
    assert len(test) == 3 * 12 and all(p.is_file() for p in test)
    assert {p.relative_to(out).parts[1] for p in test} == {s for s, (_, r) in SPEAKERS.items() if r == "test"}
    assert len(corpus_files(out, "train")) + len(corpus_files(out, "valid")) == 2 * 12
    # decoded G.722 is the speech it encoded (lossy, but close): same length, high correlation
    decoded, rate = sf.read(out / "test" / "ru_RU_f_IvrvoiceRU" / "prompt-1.wav")
    original, _ = sf.read(speech_files["valid"][(12 * 2 + 1) % len(speech_files["valid"])])
    assert rate == 16000 and abs(len(decoded) - len(original)) < 64
    n = min(len(decoded), len(original))
    lags = range(-40, 41)
    best = max(np.corrcoef(original[40:n - 40], decoded[40 + lag:n - 40 + lag])[0, 1] for lag in lags)
    assert best > 0.9
    assert prepare_voices(tmp_path / "voices", sounds_dir=sounds, progress=False) == out  # prepared: reused
    with pytest.raises(CorpusError, match="prepared with"):
        prepare_voices(tmp_path / "voices", 8000, sounds_dir=sounds, progress=False)


def test_missing_packages_are_named(tmp_path):
    (tmp_path / "fr_CA_f_June").mkdir()
    with pytest.raises(CorpusError, match="asterisk-core-sounds-ru-g722"):
        list_voice_files(tmp_path)
