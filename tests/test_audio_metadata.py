"""Audiofolder metadata (metadata.jsonl / metadata.csv) read by `rvqlm tokenize` into the manifest:
every bad case named, tokens never changed or lost by metadata, reruns update metadata in place."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from codec.core.config import CodecConfig
from codec.core.model import Codec
from codec.tokenize.folder import tokenize_folder
from rvqlm.cli import main as cli_main
from rvqlm_core.audio_metadata import MetadataError, read_folder_metadata, read_metadata_file
from rvqlm_core.token_shards import TokenShards, read_errors

TINY = dict(strides=(4, 4, 5, 4), encoder_channels=2, decoder_channels=2, latent_dim=8, n_codebooks=3,
            codebook_size=300)
NAMES = ["a.wav", "b.wav", "sub/c.wav", "sub/d.flac"]


@pytest.fixture(scope="module")
def codec() -> Codec:
    torch.manual_seed(0)
    return Codec(CodecConfig.from_flat(dict(causal=True, **TINY))).eval()


@pytest.fixture(scope="module")
def codec_dir(codec, tmp_path_factory) -> Path:
    return codec.save_pretrained(tmp_path_factory.mktemp("codec") / "tiny")


@pytest.fixture
def audio(tmp_path) -> Path:
    """Four short noise files, two in a sub-folder, one of them FLAC."""
    d = tmp_path / "audio"
    rng = np.random.default_rng(0)
    for i, name in enumerate(NAMES):
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        sf.write(d / name, rng.normal(0, 0.1, 4000 + 1000 * i).astype(np.float32), 16000)
    return d


def _jsonl(path: Path, rows: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")


def _placement(out: Path) -> list[dict]:
    """The manifest lines without their metadata."""
    lines = [json.loads(line) for line in (out / "manifest.jsonl").read_text(encoding="utf-8").split("\n") if line]
    return [{k: v for k, v in obj.items() if k != "metadata"} for obj in lines]


def _tokens_bytes(out: Path) -> dict[str, bytes]:
    files = {"shards.jsonl": (out / "shards.jsonl").read_bytes()}
    files.update({p.name: p.read_bytes() for p in sorted((out / "shards").iterdir())})
    return files


def _folder_bytes(out: Path) -> dict[str, bytes]:
    return {**_tokens_bytes(out), **{n: (out / n).read_bytes() for n in ("manifest.jsonl", "errors.jsonl")}}


def test_jsonl_and_nested_csv_reach_the_manifest_and_tokens_do_not_change(tmp_path, audio, codec):
    plain = tmp_path / "plain"
    assert tokenize_folder(audio, plain, codec, workers=0, progress=False).files_tokenized == 4
    assert all("metadata" not in line for line in (plain / "manifest.jsonl").read_text().splitlines()), \
        "a folder without metadata must keep today's manifest lines"
    _jsonl(audio / "metadata.jsonl", [{"file_name": "a.wav", "text": "Co je to za divnou loď?\u2028",
                                       "speaker": "font_small", "n": 3}])
    (audio / "sub" / "metadata.csv").write_text('file_name,text,speaker\nc.wav,"Ahoj, rybko",font_big\n',
                                                encoding="utf-8")
    out = tmp_path / "with"
    summary = tokenize_folder(audio, out, codec, workers=0, progress=False)
    assert (summary.files_with_metadata, summary.metadata_errors) == (2, [])
    assert summary.metadata_files == ["metadata.jsonl", "sub/metadata.csv"]
    ts = TokenShards.open(out, verify=True)
    meta = {e.path: e.metadata for e in ts.entries}
    assert meta == {"a.wav": {"text": "Co je to za divnou loď?\u2028", "speaker": "font_small", "n": 3},
                    "b.wav": {}, "sub/c.wav": {"text": "Ahoj, rybko", "speaker": "font_big"}, "sub/d.flac": {}}
    assert _tokens_bytes(out) == _tokens_bytes(plain)  # shards and their index: byte for byte
    assert _placement(out) == _placement(plain)
    plain_ts = TokenShards.open(plain)
    assert all(e.metadata == {} for e in plain_ts.entries)
    for e in ts.entries:
        np.testing.assert_array_equal(ts.read(e), plain_ts.read(e.path))


@pytest.mark.parametrize("name,content,message", [
    ("metadata.jsonl", '{"file_name": "a.wav", "text": "x"\n', "line 1: not valid JSON"),
    ("metadata.jsonl", '{"file_name": "a.wav"}\n["b.wav"]\n', "line 2: not a JSON object"),
    ("metadata.jsonl", '{"file_name": "a.wav"}\n\n{"text": "no file"}\n', "line 3: no 'file_name' field"),
    ("metadata.jsonl", '{"file_name": "a.wav", "x": NaN}\n', "line 1: not valid JSON"),
    ("metadata.jsonl", '{"file_name": "a.wav", "x": 1e999}\n', "line 1: inf is not a JSON number"),
    ("metadata.jsonl", '{"file_name": "a.wav", "text": "\\udc80"}\n', "line 1: not UTF-8 text"),
    ("metadata.jsonl", b'{"file_name": "a.wav"}\n{"file_name": "b.wav", "text": "\xe8ern\xfd"}\n',
     "line 2: not UTF-8 text"),
    ("metadata.csv", "path,text\na.wav,x\n", "line 1: no 'file_name' column"),
    ("metadata.csv", "file_name,text,text\na.wav,x,y\n", "line 1: a column name appears twice"),
    ("metadata.csv", "file_name,text\na.wav,x\nb.wav,x,extra\n", "line 3: 3 values for 2 columns"),
    ("metadata.csv", 'file_name,text\na.wav,"x"y\n', "line 2: not valid CSV"),
    ("metadata.csv", "", "empty"),
])
def test_a_metadata_file_that_cannot_be_parsed_is_one_line_and_nothing_is_written(
        tmp_path, audio, codec_dir, capsys, name, content, message):
    path = audio / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    with pytest.raises(MetadataError, match=message):
        read_metadata_file(path)
    out = tmp_path / "tok"
    assert cli_main(["tokenize", str(audio), str(out), "--codec", str(codec_dir), "--workers", "0",
                     "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and message in err
    assert not out.exists()


def test_a_csv_and_a_jsonl_in_one_folder_are_refused(audio):
    _jsonl(audio / "metadata.jsonl", [{"file_name": "a.wav"}])
    (audio / "metadata.csv").write_text("file_name\nb.wav\n")
    with pytest.raises(MetadataError, match="holds both"):
        read_folder_metadata(audio, NAMES)


def test_rows_that_cannot_be_attached_are_counted_errors_and_no_tokens_are_lost(tmp_path, audio, codec_dir, capsys):
    (audio / "notes.txt").write_text("not audio")
    _jsonl(audio / "metadata.jsonl", [
        {"file_name": "a.wav", "text": "one"},
        {"file_name": "gone.wav", "text": "no such file"},
        {"file_name": "notes.txt", "text": "not audio"},
        {"file_name": "../outside.wav"},
        {"file_name": "/abs/a.wav"},
        {"file_name": 7},
        {"file_name": "b.wav", "text": "first"},
        {"file_name": "./b.wav", "text": "first"},  # the same file again, even with the same text
        {"file_name": "sub/c.wav", "text": "root"},
        {"file_name": "sub/d.flac", "text": 5},
    ])
    _jsonl(audio / "sub" / "metadata.jsonl", [{"file_name": "c.wav", "text": "nested"},
                                             {"file_name": "../a.wav", "text": "outside its folder"},
                                             {"file_name": "d.flac", "text": "ok", "speaker": ["x"]}])
    out = tmp_path / "tok"
    rc = cli_main(["tokenize", str(audio), str(out), "--codec", str(codec_dir), "--workers", "0", "--no-progress"])
    assert rc == 1
    captured = capsys.readouterr()
    assert "4 tokenized" in captured.out and "0 failed" in captured.out
    assert "10 metadata row(s) could not be attached" in captured.err
    errors = [e for e in read_errors(out) if e.get("kind") == "metadata"]
    assert len(errors) == len(read_errors(out)) == 10
    reasons = " | ".join(f"{e['path']}: {e['reason']}" for e in errors)
    for expected in ("gone.wav: metadata.jsonl line 2: names 'gone.wav', which is not an audio file",
                     "notes.txt: metadata.jsonl line 3: names 'notes.txt'",
                     "metadata.jsonl line 4: file_name '../outside.wav' points outside",
                     "metadata.jsonl line 5: file_name '/abs/a.wav' is absolute",
                     "metadata.jsonl line 6: file_name must be a non-empty string, got 7",
                     "b.wav: named by 2 metadata rows (metadata.jsonl line 7, metadata.jsonl line 8)",
                     "sub/c.wav: named by 2 metadata rows (metadata.jsonl line 9, sub/metadata.jsonl line 1)",
                     "sub/metadata.jsonl line 2: file_name '../a.wav' points outside",
                     "sub/d.flac: metadata.jsonl line 10: 'text' must be a string, got 5",
                     "sub/d.flac: sub/metadata.jsonl line 3: 'speaker' must be a string, got ['x']"):
        assert expected in reasons
    ts = TokenShards.open(out, verify=True)
    assert {e.path: e.metadata for e in ts.entries} == {"a.wav": {"text": "one"}, "b.wav": {}, "sub/c.wav": {},
                                                        "sub/d.flac": {}}


def test_a_rerun_updates_metadata_without_re_encoding_and_equals_a_fresh_run(tmp_path, audio, codec):
    out = tmp_path / "tok"
    _jsonl(audio / "metadata.jsonl", [{"file_name": "a.wav", "text": "old"}, {"file_name": "b.wav", "text": "b"}])
    tokenize_folder(audio, out, codec, workers=0, progress=False)
    shards_before = _tokens_bytes(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    _jsonl(audio / "metadata.jsonl", [{"file_name": "a.wav", "text": "new"},
                                      {"file_name": "sub/d.flac", "speaker": "font_big"}])
    again = tokenize_folder(audio, out, codec, workers=0, progress=False)
    assert (again.files_tokenized, again.files_skipped, again.metadata_updated) == (0, 4, 3)  # a, b cleared, d
    assert _tokens_bytes(out) == shards_before
    assert {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()} == mtimes
    fresh = tmp_path / "fresh"
    tokenize_folder(audio, fresh, codec, workers=0, progress=False)
    assert _folder_bytes(out) == _folder_bytes(fresh)
    assert TokenShards.open(out).entry("sub/d.flac").metadata == {"speaker": "font_big"}
    assert tokenize_folder(audio, out, codec, workers=0, progress=False).metadata_updated == 0


def test_resuming_a_partial_run_with_metadata_equals_one_run(tmp_path, audio, codec):
    _jsonl(audio / "metadata.jsonl", [{"file_name": n, "text": f"line {i}"} for i, n in enumerate(NAMES)])
    reference = tmp_path / "reference"
    tokenize_folder(audio, reference, codec, workers=0, progress=False, shard_frames=20)
    held = tmp_path / "held"
    shutil.move(audio / "sub", held)  # first run: only the top files (their sub/ rows name missing files)
    out = tmp_path / "tok"
    first = tokenize_folder(audio, out, codec, workers=0, progress=False, shard_frames=20)
    assert first.files_tokenized == 2 and len(first.metadata_errors) == 2
    shutil.move(held, audio / "sub")
    second = tokenize_folder(audio, out, codec, workers=0, progress=False, shard_frames=20)
    assert (second.files_skipped, second.files_tokenized, second.metadata_errors) == (2, 2, [])
    assert _folder_bytes(out) == _folder_bytes(reference)
