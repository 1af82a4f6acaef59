"""`rvqlm tokenize`: exact chunked tokens, bad files, kill -9 + resume, codec mixing refused.

A tiny random codec (saved with save_pretrained) and real speech from the built-in corpus.
"""

from __future__ import annotations

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
import soundfile as sf
import torch

from codec.core.audio import iter_audio_blocks, load_audio
from codec.core.config import CodecConfig
from codec.core.model import Codec
from codec.tokenize.audio_folder import find_audio_files
from codec.tokenize.folder import tokenize_folder
from rvqlm.cli import main as cli_main
from rvqlm_core.token_shards import TokenShards, read_errors

REPO = Path(__file__).resolve().parents[1]
TINY = dict(strides=(4, 4, 5, 4), encoder_channels=2, decoder_channels=2, latent_dim=8, n_codebooks=3,
            codebook_size=300)


def _tiny_codec(causal=True, seed=0) -> Codec:
    torch.manual_seed(seed)
    return Codec(CodecConfig.from_flat(dict(causal=causal, **TINY))).eval()


@pytest.fixture(scope="module")
def codec_dir(tmp_path_factory) -> Path:
    return _tiny_codec().save_pretrained(tmp_path_factory.mktemp("codec") / "tiny")


@pytest.fixture(scope="module")
def audio_dir(tmp_path_factory, speech_files) -> Path:
    """24 real speech files in two sub-folders."""
    d = tmp_path_factory.mktemp("audio") / "speech"
    for i, f in enumerate(speech_files["valid"][:24]):
        dest = d / f"part{i % 2}" / f"{i:02d}-{f.name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)
    return d


def _whole_file_codes(codec, path, block_seconds) -> np.ndarray:
    """The reference: encode the file's samples (as the tokenizer reads them) in one call. [T, N_c]."""
    wav = torch.cat(list(iter_audio_blocks(path, codec.sample_rate, codec.channels, block_seconds)), dim=1)
    return codec.encode(wav[None])[0].T.numpy()


def _folder_bytes(root: Path) -> dict[str, bytes]:
    names = ["manifest.jsonl", "shards.jsonl", "codec.json", "errors.jsonl"]
    out = {n: (root / n).read_bytes() for n in names}
    out.update({f"shards/{p.name}": p.read_bytes() for p in sorted((root / "shards").iterdir())})
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_and_batched_tokens_equal_whole_file_encoding(tmp_path, speech_files, real_ogg, causal, monkeypatch):
    """Bit-exact: every frame is computed from a window holding its whole receptive field."""
    import codec.tokenize.audio_folder as tk

    monkeypatch.setattr(tk, "STREAM_BLOCK_SECONDS", 1.5)  # so a 4 s file takes the streaming path
    codec = _tiny_codec(causal)
    src = tmp_path / "audio"
    src.mkdir()
    for f in speech_files["valid"][:4]:
        shutil.copy(f, src / f.name)
    shutil.copy(real_ogg, src / "resampled.ogg")  # 22.05 kHz: resampled on the way in
    long_wav = torch.cat([load_audio(f, 16000) for f in speech_files["valid"][4:8]], dim=1)[:, : int(16000 * 4.3)]
    assert long_wav.shape[1] > 2 * tk.STREAM_BLOCK_SECONDS * 16000
    sf.write(src / "long.wav", long_wav[0].numpy(), 16000, subtype="FLOAT")

    runs = {}
    for chunk, batch in ((0.3, 1.0), (2.0, 30.0)):
        out = tmp_path / f"tok-{chunk}"
        summary = tokenize_folder(src, out, codec, workers=0, chunk_seconds=chunk, batch_seconds=batch,
                                  progress=False)
        assert summary.errors == [] and summary.files_tokenized == 6
        runs[chunk] = out
        ts = TokenShards.open(out, verify=True)
        for e in ts.entries:
            ref = _whole_file_codes(codec, src / e.path, tk.STREAM_BLOCK_SECONDS)
            np.testing.assert_array_equal(np.asarray(ts.read(e)), ref, err_msg=f"{e.path}, chunk {chunk}")
    # Tokens, hence shards and manifest, do not depend on the chunk or batch size.
    assert _folder_bytes(runs[0.3]) == _folder_bytes(runs[2.0])


def test_bad_files_are_listed_and_the_run_goes_on(tmp_path, speech_files, codec_dir, capsys):
    src = tmp_path / "audio"
    src.mkdir()
    good = speech_files["valid"][:3]
    for f in good:
        shutil.copy(f, src / f.name)
    (src / "empty.wav").write_bytes(b"")
    (src / "text.wav").write_text("this is not audio\n" * 50)
    (src / "notes.txt").write_text("ignored: not an audio suffix")
    data = good[0].read_bytes()
    (src / "truncated.wav").write_bytes(data[: len(data) // 2])
    sf.write(src / "zero.wav", np.zeros((0, 1), np.float32), 16000)
    nan = np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)
    nan[500] = np.nan
    sf.write(src / "nan.wav", nan, 16000, subtype="FLOAT")
    sf.write(src / "long.wav", np.zeros(16000 * 5, np.float32), 16000)

    out = tmp_path / "tok"
    rc = cli_main(["tokenize", str(src), str(out), "--codec", str(codec_dir), "--workers", "0",
                   "--max-file-seconds", "4.5", "--no-progress"])
    assert rc == 1
    captured = capsys.readouterr()
    assert "3 tokenized" in captured.out and "6 failed" in captured.out
    errors = {e["path"]: e["reason"] for e in read_errors(out)}
    assert set(errors) == {"empty.wav", "text.wav", "truncated.wav", "zero.wav", "nan.wav", "long.wav"}
    assert "empty" in errors["empty.wav"]
    assert "not a readable audio file" in errors["text.wav"]
    assert "truncated" in errors["truncated.wav"]
    assert "zero-length" in errors["zero.wav"] or "no audio" in errors["zero.wav"]
    assert "NaN" in errors["nan.wav"]
    assert "too long" in errors["long.wav"]
    assert "truncated.wav" in captured.err
    ts = TokenShards.open(out, verify=True)
    assert sorted(e.path for e in ts.entries) == sorted(f.name for f in good)

    # Rerun: the good files are skipped, the bad ones retried and listed again.
    (src / "empty.wav").unlink()
    rc = cli_main(["tokenize", str(src), str(out), "--codec", str(codec_dir), "--workers", "0",
                   "--max-file-seconds", "4.5", "--no-progress"])
    assert rc == 1
    assert "3 already done" in capsys.readouterr().out
    assert len(read_errors(out)) == 5


def test_changed_file_is_reported_not_mixed(tmp_path, speech_files, codec_dir, capsys):
    src = tmp_path / "audio"
    src.mkdir()
    for f in speech_files["valid"][:2]:
        shutil.copy(f, src / f.name)
    out = tmp_path / "tok"
    assert cli_main(["tokenize", str(src), str(out), "--codec", str(codec_dir), "--no-progress", "--workers", "0"]) == 0
    victim = src / speech_files["valid"][0].name
    victim.write_bytes(speech_files["valid"][2].read_bytes())
    assert cli_main(["tokenize", str(src), str(out), "--codec", str(codec_dir), "--no-progress", "--workers", "0"]) == 1
    assert "changed since it was tokenized" in read_errors(out)[0]["reason"]
    capsys.readouterr()


def test_a_different_codec_is_refused(tmp_path, audio_dir, codec_dir, capsys):
    out = tmp_path / "tok"
    src = tmp_path / "few"
    shutil.copytree(audio_dir / "part0", src)
    assert cli_main(["tokenize", str(src), str(out), "--codec", str(codec_dir), "--no-progress", "--workers", "0"]) == 0
    other = _tiny_codec(seed=1).save_pretrained(tmp_path / "other-codec")
    before = _folder_bytes(out)
    rc = cli_main(["tokenize", str(src), str(out), "--codec", str(other), "--no-progress"])
    assert rc == 2
    assert "another codec" in capsys.readouterr().err
    assert _folder_bytes(out) == before


def test_a_folder_another_run_is_writing_is_refused_in_one_line_and_free_after(tmp_path, audio_dir, codec_dir,
                                                                                 capsys):
    """Two runs into one folder at once: the second refuses before writing anything (the lock is held
    here as the first run would hold it); once the first ends, a run goes through."""
    from rvqlm_core.folder_lock import LOCK_FILE, folder_lock

    out, src = tmp_path / "tok", tmp_path / "few"
    shutil.copytree(audio_dir / "part0", src)
    args = ["tokenize", str(src), str(out), "--codec", str(codec_dir), "--no-progress", "--workers", "0"]
    with folder_lock(out):
        assert cli_main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rvqlm tokenize: error: {out} is being written by another run (pid ") and \
            err.count("\n") == 1
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    assert cli_main(args) == 0
    assert "12 tokenized" in capsys.readouterr().out


def _decoder_changed(codec_dir: Path, dest: Path) -> Path:
    """The codec of codec_dir with other decoder weights (what a decoder-only fine-tune makes)."""
    codec = Codec.from_pretrained(codec_dir)
    with torch.no_grad():
        for p in codec.decoder.parameters():
            p.add_(0.01)
    return codec.save_pretrained(dest)


def test_a_codec_with_a_fine_tuned_decoder_continues_the_folder(tmp_path, audio_dir, codec_dir):
    """Tokens record the token fingerprint (encoder + quantizer): a decoder fine-tune makes the same
    tokens, so it may resume the folder."""
    src = tmp_path / "few"
    shutil.copytree(audio_dir / "part0", src)
    codec = Codec.from_pretrained(codec_dir)
    tuned = _decoder_changed(codec_dir, tmp_path / "tuned")
    assert Codec.from_pretrained(tuned).fingerprint() != codec.fingerprint()
    files = sorted(src.iterdir())
    for f in files[2:]:
        f.rename(tmp_path / f.name)  # tokenize two files first, the rest on the second run
    out = tmp_path / "tok"
    assert tokenize_folder(src, out, codec, progress=False).files_tokenized == 2
    assert TokenShards.open(out).fingerprint == codec.token_fingerprint()
    for f in files[2:]:
        (tmp_path / f.name).rename(f)
    resumed = tokenize_folder(src, out, Codec.from_pretrained(tuned), progress=False)
    assert (resumed.files_skipped, resumed.files_tokenized, resumed.files_failed) == (2, len(files) - 2, 0)


def test_walker_sorts_recursively_and_skips_the_output_folder(tmp_path, audio_dir):
    src = tmp_path / "a"
    shutil.copytree(audio_dir, src)
    (src / "tokens").mkdir()
    shutil.copy(next((audio_dir / "part0").iterdir()), src / "tokens" / "inside.wav")
    files = find_audio_files(src, exclude=src / "tokens")
    rels = [f.rel for f in files]
    assert rels == sorted(rels) and len(rels) == 24 and all(r.startswith("part") for r in rels)


def _tokenize_cmd(audio_dir, out, codec_dir, workers):
    return [sys.executable, "-m", "rvqlm", "tokenize", str(audio_dir), str(out), "--codec", str(codec_dir),
            "--workers", str(workers), "--shard-frames", "300", "--batch-seconds", "4", "--threads", "1",
            "--device", "cpu", "--no-progress"]


def _run_until(cmd, condition, timeout=120) -> bool:
    """Start cmd, SIGKILL it as soon as condition() holds; True if it was killed mid-run."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if condition():
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.005)
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _manifest_lines(out: Path) -> int:
    try:
        return len((out / "manifest.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


def test_kill_9_then_rerun_equals_an_uninterrupted_run(tmp_path, audio_dir, codec_dir):
    reference = tmp_path / "reference"
    codec = Codec.from_pretrained(codec_dir)
    summary = tokenize_folder(audio_dir, reference, codec, workers=0, batch_seconds=4, shard_frames=300,
                              progress=False)
    assert summary.files_tokenized == 24 and len(TokenShards.open(reference).index) > 5

    out = tmp_path / "killed"
    # The killed runs decode inline, the last one in a worker process: the output must not care.
    # First kill: as soon as the run has started writing (codec.json), before any shard.
    assert _run_until(_tokenize_cmd(audio_dir, out, codec_dir, 0), lambda: (out / "codec.json").exists())
    # Second kill: in the middle, once a few shards are committed.
    assert _run_until(_tokenize_cmd(audio_dir, out, codec_dir, 0), lambda: _manifest_lines(out) >= 6), \
        "the run finished before it could be killed"
    partial = TokenShards.open(out, verify=True)  # a killed folder is always readable
    assert 6 <= len(partial.entries) < 24
    done = subprocess.run(_tokenize_cmd(audio_dir, out, codec_dir, 1), cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{len(partial.entries)} already done" in done.stdout
    assert _folder_bytes(out) == _folder_bytes(reference)
    assert not [p for p in (out / "shards").iterdir() if p.name.startswith(".")]
