"""An output folder takes one writer at a time (rvqlm_core.folder_lock): a second holder is refused
while the first holds the lock, admitted after, and a holder killed with SIGKILL leaves it free."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rvqlm_core.folder_lock import LOCK_FILE, FolderBusy, folder_lock

REPO = Path(__file__).resolve().parents[1]
HOLD = "import sys, time; from rvqlm_core.folder_lock import folder_lock\n" \
       "with folder_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(float(sys.argv[2]))\n"


def _holder(folder: Path, seconds: float) -> subprocess.Popen:
    """Another process holding `folder`'s lock for `seconds`, started once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds)], cwd=REPO, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_second_holder_is_refused_while_the_first_holds_and_admitted_after(tmp_path):
    out = tmp_path / "tokens"
    with folder_lock(out) as held:
        assert held == out and (out / LOCK_FILE).is_file()
        with pytest.raises(FolderBusy, match=f"^{out} is being written by another run \\(pid {os.getpid()} on "):
            with folder_lock(out):
                pytest.fail("two holders")
    with folder_lock(out):
        pass


def test_a_holder_killed_with_sigkill_leaves_the_folder_free(tmp_path):
    proc = _holder(tmp_path, 60)
    try:
        with pytest.raises(FolderBusy, match=f"pid {proc.pid} on"):
            with folder_lock(tmp_path):
                pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with folder_lock(tmp_path):
        pass


def test_wait_blocks_until_the_holder_ends(tmp_path):
    proc = _holder(tmp_path, 1.0)
    t0 = time.monotonic()
    with folder_lock(tmp_path, wait=True):
        assert time.monotonic() - t0 > 0.5  # the holder keeps it for 1 s after saying so
    proc.wait()


def test_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        with folder_lock(tmp_path / "f"):
            pass


def test_a_folder_the_lock_made_goes_again_when_left_empty_and_others_stay(tmp_path):
    with folder_lock(tmp_path / "refused"):
        pass
    with folder_lock(tmp_path / "written") as held:
        (held / "codec.json").write_text("{}")
    (tmp_path / "existing").mkdir()
    with folder_lock(tmp_path / "existing"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "written"]
    assert (tmp_path / "existing" / LOCK_FILE).is_file()


def test_a_waiter_whose_lock_file_was_removed_meanwhile_locks_the_new_one(tmp_path):
    """The holder of a folder it created and left empty removes it while another run waits: the
    waiter must not keep a lock on the deleted file, or a third run could hold the new one too."""
    folder = tmp_path / "tokens"
    proc = _holder(folder, 1.0)  # creates the folder, leaves it empty: removes it on exit
    with folder_lock(folder, wait=True):
        assert (folder / LOCK_FILE).is_file()
        with pytest.raises(FolderBusy):
            with folder_lock(folder):
                pass
    proc.wait()


def test_an_lm_run_into_a_run_folder_another_run_holds_is_refused_then_admitted(tmp_path, capsys):
    """`rvqlm train-lm` holds its run folder for the fit (lm.run_lock): refused in one line while
    another run holds it, before any checkpoint; admitted once it is free."""
    from rvqlm.cli import main
    from test_lm_data import make_token_corpus

    make_token_corpus(tmp_path / "tokens")
    run = tmp_path / "run"
    args = ["train-lm", "--config", str(REPO / "recipes" / "lm_tiny.yaml"), "--data.tokens_dir", str(tmp_path / "tokens"),
            "--trainer.default_root_dir", str(run), "--trainer.max_steps", "2", "--trainer.val_check_interval", "2"]
    with folder_lock(run):
        assert main(args) == 2
        assert capsys.readouterr().err.endswith(f"rvqlm train-lm: error: {run} is being written by another run "
                                                f"(pid {os.getpid()} on {socket.gethostname()}); let it end first\n")
        assert not (run / "checkpoints").exists() and not (run / "pretrained").exists()
    assert main(args) == 0 and (run / "pretrained" / "config.json").is_file()
