"""LM training with Lightning: the schedule and decay groups, a tiny recipe that learns, export with
the codec fingerprint, exact resume after a kill, identical weights on 2 DDP ranks, and eval-lm."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from lm import LMConfig, MultiCodebookLM
from lm.data import TokenFiles, ValidWindows
from lm.training import (LMTrainingModule, check_fingerprint, decay_groups, evaluate_nll, measure_matmul_peak,
                         train_main, warmup_cosine)
from rvqlm.cli import main as rvqlm_main
from test_lm_data import FINGERPRINT, make_token_corpus

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
TINY = str(REPO / "recipes" / "lm_tiny.yaml")


# ---- callbacks the subprocess runs load by class path (this file is importable as test_lm_training) ----

class RecordLosses(pl.Callback):
    """Appends {"step", "loss"} per optimizer step to a JSONL file, flushed at once (survives a kill)."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": trainer.global_step, "loss": float(outputs["loss"]),
                                "batch_index": int(batch["batch_index"])}) + "\n")


class KillAtStep(pl.Callback):
    """Ends the process like `kill -9` right after optimizer step `step` (before any checkpoint of it)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os._exit(137)


class SaveRankWeights(pl.Callback):
    """Each rank writes its final weights and its first training batch to OUT/rank<r>.safetensors."""

    def __init__(self, out: str):
        self.out = out
        self.first_batch: torch.Tensor | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.first_batch is None:
            self.first_batch = batch["codes"].clone()

    def on_train_end(self, trainer, pl_module):
        state = {f"model.{k}": v.detach().contiguous() for k, v in pl_module.model.state_dict().items()}
        state["first_batch"] = self.first_batch
        save_file(state, str(Path(self.out) / f"rank{trainer.global_rank}.safetensors"))


def callback_arg(cls: type, **init_args) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": f"test_lm_training.{cls.__name__}",
                                                 "init_args": init_args})


def tiny_args(tokens: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["--config", TINY, "--data.tokens_dir", str(tokens), "--trainer.default_root_dir", str(run_dir),
            *extra]


DDP_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT"}


def free_port() -> int:
    """A localhost port free on both IPv4 and IPv6 right now. Lightning probes IPv4 only, and the
    rendezvous store then listens dual-stack, so its pick can land on a port an earlier DDP run left
    in TIME_WAIT on the IPv6 side (EADDRINUSE when several DDP tests run in one session)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s4:
            s4.bind(("", 0))
            port = s4.getsockname()[1]
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s6:
                s6.bind(("::", port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port on both IPv4 and IPv6")


def subprocess_env() -> dict[str, str]:
    """The environment of a training subprocess: tests/ importable, one thread, its own DDP port."""
    inherited = {k: v for k, v in os.environ.items()  # an in-process DDP test leaves its rank variables behind
                 if k not in DDP_VARIABLES and not k.startswith(("PL_", "TORCHELASTIC_"))}
    return dict(inherited, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
                OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))


def run_cli_subprocess(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    env = subprocess_env()
    rvqlm = Path(sys.executable).with_name("rvqlm")
    return subprocess.run([str(rvqlm), "train-lm", *args], env=env, capture_output=True, text=True, timeout=timeout)


def read_losses(path: Path) -> dict[int, float]:
    """step (after the optimizer step) -> loss of that batch; a later line for the same step wins."""
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = row["loss"]
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread here and in the subprocesses (OMP_NUM_THREADS): on a shared 2-core machine,
    OpenMP spin-waits make 2 threads many times slower, and a resumed run must use the same
    kernels as the uninterrupted one to repeat its losses bit for bit."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lm_train") / "tokens"
    make_token_corpus(out)
    return out


# ---- pieces -----------------------------------------------------------------------------------------

def test_warmup_cosine_schedule():
    lr = [warmup_cosine(s, warmup_steps=4, total_steps=20, min_lr_ratio=0.1) for s in range(25)]
    assert lr[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lr[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lr[4:], lr[5:]))  # non-increasing after warmup
    assert lr[12] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the cosine
    assert lr[20] == pytest.approx(0.1) and lr[24] == pytest.approx(0.1)


@pytest.mark.parametrize("tie", [False, True])
def test_weight_decay_only_on_matrices_not_on_embeddings(tie):
    model = MultiCodebookLM(LMConfig(n_codebooks=2, codebook_size=8, d_model=16, n_layers=1, n_heads=2,
                                     max_seq_len=16, pos="learned", bias=True, tie_weights=tie))
    decay, no_decay = decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    named = {id(p): n for n, p in model.named_parameters()}
    decayed = {named[id(p)] for p in decay["params"]}
    kept = {named[id(p)] for p in no_decay["params"]}
    assert "token_embedding.weight" in kept and "pos_embedding.table.weight" in kept
    assert {"blocks.0.attn.qkv.weight", "blocks.0.attn.out.weight", "blocks.0.ffn.w1.weight"} <= decayed
    assert ("head_weight" in decayed) != tie  # tied heads are the (undecayed) embedding table
    assert all(p.dim() >= 2 for p in decay["params"])
    assert any(n.endswith(".bias") for n in kept) and any("norm" in n for n in kept)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_matmul_peak_is_a_measured_throughput():
    peak = measure_matmul_peak(n=256, repeats=2)
    assert np.isfinite(peak) and peak > 1e8  # any CPU of this century does > 0.1 GFLOP/s


def test_fingerprint_check():
    check_fingerprint("ab" * 32, "ab" * 32, "tokens/")
    with pytest.raises(ValueError, match="codec mismatch: the LM was trained on tokens of codec abababab"):
        check_fingerprint("ab" * 32, "cd" * 32, "tokens/")
    with pytest.raises(ValueError, match="none recorded"):
        check_fingerprint(None, "cd" * 32, "tokens/")


# ---- whole runs -------------------------------------------------------------------------------------

RESUME_ARGS = ["--trainer.max_steps", "14", "--trainer.callbacks.init_args.every_n_train_steps", "3"]


@pytest.fixture(scope="module")
def full_run(tokens, tmp_path_factory) -> tuple[Path, dict[int, float]]:
    """The tiny recipe run uninterrupted for 14 steps: (run dir, per-step losses)."""
    root = tmp_path_factory.mktemp("full_run")
    log = root / "losses.jsonl"
    train_main(tiny_args(tokens, root / "run", *RESUME_ARGS, callback_arg(RecordLosses, path=str(log))))
    return root / "run", read_losses(log)


def test_killed_run_resumes_exactly_and_the_tiny_recipe_learns(tokens, full_run, tmp_path):
    """Uninterrupted 14 steps vs. killed at step 11 (last checkpoint: step 9, mid-epoch) + resumed.

    The tiny recipe uses dropout, checkpoints every 3 steps, validates every 10 batches and has
    8-batch epochs, so optimizer, scheduler, RNG and data position all have to be restored.
    """
    common = RESUME_ARGS
    full_dir, full = full_run
    cut_dir, cut_log = tmp_path / "cut", tmp_path / "cut.jsonl"
    killed = run_cli_subprocess(tiny_args(tokens, cut_dir, *common, callback_arg(RecordLosses, path=str(cut_log)),
                                          callback_arg(KillAtStep, step=11)))
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert (cut_dir / "checkpoints" / "last.ckpt").is_file() and not (cut_dir / "pretrained").exists()
    ckpt = torch.load(cut_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 9
    assert ckpt["TokenDataModule"]["consumed_batches"] == 9  # mid-epoch: epoch 1, batch 1 of 8

    train_main(tiny_args(tokens, cut_dir, *common, callback_arg(RecordLosses, path=str(cut_log)),
                         "--ckpt_path", "last"))
    resumed = read_losses(cut_log)
    assert sorted(full) == sorted(resumed) == list(range(1, 15))
    for step in range(1, 15):  # bit-exact: same kernels, same threads, same state
        assert resumed[step] == full[step], (step, resumed[step], full[step])

    # The tiny recipe learns: the last steps' loss is well below the first steps' (ln 16 = 2.77).
    first, last = np.mean([full[s] for s in (1, 2, 3)]), np.mean([full[s] for s in (12, 13, 14)])
    assert last < first - 0.4, (first, last)

    # Export: a save_pretrained folder carrying the tokens' codec fingerprint, equal to the final weights.
    model = MultiCodebookLM.from_pretrained(full_dir / "pretrained")
    assert model.config.codec_fingerprint == FINGERPRINT
    assert (model.config.n_codebooks, model.config.codebook_size) == (3, 16)
    resumed_model = MultiCodebookLM.from_pretrained(cut_dir / "pretrained")
    for (name, a), b in zip(model.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(a, b), name


def test_two_ddp_ranks_end_with_identical_weights(tokens, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    proc = run_cli_subprocess(tiny_args(tokens, tmp_path / "run", "--trainer.strategy", "ddp",
                                        "--trainer.devices", "2", "--trainer.max_steps", "4",
                                        callback_arg(SaveRankWeights, out=str(out))), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = load_file(str(out / "rank0.safetensors")), load_file(str(out / "rank1.safetensors"))
    assert not torch.equal(r0.pop("first_batch"), r1.pop("first_batch"))  # the ranks trained on different data
    assert r0.keys() == r1.keys()
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name
    init = MultiCodebookLM.from_pretrained(tmp_path / "run" / "pretrained")  # rank 0 exported the same weights
    for name, value in init.state_dict().items():
        assert torch.equal(value, r0[f"model.{name}"]), name


# ---- fingerprints and eval-lm ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(full_run) -> Path:
    return full_run[0]


def test_eval_lm_prints_per_codebook_nll_next_to_the_unigram_baseline(trained, tokens, tmp_path, capsys):
    report_path = tmp_path / "eval.json"
    assert rvqlm_main(["eval-lm", "--lm", str(trained / "pretrained"), "--tokens", str(tokens),
                       "--split", "valid", "--window-frames", "40", "--unigram", "--json", str(report_path)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    model = MultiCodebookLM.from_pretrained(trained / "pretrained")
    valid = TokenFiles.of_split(tokens, "valid")
    nll, count = evaluate_nll(model, ValidWindows(valid, 3, 40, 4))
    assert report["nll_per_codebook"] == pytest.approx((nll / count).tolist(), rel=1e-6)
    assert report["tokens_per_codebook"] == [valid.total_frames] * 3
    # Unigram baseline by hand: add-one frequencies of the train files, scored on the valid files.
    from rvqlm_core.token_shards import TokenShards
    shards = TokenShards.open(tokens)
    train_tok = np.concatenate([shards.read(e) for e in shards.entries if e.path.startswith("train/")])
    valid_tok = np.concatenate([shards.read(e) for e in shards.entries if e.path.startswith("valid/")])
    for k in range(3):
        p = (np.bincount(train_tok[:, k], minlength=16) + 1) / (len(train_tok) + 16)
        assert report["unigram_nll_per_codebook"][k] == pytest.approx(-np.log(p[valid_tok[:, k]]).mean(), rel=1e-9)
    for k in range(3):
        assert f"{report['nll_per_codebook'][k]:12.4f}" in printed
    assert "unigram NLL" in printed


def test_an_lm_is_refused_on_tokens_of_another_codec(trained, tmp_path, capsys):
    other = tmp_path / "other_codec"
    make_token_corpus(other, n_train=4, n_valid=2, fingerprint="cd" * 32)
    code = rvqlm_main(["eval-lm", "--lm", str(trained / "pretrained"), "--tokens", str(other)])
    err = capsys.readouterr().err
    assert code == 2 and "codec mismatch" in err and "cdcdcdcd" in err
    # Resuming a run's checkpoint on tokens of another codec is refused as well.
    with pytest.raises(ValueError, match="codec mismatch"):
        train_main(tiny_args(other, tmp_path / "run", "--trainer.max_steps", "20",
                             "--ckpt_path", str(trained / "checkpoints" / "last.ckpt")))


def test_window_longer_than_the_context_is_refused(tokens, tmp_path):
    # 63 frames take 63 + N_c - 1 = 65 delay-pattern positions; the tiny LM holds 64.
    with pytest.raises(ValueError, match="window_frames=63 needs more than max_seq_len=64"):
        train_main(tiny_args(tokens, tmp_path, "--data.window_frames", "63"))


def test_training_module_takes_the_layout_from_its_arguments():
    module = LMTrainingModule(LMConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=32), n_codebooks=2,
                              codebook_size=10, codec_fingerprint="ef" * 32)
    cfg = module.model.config
    assert (cfg.n_codebooks, cfg.codebook_size, cfg.codec_fingerprint) == (2, 10, "ef" * 32)
    assert module.hparams["config"]["codebook_size"] == 10


def test_init_from_starts_from_a_pretrained_lm_and_refuses_another(tmp_path):
    """Fine-tuning: `init_from` loads a save_pretrained folder; a different architecture or codec is refused."""
    from lm import LMConfig, MultiCodebookLM

    cfg = LMConfig(n_codebooks=2, codebook_size=7, d_model=16, n_layers=1, n_heads=2, max_seq_len=24,
                   codec_fingerprint="f" * 64)
    source = MultiCodebookLM(cfg)
    source.save_pretrained(tmp_path / "src")
    module = LMTrainingModule(dataclasses.replace(cfg, dropout=0.1), init_from=str(tmp_path / "src"))
    for name, tensor in source.state_dict().items():
        assert torch.equal(module.model.state_dict()[name], tensor), name
    with pytest.raises(ValueError, match="d_model"):
        LMTrainingModule(dataclasses.replace(cfg, d_model=32), init_from=str(tmp_path / "src"))
    with pytest.raises(ValueError, match="codec_fingerprint"):
        LMTrainingModule(cfg, codec_fingerprint="0" * 64, init_from=str(tmp_path / "src"))
