"""`rvqlm train-lm` on bad input (issue 49): one row a case; each row's exit code, its one line on stderr
(no traceback), and every file that was there before unchanged (tests/bad_input.py). Signals and kills
run the command in a subprocess of their own."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from bad_input import _debug_off, check_row, fill, rows, table, write_wav  # noqa: F401 (a fixture)
from test_lm_data import make_token_corpus

REPO = Path(__file__).resolve().parents[1]
RECIPES = shlex.quote(str(REPO / "recipes"))
TINY = (f"train-lm --config {RECIPES}/lm_tiny.yaml --trainer.max_steps 2 --trainer.val_check_interval 2 "
        "--data.tokens_dir {w}/tokens")

ROWS = table("""
# id | command line ({w}: the workspace; {run}: --trainer.default_root_dir {w}/run) | exit code |
#     in the one line on stderr | files it leaves
into-a-finished-run | {tiny} --trainer.default_root_dir {w}/done | 2 | holds the run of an earlier train-lm
misspelt-option | {tiny} --data.batchsize 3 | 2 |
    unrecognized arguments: --data.batchsize 3; see rvqlm train-lm --help
option-of-the-wrong-type | {tiny} --trainer.max_steps many | 2 | many; see rvqlm train-lm --help
missing-recipe | train-lm --config {w}/nope.yaml | 2 | nope.yaml
train-codec-misspelt-option | train-codec --config {recipes}/codec_speech.yaml --data.batchsize 3 | 2 |
    unrecognized arguments: --data.batchsize 3; see rvqlm train-codec --help
ckpt-path-is-audio | {tiny} {run} --ckpt_path {w}/in.wav | 2 | in.wav is not a checkpoint
ckpt-path-is-empty | {tiny} {run} --ckpt_path {w}/empty.ckpt | 2 | empty.ckpt is not a checkpoint
ckpt-path-is-missing | {tiny} {run} --ckpt_path {w}/nope.ckpt | 2 | no such checkpoint file
""", tiny=TINY, recipes=RECIPES, run="--trainer.default_root_dir {w}/run")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    make_token_corpus(root / "tokens")
    return root


@pytest.fixture
def workspace(tmp_path, models):
    """tokens/, done/ (a finished run's folder: pretrained/ and checkpoints/last.ckpt), in.wav."""
    shutil.copytree(models / "tokens", tmp_path / "tokens")
    (tmp_path / "done" / "checkpoints").mkdir(parents=True)
    (tmp_path / "done" / "checkpoints" / "last.ckpt").write_bytes(b"an earlier run's checkpoint")
    (tmp_path / "done" / "pretrained").mkdir()
    (tmp_path / "done" / "pretrained" / "model.safetensors").write_bytes(b"an earlier run's weights")
    write_wav(tmp_path / "in.wav", seconds=0.1)
    (tmp_path / "empty.ckpt").write_bytes(b"")
    return tmp_path


@rows(ROWS)
def test_bad_input(workspace, capsys, row):
    check_row(workspace, row.argv, row.code, row.message, capsys, row.new)


def test_a_finished_run_is_resumed_with_ckpt_path_last_or_started_over_with_overwrite(workspace, capsys):
    from rvqlm.cli import main

    run = workspace / "run"
    args = [*fill(TINY, workspace), "--trainer.default_root_dir", str(run)]
    assert main(args) == 0 and (run / "checkpoints" / "last.ckpt").is_file()
    first = (run / "pretrained" / "model.safetensors").read_bytes()
    (run / "checkpoints" / ".last.ckpt.tmp-k9x2mq.ckpt").write_bytes(b"")  # what kill -9 mid-write leaves
    assert main([*args, "--trainer.max_steps", "4", "--ckpt_path", "last"]) == 0
    resumed = (run / "pretrained" / "model.safetensors").read_bytes()
    assert resumed != first and sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]
    assert main([*args, "--seed_everything", "1", "--overwrite", "true"]) == 0
    assert (run / "pretrained" / "model.safetensors").read_bytes() not in (first, resumed)


def test_sigterm_exits_143_and_keeps_the_last_checkpoint(workspace):
    """SIGTERM (a scheduler's stop, `kill`) mid-fit: exit 143, so `rvqlm train-lm ... && next` stops, one line
    saying so; no pretrained/ (the run did not finish), its last checkpoint kept to resume from."""
    import signal
    import subprocess
    import sys
    import time

    import torch

    from bad_input import one_thread_env

    run = workspace / "run"
    args = fill(TINY, workspace)[1:]
    rvqlm = Path(sys.executable).with_name("rvqlm")
    proc = subprocess.Popen([str(rvqlm), "train-lm", *args, "--trainer.max_steps", "100000",
                             "--trainer.default_root_dir", str(run)], env=one_thread_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run / "checkpoints" / "last.ckpt").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("rvqlm train-lm: terminated (SIGTERM)")
    assert not (run / "pretrained").exists()
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["last.ckpt"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] >= 5


def test_a_run_refused_by_the_folder_lock_leaves_no_trace(workspace, capsys):
    """A second train-lm into a folder another run holds is refused in one line and writes nothing there
    (it used to leave an empty logs/version_N)."""
    import os

    from rvqlm_core.folder_lock import folder_lock

    run = workspace / "run"
    with folder_lock(run):
        check_row(workspace, [*fill(TINY, workspace), "--trainer.default_root_dir", str(run)], 2,
                  f"{run} is being written by another run (pid {os.getpid()}", capsys)
