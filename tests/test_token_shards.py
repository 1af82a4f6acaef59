"""The token-shard format: round trip, memory-mapped windows, resume, and damage detection."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rvqlm_core.shard_writer import ShardWriter, write_errors, write_token_corpus
from rvqlm_core.token_shards import ShardEntry, TokenShardError, TokenShards, lines_sha256, read_errors, token_dtype

META = {"fingerprint": "f" * 64, "n_codebooks": 4, "codebook_size": 1024, "frame_rate": 50.0,
        "sample_rate": 16000, "codec_config": {"hop_length": 320}}


def _arrays(seed=0, n=7, v=1024, nc=4):
    rng = np.random.default_rng(seed)
    return {f"dir{i % 2}/file{i}.wav": rng.integers(0, v, size=(int(rng.integers(5, 40)), nc)) for i in range(n)}


def test_dtype_is_smallest_unsigned():
    assert token_dtype(256) == np.uint8
    assert token_dtype(257) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


def test_round_trip_over_several_shards(tmp_path):
    arrays = _arrays()
    ts = write_token_corpus(tmp_path / "tok", arrays, META, shard_frames=50)
    assert (ts.n_codebooks, ts.codebook_size, ts.fingerprint) == (4, 1024, "f" * 64)
    assert (ts.frame_rate, ts.sample_rate, ts.codec_config) == (50.0, 16000, {"hop_length": 320})
    assert [e.path for e in ts.entries] == list(arrays)
    assert len(ts.index) > 1, "shard_frames=50 must split 7 files over several shards"
    for e in ts.entries:
        assert isinstance(e, ShardEntry)
        got = ts.read(e)
        assert got.dtype == np.uint16 and got.shape == (e.n_frames, 4)
        np.testing.assert_array_equal(got, arrays[e.path])
        np.testing.assert_array_equal(ts.read(e, start=2, length=3), arrays[e.path][2:5])
        assert e.seconds == pytest.approx(e.n_frames / 50.0)
    assert isinstance(ts.shard(ts.entries[0].shard), np.memmap)
    for path in sorted(p.name for p in (tmp_path / "tok" / "shards").iterdir()):
        arr = np.load(tmp_path / "tok" / "shards" / path, allow_pickle=False)
        assert arr.ndim == 2 and arr.shape[1] == 4
    with pytest.raises(IndexError):
        ts.read(ts.entries[0], start=1, length=ts.entries[0].n_frames)
    TokenShards.open(tmp_path / "tok", verify=True)


def test_files_never_straddle_shards(tmp_path):
    ts = write_token_corpus(tmp_path / "tok", _arrays(n=9), META, shard_frames=30)
    for e in ts.entries:
        assert e.offset + e.n_frames <= ts.shard(e.shard).shape[0]
    assert all(row["n_frames"] >= 30 for row in ts.index[:-1])


def test_writer_resumes_and_refuses_duplicates(tmp_path):
    arrays = _arrays()
    items = list(arrays.items())
    w = ShardWriter(tmp_path / "tok", META, shard_frames=40)
    for path, tok in items[:4]:
        w.add(path, tok, seconds=1.0)
    committed = set(w.done)
    # Simulate a crash: the pending shard is never sealed.
    w2 = ShardWriter(tmp_path / "tok", META, shard_frames=40)
    assert set(w2.done) == committed and committed  # only sealed files survive
    assert not any(p.name.startswith(".") for p in (tmp_path / "tok" / "shards").iterdir())
    with pytest.raises(ValueError, match="already"):
        w2.add(next(iter(committed)), np.zeros((3, 4)), seconds=0.1)
    for path, tok in items:
        if path not in w2.done:
            w2.add(path, tok, seconds=1.0)
    w2.close()
    ts = TokenShards.open(tmp_path / "tok", verify=True)
    assert sorted(e.path for e in ts.entries) == sorted(arrays)
    for e in ts.entries:
        np.testing.assert_array_equal(ts.read(e), arrays[e.path])


def test_streamed_file_and_abort(tmp_path):
    w = ShardWriter(tmp_path / "tok", META)
    w.begin("bad.wav", 10, 1)
    w.write(np.ones((5, 4), np.int64))
    w.abort()
    w.begin("long.wav", 10, 1)
    for k in range(3):
        w.write(np.full((4, 4), k))
    w.end(seconds=0.24)
    with pytest.raises(ValueError, match="0..1023"):
        w.add("x.wav", np.full((2, 4), 1024), seconds=0.1)
    with pytest.raises(ValueError, match=r"\[frames, 4\]"):
        w.add("y.wav", np.zeros((2, 3)), seconds=0.1)
    w.close()
    ts = TokenShards.open(tmp_path / "tok")
    assert [e.path for e in ts.entries] == ["long.wav"]
    np.testing.assert_array_equal(ts.read("long.wav")[:, 0], np.repeat([0, 1, 2], 4))


def test_other_codec_is_refused(tmp_path):
    write_token_corpus(tmp_path / "tok", _arrays(), META)
    with pytest.raises(TokenShardError, match="another codec"):
        ShardWriter(tmp_path / "tok", {**META, "fingerprint": "0" * 64})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(TokenShardError, match="not empty"):
        ShardWriter(tmp_path / "other", META)


def test_trailing_uncommitted_shard_is_ignored_then_dropped(tmp_path):
    """A kill between the shards.jsonl and manifest.jsonl renames leaves one extra index line."""
    arrays = _arrays()
    write_token_corpus(tmp_path / "tok", arrays, META, shard_frames=50)
    root = tmp_path / "tok"
    manifest = (root / "manifest.jsonl").read_text().splitlines(keepends=True)
    last_shard = json.loads(manifest[-1])["shard"]
    kept = [line for line in manifest if json.loads(line)["shard"] != last_shard]
    (root / "manifest.jsonl").write_text("".join(kept))
    ts = TokenShards.open(root)
    assert last_shard not in {e.shard for e in ts.entries}
    w = ShardWriter(root, META, shard_frames=50)
    assert not (root / "shards" / last_shard).exists()
    assert last_shard not in (root / "shards.jsonl").read_text()
    w.close()


def _corrupt_manifest(root, edit):
    lines = (root / "manifest.jsonl").read_text().splitlines()
    lines = edit(lines)
    (root / "manifest.jsonl").write_text("".join(line + "\n" for line in lines))


def _set(line, **kw):
    obj = json.loads(line)
    obj.update(kw)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("edit, message", [
    (lambda ls: [_set(ls[0], n_frames=json.loads(ls[0])["n_frames"] - 1)] + ls[1:], "checksum|overlap|gap|cover"),
    (lambda ls: [_set(ls[0], path="renamed.wav")] + ls[1:], "checksum"),
    (lambda ls: ls[:1] + ls, "twice"),
    (lambda ls: ls[:1] + ls[2:], "checksum|gap|cover"),
    (lambda ls: ls[:-1] + [ls[-1][:-5]], "not valid JSON"),
    (lambda ls: [_set(ls[0], shard="shard-00099.npy")] + ls[1:], "does not list"),
    (lambda ls: [ls[0].replace(":", ": ")] + ls[1:], "canonical"),
    (lambda ls: [_set(ls[0], extra=1)] + ls[1:], "unexpected fields"),
    (lambda ls: [_set(ls[0], metadata=["text"])] + ls[1:], "'metadata' has the wrong type"),
    (lambda ls: [_set(ls[0], metadata={})] + ls[1:], "invalid values"),  # empty metadata is written as none
])
def test_hand_edited_manifest_is_detected(tmp_path, edit, message):
    root = tmp_path / "tok"
    write_token_corpus(root, _arrays(), META, shard_frames=50)
    _corrupt_manifest(root, edit)
    with pytest.raises(TokenShardError, match=message):
        TokenShards.open(root)


def test_cut_off_manifest_is_detected(tmp_path):
    root = tmp_path / "tok"
    write_token_corpus(root, _arrays(), META)
    text = (root / "manifest.jsonl").read_text()
    (root / "manifest.jsonl").write_text(text[:-1])
    with pytest.raises(TokenShardError, match="cut off"):
        TokenShards.open(root)


def test_damaged_shards_are_detected(tmp_path):
    root = tmp_path / "tok"
    write_token_corpus(root, _arrays(), META, shard_frames=50)
    shard = root / "shards" / "shard-00000.npy"
    data = bytearray(shard.read_bytes())

    shard.write_bytes(bytes(data[:-8]))  # truncated
    with pytest.raises(TokenShardError, match="truncated"):
        TokenShards.open(root)

    flipped = bytearray(data)
    flipped[-3] ^= 0x01  # one bit of token data: only the checksum can see it
    shard.write_bytes(bytes(flipped))
    TokenShards.open(root)
    with pytest.raises(TokenShardError, match="sha256"):
        TokenShards.open(root, verify=True)

    arr = np.load(root / "shards" / "shard-00001.npy")
    np.save(root / "shards" / "shard-00001.npy", arr.astype(np.uint32)[:, : 2].copy())
    with pytest.raises(TokenShardError, match="bytes|holds"):
        TokenShards.open(root)

    (root / "shards" / "shard-00001.npy").unlink()
    with pytest.raises(TokenShardError, match="missing"):
        TokenShards.open(root)


def test_codec_json_problems(tmp_path):
    with pytest.raises(TokenShardError, match="not a token folder"):
        TokenShards.open(tmp_path)
    root = tmp_path / "tok"
    write_token_corpus(root, _arrays(), META)
    doc = json.loads((root / "codec.json").read_text())
    (root / "codec.json").write_text(json.dumps({**doc, "dtype": "uint8"}))
    with pytest.raises(TokenShardError, match="dtype"):
        TokenShards.open(root)
    (root / "codec.json").write_text("{broken")
    with pytest.raises(TokenShardError, match="not valid JSON"):
        TokenShards.open(root)


def test_errors_file_round_trip(tmp_path):
    write_token_corpus(tmp_path, {"a.wav": np.zeros((3, 4), int)}, META)
    write_errors(tmp_path, [{"path": "z.wav", "reason": "empty"}, {"path": "b.wav", "reason": "NaN"}])
    assert [r["path"] for r in read_errors(tmp_path)] == ["b.wav", "z.wav"]


OLD_LINE_FIELDS = {"path", "shard", "offset", "n_frames", "seconds", "size", "mtime_ns"}


def test_metadata_round_trip_and_lines_without_it_are_the_old_format(tmp_path):
    arrays = _arrays()
    paths = list(arrays)
    meta = {paths[0]: {"text": "Co je to za divnou loď?\u2028\x85", "speaker": "font_small"},
            paths[3]: {"n": [1, {"a": None}], "x": 0.5}}
    ts = write_token_corpus(tmp_path / "with", arrays, META, shard_frames=50, metadata=meta)
    assert {e.path: e.metadata for e in ts.entries} == {p: meta.get(p, {}) for p in paths}
    assert len(set(ts.entries)) == len(paths)  # entries stay hashable
    plain = tmp_path / "plain"
    write_token_corpus(plain, arrays, META, shard_frames=50)
    raw = (plain / "manifest.jsonl").read_text(encoding="utf-8").split("\n")[:-1]
    assert all(set(json.loads(line)) == OLD_LINE_FIELDS for line in raw)
    # Folders written before metadata existed hashed their raw manifest lines: the same hashes.
    index = [json.loads(line) for line in (plain / "shards.jsonl").read_text().splitlines()]
    for row in index:
        mine = [line for line in raw if json.loads(line)["shard"] == row["shard"]]
        assert lines_sha256(mine) == row["entries_sha256"]
    assert (plain / "shards.jsonl").read_bytes() == (tmp_path / "with" / "shards.jsonl").read_bytes()
    assert all(e.metadata == {} for e in TokenShards.open(plain).entries)


def test_update_metadata_rewrites_only_the_manifest(tmp_path):
    root = tmp_path / "tok"
    arrays = _arrays()
    write_token_corpus(root, arrays, META, shard_frames=50)
    original = (root / "manifest.jsonl").read_bytes()
    untouched = {n: (root / n).read_bytes() for n in ("shards.jsonl", "codec.json", "shards/shard-00000.npy")}
    first, second = list(arrays)[:2]
    w = ShardWriter(root, META, shard_frames=50)
    assert w.update_metadata({first: {"text": "ahoj"}, second: {}}) == [first]
    assert w.update_metadata({first: {"text": "ahoj"}}) == []
    w.close()
    ts = TokenShards.open(root, verify=True)
    assert (ts.entry(first).metadata, ts.entry(second).metadata) == ({"text": "ahoj"}, {})
    assert {n: (root / n).read_bytes() for n in untouched} == untouched
    # A hand edit of a metadata value is not a damaged placement: the folder still opens.
    _corrupt_manifest(root, lambda ls: [line.replace('"ahoj"', '"nazdar"') for line in ls])
    assert TokenShards.open(root).entry(first).metadata == {"text": "nazdar"}
    w = ShardWriter(root, META, shard_frames=50)
    assert w.update_metadata({first: {}}) == [first]
    assert (root / "manifest.jsonl").read_bytes() == original
    w.begin("new.wav", 1, 1)
    with pytest.raises(RuntimeError, match="open or pending"):
        w.update_metadata({first: {"text": "x"}})


@pytest.mark.parametrize("bad", [{"x": float("nan")}, {1: "a"}, {"x": {1, 2}}, ["text"]])
def test_metadata_must_be_a_json_object_of_finite_values(tmp_path, bad):
    w = ShardWriter(tmp_path / "tok", META)
    with pytest.raises(ValueError, match="'a.wav': metadata"):
        w.begin("a.wav", 1, 1, bad)
