"""The built-in corpus: real speech, split by level, test split disjoint from training; its
metadata.jsonl (each file's line and speaker) from the game's dialog scripts."""

import json
from pathlib import Path

import pytest

from rvqlm.corpora.fillets import FILLETS_SCRIPT_DIR, list_source_files, prepare_corpus, split_of_level, \
    write_corpus_metadata
from rvqlm.corpora.folder import SPLITS, corpus_subset
from rvqlm.corpora.dialogs import Dialog, DialogError, parse_dialogs


def test_split_is_by_level_and_disjoint(speech_files, corpus_dir):
    levels = {s: {p.parent.name for p in files} for s, files in speech_files.items()}
    assert levels["train"] and levels["valid"] and levels["test"]
    assert not (levels["train"] & levels["valid"]) and not (levels["train"] & levels["test"])
    assert not (levels["valid"] & levels["test"])
    assert len(speech_files["train"]) > 5 * len(speech_files["test"])


def test_split_rule_is_deterministic():
    assert [split_of_level(i) for i in range(10)].count("train") == 8
    files = list_source_files()
    assert files == list_source_files()


# ---------------------------------------------------------------------------------------------
# dialogs -> metadata.jsonl
# ---------------------------------------------------------------------------------------------

FAKE_LUA = r'''
-- a comment naming dialogId("not-me", "font_big", "x")
--[==[ a long comment
dialogId("nor-me", "font_big", "y") ]==]
dialogId("a-m-1", "font_small", "Say \"hi\".")
dialogStr("Řekni \"ahoj\".")

dialogId('b-v-2', 'font_big',
"C:\\WINDOWS\\CONFIG" .. " is where " ..
'we meet')
dialogStr(
"Když na tomhle počítači běží Word,\n" .. [[ my se
scházíme]] .. " v C:\\WINDOWS \x41\66\u{10D}\z
           konec")

dialogId("c-x", "", "")
dialogId("d-m", "font_small", [==[long ]] English]==])
dialogStr("")
'''


def test_dialog_scripts_are_parsed_with_lua_strings_escapes_and_comments():
    dialogs = parse_dialogs(FAKE_LUA, "fake.lua")
    assert dialogs == [
        Dialog("a-m-1", "font_small", 'Say "hi".', 'Řekni "ahoj".'),
        Dialog("b-v-2", "font_big", "C:\\WINDOWS\\CONFIG is where we meet",
               "Když na tomhle počítači běží Word,\n my se\nscházíme v C:\\WINDOWS ABčkonec"),
        Dialog("c-x", "", "", None),  # no dialogStr follows
        Dialog("d-m", "font_small", "long ]] English", ""),
    ]


@pytest.mark.parametrize("lua, message", [
    ('dialogId("a", "font_small", "x")\ndialogStr("unfinished)\n', "fake.lua line 2: unfinished string"),
    ('dialogId("a", "font_small", "x")\n\ndialogStr(text)\n', "fake.lua line 3: dialogStr argument 1 is not a string"),
    ('dialogStr("orphan")\n', "line 1: dialogStr without a dialogId"),
    ('dialogId("a", "font_small")\n', "line 1: dialogId takes 3 strings"),
    ('dialogId("a", "f", "x")\ndialogStr("\\q")\n', "line 2: invalid escape sequence \\\\q"),
    ('dialogId("a", "f", "x")\ndialogStr("\\xff")\n', "line 2: a string's escapes make bytes that are not UTF-8"),
    ('dialogId("a", "f", "x")\ndialogStr("x" "y")\n', r"line 2: dialogStr\(...\) is not closed"),
    ('--[[ never closed\ndialogId("a", "f", "x")\n', "line 1: a long string or comment is never closed"),
])
def test_a_bad_dialog_script_is_one_error_naming_file_and_line(lua, message):
    with pytest.raises(DialogError, match=message):
        parse_dialogs(lua, "fake.lua")


def _fake_corpus(root: Path, levels: dict[str, list[str]]) -> Path:
    """A corpus.json naming files (no audio at all: metadata must not need any)."""
    files = [{"path": f"train/{level}/{name}.wav", "split": "train", "level": level, "source": "-", "seconds": 1.0}
             for level, names in levels.items() for name in names]
    root.mkdir(parents=True)
    (root / "corpus.json").write_text(json.dumps({"settings": {}, "files": files}))
    return root


def test_metadata_jsonl_rows_in_the_audiofolder_convention(tmp_path):
    scripts = tmp_path / "script"
    (scripts / "lvl").mkdir(parents=True)
    (scripts / "lvl" / "dialogs_cs.lua").write_text(FAKE_LUA, encoding="utf-8")
    (scripts / "lvl" / "brief_dialogs_cs.lua").write_text('dialogId("e", "", "Hello")\ndialogStr(" Ahoj ")\n')
    (scripts / "lvl" / "dialogs_en.lua").write_text('dialogId("a-m-1", "font_big", "other language")\n')
    corpus = _fake_corpus(tmp_path / "corpus", {"lvl": ["a-m-1", "b-v-2", "c-x", "d-m", "e", "f"]})
    report = write_corpus_metadata(corpus, scripts)
    assert not (corpus / "metadata.jsonl").exists()  # one per split folder, where audiofolder looks
    rows = [json.loads(line) for line in (corpus / "train" / "metadata.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == [
        {"file_name": "lvl/a-m-1.wav", "text": 'Řekni "ahoj".', "text_en": 'Say "hi".', "speaker": "font_small"},
        {"file_name": "lvl/b-v-2.wav",
         "text": "Když na tomhle počítači běží Word,\n my se\nscházíme v C:\\WINDOWS ABčkonec",
         "text_en": "C:\\WINDOWS\\CONFIG is where we meet", "speaker": "font_big"},
        {"file_name": "lvl/c-x.wav"},  # no Czech line: the file alone
        {"file_name": "lvl/d-m.wav"},
        {"file_name": "lvl/e.wav", "text": "Ahoj", "text_en": "Hello"},  # no font: no speaker
        {"file_name": "lvl/f.wav"},
    ]
    assert (report.rows, report.files, dict(report.speakers)) == (3, 6, {"font_small": 1, "font_big": 1, "": 1})
    assert report.no_dialog == ["train/lvl/f.wav"]
    assert report.no_text == ["train/lvl/c-x.wav", "train/lvl/d-m.wav"]
    lines = report.lines()
    assert "3 of 6 files have their line" in lines[0]
    assert "  lvl: f" in lines and "  lvl: c-x, d-m" in lines
    before = (corpus / "train" / "metadata.jsonl").stat().st_mtime_ns
    write_corpus_metadata(corpus, scripts)
    assert (corpus / "train" / "metadata.jsonl").stat().st_mtime_ns == before  # same content: not rewritten

    missing = write_corpus_metadata(_fake_corpus(tmp_path / "c2", {"lvl": ["a-m-1"]}), tmp_path / "nowhere")
    assert "not installed" in missing.lines()[0] and not list((tmp_path / "c2").rglob("metadata.jsonl"))


def test_a_prepared_corpus_gains_metadata_without_decoding_audio(tmp_path, monkeypatch, capsys):
    from rvqlm.cli import main as cli_main

    out = tmp_path / "corpus"
    assert cli_main(["corpus", "prepare", "fillets", "--out", str(out), "--max-files-per-split", "2"]) == 0
    assert "files have their line" in capsys.readouterr().out
    for split in SPLITS:
        (out / split / "metadata.jsonl").unlink()  # as a corpus prepared before metadata existed
    wavs = {p: p.stat().st_mtime_ns for p in out.rglob("*.wav")}

    def no_audio(*args, **kwargs):
        raise AssertionError("audio was decoded or written")

    monkeypatch.setattr("rvqlm.corpora.folder.load_audio", no_audio)
    monkeypatch.setattr("rvqlm.corpora.folder.save_audio", no_audio)
    prepare_corpus(out, 16000, max_files_per_split=2, progress=False)
    rows = {split: [json.loads(line) for line in (out / split / "metadata.jsonl").read_text("utf-8").splitlines()]
            for split in SPLITS}
    assert {f"{s}/{r['file_name']}" for s in SPLITS for r in rows[s]} == {p.relative_to(out).as_posix() for p in wavs}
    assert sum("text" in r for s in SPLITS for r in rows[s]) >= 4
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.wav")} == wavs
    sub = corpus_subset(out, tmp_path / "sub", 1)
    for split in SPLITS:
        sub_rows = [json.loads(line) for line in (sub / split / "metadata.jsonl").read_text("utf-8").splitlines()]
        assert sub_rows == [r for r in rows[split] if (sub / split / r["file_name"]).exists()] and len(sub_rows) == 1


@pytest.mark.skipif(not FILLETS_SCRIPT_DIR.is_dir(), reason="fillets-ng-data (the dialog scripts) not installed")
def test_the_real_dialogs_give_almost_every_corpus_file_its_line(corpus_dir, tmp_path):
    """Measured on Debian's fillets-ng-data 1.0.1: 1,725 of the 1,782 Czech voice files have a line
    with Czech text; 3 (fdto) have none, 54 (the ending's and gods' numbers) an empty one."""
    copy = tmp_path / "corpus"
    copy.mkdir()
    (copy / "corpus.json").write_bytes((corpus_dir / "corpus.json").read_bytes())
    report = write_corpus_metadata(copy, FILLETS_SCRIPT_DIR)
    assert report.files == 1782
    assert (report.rows, len(report.no_dialog), len(report.no_text)) == (1725, 3, 54)
    assert (report.speakers["font_small"], report.speakers["font_big"]) == (730, 691)
    assert report.speakers[""] == 0 and len(report.speakers) == 26
