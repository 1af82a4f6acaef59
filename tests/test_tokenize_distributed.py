"""`rvqlm tokenize` under torchrun: ranks tokenize shares into parts, rank 0 merges them into one folder.

The merged folder must equal a single-process run file by file (tokens bit for bit, every manifest
field but where the tokens lie, errors.jsonl byte for byte), also after a rank is SIGKILLed and the
command rerun, after a change of the rank count, and with more ranks than files. Two CPU ranks over
gloo, a tiny random codec (as tests/test_tokenize.py), real speech of the built-in corpus.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from codec.tokenize.distributed import Launch, owner, tokenize, tokenize_share
from codec.tokenize.folder import (TokenizeSettings, TokenizeSummary, codec_meta, list_audio_files, read_metadata,
                                   tokenize_folder)
from rvqlm_core.folder_lock import LOCK_FILE, folder_lock
from rvqlm_core.shard_writer import ShardWriter, write_token_corpus
from rvqlm_core.token_parts import check_distributed_folder, claim_distributed_folder, merge_parts, part_name
from rvqlm_core.token_shards import TokenShardError, TokenShards
from test_tokenize import _tiny_codec

REPO = Path(__file__).resolve().parents[1]
SETTINGS = dict(workers=0, batch_seconds=4.0, shard_frames=150)
CLI_FLAGS = ["--workers", "0", "--batch-seconds", "4", "--shard-frames", "150", "--threads", "1", "--device", "cpu",
             "--no-progress"]


@pytest.fixture(scope="module")
def codec():
    return _tiny_codec()


@pytest.fixture(scope="module")
def codec_dir(codec, tmp_path_factory) -> Path:
    return codec.save_pretrained(tmp_path_factory.mktemp("codec") / "tiny")


@pytest.fixture(scope="module")
def audio(tmp_path_factory, speech_files) -> Path:
    """14 speech files in two sub-folders, a file that is not audio, and metadata with a row that
    names no file: the run has a file error and a metadata error, like real corpora."""
    d = tmp_path_factory.mktemp("audio") / "speech"
    for i, f in enumerate(speech_files["valid"][:14]):
        dest = d / f"part{i % 2}" / f"{i:02d}-{f.name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)
    (d / "part0" / "broken.wav").write_text("not audio\n" * 40)
    rows = [{"file_name": f"part{i % 2}/{i:02d}-{f.name}", "text": f"line {i}", "speaker": f"s{i % 3}"}
            for i, f in enumerate(speech_files["valid"][:14]) if i % 4 != 3]
    rows.append({"file_name": "part1/missing.wav", "text": "no such file"})
    (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture(scope="module")
def reference(audio, codec, tmp_path_factory) -> Path:
    """The single-process run."""
    out = tmp_path_factory.mktemp("reference") / "tok"
    summary = tokenize_folder(audio, out, codec, progress=False, **SETTINGS)
    assert summary.files_tokenized == 14 and len(summary.errors) == 1 and len(summary.metadata_errors) == 1
    return out


def assert_same_files(reference: Path, out: Path) -> None:
    """Every file's tokens and manifest fields (all but shard and offset) equal; errors.jsonl and
    codec.json byte for byte; OUT passes every check TokenShards has."""
    ref, got = TokenShards.open(reference, verify=True), TokenShards.open(out, verify=True)
    assert sorted(e.path for e in got.entries) == sorted(e.path for e in ref.entries)
    for e in ref.entries:
        g = got.entry(e.path)
        assert dataclasses.replace(g, shard="", offset=0) == dataclasses.replace(e, shard="", offset=0), e.path
        a, b = np.asarray(ref.read(e)), np.asarray(got.read(g))
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{e.path}: tokens differ"
    for name in ("errors.jsonl", "codec.json"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def _torchrun(ranks: int, audio: Path, out: Path, codec_dir: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
            "-m", "rvqlm", "tokenize", str(audio), str(out), "--codec", str(codec_dir), *CLI_FLAGS]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)


def _part_summary(out: Path, rank: int, world: int) -> list[str]:
    return [e.path for e in TokenShards.open(out / "parts" / part_name(rank, world)).entries]


# ---------------------------------------------------------------------------------------------
# the share, the launch
# ---------------------------------------------------------------------------------------------

def test_the_share_is_a_hash_of_the_path_alone():
    paths = [f"dir{i % 7}/file{i:04d}.flac" for i in range(2000)]
    before = {p: owner(p, 4) for p in paths}
    assert all(owner(p, 4) == r for p, r in before.items())  # deterministic
    counts = np.bincount(list(before.values()), minlength=4)
    assert counts.min() > 400, f"an uneven share: {counts}"
    assert {owner(p, 1) for p in paths} == {0}


def test_launch_reads_torchrun_variables_and_picks_the_local_device():
    launch = Launch.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (launch.rank, launch.world, launch.local_rank, launch.local_world) == (3, 4, 1, 2)
    assert str(launch.device("cuda")) == "cuda:1" and str(launch.device("cpu")) == "cpu"
    assert Launch.from_env({}) == Launch()
    with pytest.raises(ValueError, match="RANK=4 WORLD_SIZE=4"):
        Launch.from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        Launch.from_env({"WORLD_SIZE": "two"})


# ---------------------------------------------------------------------------------------------
# several processes
# ---------------------------------------------------------------------------------------------

def test_two_ranks_under_torchrun_equal_one_process(tmp_path, audio, codec, codec_dir, reference):
    out = tmp_path / "tok"
    done = _run(_torchrun(2, audio, out, codec_dir))
    assert done.returncode == 1, done.stderr  # 1: a file and a metadata row failed, as in one process
    assert "files: 15 found, 14 tokenized, 0 already done, 1 failed" in done.stdout
    assert_same_files(reference, out)
    shares = [_part_summary(out, r, 2) for r in (0, 1)]
    assert all(shares) and sorted(shares[0] + shares[1]) == sorted(e.path for e in TokenShards.open(out).entries)
    assert all(owner(p, 2) == r for r in (0, 1) for p in shares[r])
    assert {p.name for p in (out / "shards").iterdir()} == {r["shard"] for r in TokenShards.open(out).index}
    # A rerun (here by one process) skips every file and leaves the merged folder as it was.
    before = {n: (out / n).read_bytes() for n in ("manifest.jsonl", "shards.jsonl", "errors.jsonl")}
    again = tokenize(audio, out, codec, TokenizeSettings(progress=False, **SETTINGS), Launch())
    assert (again.files_skipped, again.files_tokenized) == (14, 0)
    assert before == {n: (out / n).read_bytes() for n in before}


def _pid_of_rank(marker: str, rank: int) -> int | None:
    """The pid of the torchrun worker with RANK=rank whose command line names `marker`."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker.encode() not in (d / "cmdline").read_bytes():
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(d.name)
    return None


def _entries(folder: Path) -> int:
    try:
        return len((folder / "manifest.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


def test_a_rank_killed_mid_run_then_rerun_equals_one_process(tmp_path, audio, codec_dir, reference):
    out = tmp_path / "tok"
    part1 = out / "parts" / part_name(1, 2)
    proc = subprocess.Popen(_torchrun(2, audio, out, codec_dir), cwd=REPO, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid, killed = None, False
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not killed:
            pid = pid or _pid_of_rank(str(out), 1)
            if pid is not None and _entries(part1) >= 2:
                os.kill(pid, signal.SIGKILL)
                killed = True
            time.sleep(0.002)
        assert proc.wait(timeout=120) != 0  # torchrun stops the other rank and fails
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed, "rank 1 finished before it could be killed"
    share = [f.rel for f in list_audio_files(audio, out) if owner(f.rel, 2) == 1 and f.rel != "part0/broken.wav"]
    partial = TokenShards.open(part1, verify=True)  # a killed rank leaves a readable part
    assert 2 <= len(partial.entries) < len(share), "killed after its last file"
    assert not (out / "manifest.jsonl").exists()  # no merge without every rank

    done = _run(_torchrun(2, audio, out, codec_dir))
    assert done.returncode == 1, done.stderr
    skipped = int(done.stdout.split(" already done")[0].rsplit(", ", 1)[1])
    assert skipped >= len(partial.entries), done.stdout
    assert_same_files(reference, out)
    assert not [p for p in out.rglob(".*") if p.name != LOCK_FILE], "temporaries left behind"


def test_more_ranks_than_files_finishes_cleanly(tmp_path, audio, codec_dir):
    src = tmp_path / "one"
    src.mkdir()
    name = next(p.name for p in sorted((audio / "part1").iterdir()))
    shutil.copy(audio / "part1" / name, src / name)
    out = tmp_path / "tok"
    done = _run(_torchrun(2, src, out, codec_dir))
    assert done.returncode == 0, done.stderr
    assert "files: 1 found, 1 tokenized" in done.stdout
    idle = 1 - owner(name, 2)
    assert _part_summary(out, idle, 2) == [] and _part_summary(out, 1 - idle, 2) == [name]
    assert [e.path for e in TokenShards.open(out, verify=True).entries] == [name]


def test_a_launch_into_a_folder_another_run_is_writing_is_refused_on_every_rank(tmp_path, audio, codec_dir):
    """Rank 0 finds the folder's lock held (here as another run would hold it) and every rank ends
    with the same one line before anything is written."""
    out = tmp_path / "tok"
    with folder_lock(out):
        done = _run(_torchrun(2, audio, out, codec_dir))
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    assert done.returncode != 0
    refusals = [line for line in done.stderr.splitlines() if line.startswith("rvqlm tokenize: error:")]
    assert len(refusals) == 2 and all(f"{out} is being written by another run" in r for r in refusals), done.stderr


# ---------------------------------------------------------------------------------------------
# ranks simulated in one process: a change of rank count, refusals, the merge
# ---------------------------------------------------------------------------------------------

def _share(audio: Path, out: Path, codec, rank: int, world: int) -> TokenizeSummary:
    files = list_audio_files(audio, out)
    metadata = read_metadata(audio, files, out, TokenizeSummary())
    return tokenize_share(out, files, codec, metadata, TokenizeSettings(progress=False, **SETTINGS), rank, world)


def test_another_rank_count_continues_the_folder(tmp_path, audio, codec, reference):
    """Three ranks, of which rank 2 died before writing anything; then one process finishes the job."""
    out = tmp_path / "tok"
    claim_distributed_folder(out, codec_meta(codec))
    done = {r: _share(audio, out, codec, r, 3).files_tokenized for r in (0, 1)}
    assert all(done.values())
    summary = tokenize(audio, out, codec, TokenizeSettings(progress=False, **SETTINGS), Launch())
    assert summary.files_skipped == sum(done.values()) and summary.files_tokenized == 14 - sum(done.values())
    assert all(owner(p, 3) == 2 for p in _part_summary(out, 0, 1))  # only rank 2's share was left
    assert_same_files(reference, out)


def test_a_metadata_edit_reaches_the_merged_manifest_without_re_encoding(tmp_path, audio, codec):
    src = tmp_path / "audio"
    shutil.copytree(audio, src)
    out = tmp_path / "tok"
    claim_distributed_folder(out, codec_meta(codec))
    for rank in (0, 1):
        _share(src, out, codec, rank, 2)
    tokenize(src, out, codec, TokenizeSettings(progress=False, **SETTINGS), Launch())  # merges
    shards_before = (out / "shards.jsonl").read_bytes()
    rows = [json.loads(line) for line in (src / "metadata.jsonl").read_text().splitlines()]
    for row in rows:
        row["speaker"] = "narrator"
    (src / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = tokenize(src, out, codec, TokenizeSettings(progress=False, **SETTINGS), Launch())
    assert (again.files_tokenized, again.files_skipped) == (0, 14)
    assert (out / "shards.jsonl").read_bytes() == shards_before
    fresh = tmp_path / "fresh"
    tokenize_folder(src, fresh, codec, progress=False, **SETTINGS)
    assert_same_files(fresh, out)
    assert {e.metadata["speaker"] for e in TokenShards.open(out).entries if e.metadata} == {"narrator"}


def test_refusals_leave_the_folder_as_it_was(tmp_path, audio, codec, reference):
    src = tmp_path / "two"
    shutil.copytree(audio / "part1", src, ignore=lambda d, names: sorted(names)[2:])
    out = tmp_path / "tok"
    claim_distributed_folder(out, codec_meta(codec))
    assert _share(src, out, codec, 0, 1).files_tokenized == 2
    merge_parts(out)
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    other = _tiny_codec(seed=1)
    with pytest.raises(TokenShardError, match="another codec"):
        tokenize(src, out, other, TokenizeSettings(progress=False, **SETTINGS), Launch())
    with pytest.raises(TokenShardError, match="tokenized by several processes"):
        tokenize_folder(src, out, codec, progress=False, **SETTINGS)  # a plain writer into a merged folder
    with pytest.raises(TokenShardError, match="tokenized by a single process"):
        check_distributed_folder(reference, codec_meta(codec))  # what every rank checks first
    assert before == sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())


META = {"fingerprint": "f" * 64, "n_codebooks": 2, "codebook_size": 100, "frame_rate": 50.0,
        "sample_rate": 16000, "codec_config": {}}


def _fake_parts(out: Path, files: dict[int, list[str]], world: int = 2) -> dict[str, np.ndarray]:
    """Parts holding random tokens for the given files per rank (3 frames of shard each)."""
    claim_distributed_folder(out, META)
    rng = np.random.default_rng(len(files))
    arrays = {}
    for rank, paths in files.items():
        writer = ShardWriter(out / "parts" / part_name(rank, world), META, shard_frames=3)
        for p in paths:
            arrays[p] = rng.integers(0, 100, (int(rng.integers(2, 5)), 2))
            writer.add(p, arrays[p], seconds=len(arrays[p]) / 50)
        writer.close()
    return arrays


def test_a_merge_keeps_what_the_folder_names_and_links_the_shards(tmp_path):
    out = tmp_path / "tok"
    arrays = _fake_parts(out, {0: ["a.wav", "b.wav"], 1: ["c.wav"]})
    merge_parts(out, metadata={"c.wav": {"speaker": "x"}}, errors=[{"path": "z.wav", "reason": "bad"}])
    first = (out / "shards.jsonl").read_text().splitlines()
    ts = TokenShards.open(out, verify=True)
    assert ts.entry("c.wav").metadata == {"speaker": "x"} and ts.entry("a.wav").metadata == {}
    for row in ts.index:  # hard links, not copies
        e = next(e for e in ts.entries if e.shard == row["shard"])
        part = out / "parts" / part_name(0 if e.path != "c.wav" else 1, 2)
        src = part / "shards" / TokenShards.open(part).entry(e.path).shard
        assert os.path.samefile(out / "shards" / row["shard"], src)
    assert json.loads((out / "errors.jsonl").read_text()) == {"path": "z.wav", "reason": "bad"}
    # Rank 0 gains a file: the shards OUT named keep their names, the new one comes last.
    writer = ShardWriter(out / "parts" / part_name(0, 2), META, shard_frames=3)
    writer.add("d.wav", np.ones((4, 2), int), seconds=0.08)
    writer.close()
    merge_parts(out)
    second = (out / "shards.jsonl").read_text().splitlines()
    assert second[: len(first)] == first and len(second) == len(first) + 1
    ts = TokenShards.open(out, verify=True)
    assert ts.entry("d.wav").shard == ts.index[-1]["shard"]
    for path, tokens in {**arrays, "d.wav": np.ones((4, 2), int)}.items():
        np.testing.assert_array_equal(ts.read(path), tokens)
    # A part deleted by hand: the merge renumbers what is left, and the folder is whole again.
    shutil.rmtree(out / "parts" / part_name(0, 2))
    merge_parts(out)
    assert [e.path for e in TokenShards.open(out, verify=True).entries] == ["c.wav"]
    assert [p.name for p in (out / "shards").iterdir()] == ["shard-00000.npy"]


def test_a_file_in_two_parts_is_refused(tmp_path):
    out = tmp_path / "tok"
    _fake_parts(out, {0: ["a.wav"], 1: ["a.wav", "b.wav"]})
    with pytest.raises(TokenShardError, match="'a.wav' is in two parts"):
        merge_parts(out)
    assert not (out / "manifest.jsonl").exists()


def test_a_folder_of_one_process_and_other_things_are_refused(tmp_path):
    plain = tmp_path / "plain"
    write_token_corpus(plain, {"a.wav": np.zeros((3, 2), int)}, META)
    with pytest.raises(TokenShardError, match="tokenized by a single process"):
        claim_distributed_folder(plain, META)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    with pytest.raises(TokenShardError, match="not empty and is not a token folder"):
        claim_distributed_folder(junk, META)
    (tmp_path / "new" / "parts" / "stray").mkdir(parents=True)
    (tmp_path / "new" / "codec.json").write_text(json.dumps(dict(META, format="rvqlm-token-shards", version=1,
                                                                 dtype="uint8")))
    with pytest.raises(TokenShardError, match="'stray', which is not a part folder"):
        merge_parts(tmp_path / "new")


def test_a_kill_while_folders_are_created_leaves_ones_that_continue(tmp_path):
    """A temporary of codec.json's atomic write, or codec.json without parts/, is what a kill during
    the claim leaves: the rerun completes the folder instead of refusing it."""
    out = tmp_path / "tok"
    out.mkdir()
    (out / ".codec.json.tmp-dead.json").write_text("{")
    claim_distributed_folder(out, META)
    (out / "parts").rmdir()
    claim_distributed_folder(out, META)
    part = out / "parts" / part_name(0, 1)
    part.mkdir()
    (part / ".codec.json.tmp-dead.json").write_text("{")
    writer = ShardWriter(part, META)
    writer.add("a.wav", np.ones((3, 2), int), seconds=0.06)
    writer.close()
    merge_parts(out)
    assert [e.path for e in TokenShards.open(out, verify=True).entries] == ["a.wav"]
    assert not list(out.rglob(".*"))
