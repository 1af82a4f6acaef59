"""The voices corpus (rvqlm/corpora/voices.py): speakers held out whole, G.722 and voice-pack Vorbis decoded,
the hedgewars packs chosen and split, the common layout."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from rvqlm.corpora.folder import CorpusError, corpus_files
from rvqlm.corpora.voices import (HEDGEWARS_PACKAGE, PACK_PREFIX, SPEAKERS, VOICE_PACKS, is_speech_taunt, list_pack_files,
                          list_voice_files, prepare_voices, split_of_voice)

EXCLUDED_PACKS = ("Robot", "Singer")  # heavily processed: never in the corpus
SPOKEN = ("Amazing", "Incoming")  # taunts every fake pack has, besides the non-verbal Ow1 and Laugh


def _ffmpeg_encoder(name: str) -> None:
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed")
    encoders = subprocess.run(["ffmpeg", "-hide_banner", "-encoders"], capture_output=True, text=True).stdout
    if f" {name} " not in encoders:
        pytest.skip(f"this ffmpeg has no {name} encoder")


def _g722(wav: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-i", str(wav), "-ar", "16000", "-ac", "1",
                    "-c:a", "g722", "-f", "g722", str(out)], check=True)


def _ogg(wav: Path, out: Path, rate: int = 44100) -> None:
    """A voice-pack-like clip: Vorbis, stereo, at `rate`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-i", str(wav), "-ar", str(rate), "-ac", "2",
                    "-c:a", "libvorbis", str(out)], check=True)


@pytest.fixture(scope="module")
def sounds(tmp_path_factory, speech_files) -> Path:
    """A stand-in for /usr/share/asterisk/sounds: real speech encoded to G.722, 12 prompts a speaker
    (one in a subfolder, as the packages have digits/ and letters/; one named as a real prompt that
    the hash sends to valid), one empty file."""
    _ffmpeg_encoder("g722")
    root = tmp_path_factory.mktemp("sounds")
    sources = speech_files["valid"]
    for k, speaker in enumerate(SPEAKERS):
        for j in range(12):
            name = "digits/0.g722" if j == 0 else "activated.g722" if j == 11 else f"prompt-{j}.g722"
            _g722(sources[(12 * k + j) % len(sources)], root / speaker / name)
    (root / "ru_RU_f_IvrvoiceRU" / "empty.g722").write_bytes(b"")
    _g722(sources[0], root / "fr_CA_f_June" / "silence" / "1.g722")  # the packages' silences: not listed
    return root


@pytest.fixture(scope="module")
def packs(tmp_path_factory, speech_files) -> Path:
    """A stand-in for hedgewars' Sounds/voices: every pack (the excluded ones too) with two spoken
    taunts and two non-verbal ones (Ow1, Laugh); Default also holds a 0.1 s clip (Drat) and a silent
    one (Oops); Classic/Hello and Default/Hello are the same bytes."""
    _ffmpeg_encoder("libvorbis")
    root = tmp_path_factory.mktemp("voices")
    sources = speech_files["train"]
    for k, pack in enumerate(VOICE_PACKS + EXCLUDED_PACKS):
        for j, stem in enumerate(SPOKEN + ("Ow1", "Laugh")):
            _ogg(sources[(4 * k + j) % len(sources)], root / pack / f"{stem}.ogg", 48000 if k == 0 else 44100)
    tmp = tmp_path_factory.mktemp("clips")
    sf.write(tmp / "short.wav", 0.3 * np.sin(np.arange(1600) * 0.1), 16000)
    sf.write(tmp / "silent.wav", np.zeros(16000), 16000)
    _ogg(tmp / "short.wav", root / "Default" / "Drat.ogg")
    _ogg(tmp / "silent.wav", root / "Default" / "Oops.ogg")
    _ogg(sources[-1], root / "Classic" / "Hello.ogg")
    shutil.copyfile(root / "Classic" / "Hello.ogg", root / "Default" / "Hello.ogg")
    return root


def test_test_speakers_are_never_trained_or_validated_on(sounds, packs):
    """Issue 48: the one man of the asterisk prompts, it-IT Carlo, is a test speaker (the codec's men's
    condition), beside the three women of the foreign-speaker set."""
    assert [s for s, (_, role) in SPEAKERS.items() if role == "test"] == [
        "it_IT_m_Carlo", "ru_RU_f_IvrvoiceRU", "en_US_f_Allison", "es_MX_f_Allison"]
    files = list_voice_files(sounds, packs)
    assert files == list_voice_files(sounds, packs)  # deterministic
    assert not any("/silence/" in f.relpath for f in files)
    by_speaker: dict[str, set[str]] = {}
    for f in files:
        by_speaker.setdefault(f.level, set()).add(f.split)
        assert f.relpath.startswith(f"{f.split}/{f.level}/") and f.relpath.endswith(".wav")
    for speaker, (_, role) in SPEAKERS.items():
        assert by_speaker[speaker] == {"test"} if role == "test" else by_speaker[speaker] <= {"train", "valid"}
    assert all(by_speaker[PACK_PREFIX + p] <= {"train", "valid"} for p in VOICE_PACKS)
    assert split_of_voice("test", "anything.wav") == "test"
    names = [f"p{i}.wav" for i in range(1000)]
    valid = sum(split_of_voice("train", n) == "valid" for n in names)
    assert 60 < valid < 140  # about 1 in 10


def test_asterisk_files_and_paths_are_as_before_the_packs(sounds, packs):
    """The asterisk prompts come first, with the paths (and so the splits) data/voices-16k has had
    since version 2: adding the packs must not move a foreign test speaker's file."""
    asterisk = [f for f in list_voice_files(sounds, packs) if not f.level.startswith(PACK_PREFIX)]
    assert [f.relpath for f in list_voice_files(sounds, packs)][:len(asterisk)] == [f.relpath for f in asterisk]
    expected = []
    for speaker, (_, role) in SPEAKERS.items():
        names = ["activated.wav", "digits/0.wav"] + [f"prompt-{j}.wav" for j in range(1, 11)]
        names += ["empty.wav"] if speaker == "ru_RU_f_IvrvoiceRU" else []
        split = {"test": "test"} if role == "test" else {"activated.wav": "valid"}
        expected += [f"{split.get(n, 'train' if role == 'train' else 'test')}/{speaker}/{n}" for n in sorted(names)]
    assert [f.relpath for f in asterisk] == expected
    # splits of real prompt names as data/voices-16k (version 2) holds them
    assert [split_of_voice("train", n) for n in ("activated.wav", "auth-thankyou.wav", "added.wav",
                                                 "agent-alreadyon.wav")] == ["valid", "valid", "train", "train"]


def test_hedgewars_packs_chosen_and_split_by_pack_and_name(packs):
    files = list_pack_files(packs)
    relpaths = [f.relpath for f in files]
    assert len(set(relpaths)) == len(relpaths)
    assert {f.level for f in files} == {PACK_PREFIX + p for p in VOICE_PACKS}
    assert not set(EXCLUDED_PACKS) & set(VOICE_PACKS)
    assert not any(Path(r).stem in ("Ow1", "Laugh") for r in relpaths)  # non-verbal taunts left out
    assert sum(Path(r).stem == "Hello" for r in relpaths) == 1  # the same bytes in two packs: listed once
    assert f"{split_of_voice('train', 'hedgewars_Classic/Hello.wav')}/hedgewars_Classic/Hello.wav" in relpaths
    for f in files:
        name = f"{f.level}/{f.source.stem}.wav"
        assert f.relpath == f"{split_of_voice('train', name)}/{name}" and f.source.suffix == ".ogg"
    assert [is_speech_taunt(s) for s in ("Ow3", "Jump1", "Ooff2", "PoisonCough", "Ouch", "Firepunch2", "Hello")] \
        == [False, False, False, False, True, True, True]


def test_prepare_decodes_both_sources_into_the_corpus_layout(sounds, packs, tmp_path, speech_files):
    out = prepare_voices(tmp_path / "voices", sounds_dir=sounds, packs_dir=packs, progress=False)
    meta = json.loads((out / "corpus.json").read_text())
    assert sorted(Path(s["source"]).name for s in meta["skipped"]) == ["Drat.ogg", "Oops.ogg", "empty.g722"]
    assert any("too short" in s["reason"] for s in meta["skipped"]) and any("silent" in s["reason"]
                                                                          for s in meta["skipped"])
    test = corpus_files(out, "test")
    assert len(test) == 4 * 12 and all(p.is_file() for p in test)  # three women and it-IT Carlo (version 4)
    assert {p.relative_to(out).parts[1] for p in test} == {s for s, (_, r) in SPEAKERS.items() if r == "test"}
    trained = corpus_files(out, "train") + corpus_files(out, "valid")
    assert len(trained) == 12 + 2 * len(VOICE_PACKS) + 1  # fr-CA June, the packs, + Classic/Hello
    # decoded G.722 is the speech it encoded (lossy, but close): same length, high correlation
    decoded, rate = sf.read(out / "test" / "ru_RU_f_IvrvoiceRU" / "prompt-1.wav")
    original, _ = sf.read(speech_files["valid"][(12 * 2 + 1) % len(speech_files["valid"])])
    assert rate == 16000 and abs(len(decoded) - len(original)) < 64
    n = min(len(decoded), len(original))
    lags = range(-40, 41)
    best = max(np.corrcoef(original[40:n - 40], decoded[40 + lag:n - 40 + lag])[0, 1] for lag in lags)
    assert best > 0.9
    # a 48 kHz stereo Vorbis clip comes back 16 kHz mono, as long as the speech it encoded
    clip = next(p for p in trained if p.parent.name == f"{PACK_PREFIX}{VOICE_PACKS[0]}" and p.stem == SPOKEN[0])
    info, source = sf.info(clip), sf.info(speech_files["train"][0])
    assert (info.samplerate, info.channels) == (16000, 1) and abs(info.duration - source.duration) < 0.05
    assert prepare_voices(tmp_path / "voices", sounds_dir=sounds, packs_dir=packs, progress=False) == out  # reused
    with pytest.raises(CorpusError, match="prepared with"):
        prepare_voices(tmp_path / "voices", 8000, sounds_dir=sounds, packs_dir=packs, progress=False)


def test_missing_packages_are_named(tmp_path, sounds, packs):
    (tmp_path / "fr_CA_f_June").mkdir()
    with pytest.raises(CorpusError, match="asterisk-core-sounds-ru-g722"):
        list_voice_files(tmp_path, packs)
    with pytest.raises(CorpusError, match=HEDGEWARS_PACKAGE) as missing:
        list_voice_files(sounds, tmp_path)
    assert "asterisk" not in str(missing.value).split("(")[0]
