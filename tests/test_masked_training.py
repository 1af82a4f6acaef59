"""Training a masked LM (lm.masked_training): the tiny recipe learns, a killed run resumes exactly, the
validation masking is fixed, init_from takes an AR LM, and eval-lm / generate load the masked family."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lm import LMConfig, MaskedLM, MultiCodebookLM, load_lm
from lm.data import TokenFiles, ValidWindows
from lm.masked_training import MaskedLMTrainingModule, masked_nll
from lm.training import train_main
from rvqlm.cli import main as rvqlm_main
from test_lm_data import FINGERPRINT, make_token_corpus
from test_lm_training import KillAtStep, RecordLosses, SaveRankWeights, callback_arg, read_losses

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "recipes" / "lm_masked_tiny.yaml")
RESUME_ARGS = ["--trainer.max_steps", "14", "--trainer.callbacks.init_args.every_n_train_steps", "3"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread (as in test_lm_training): the resumed run must use the uninterrupted run's kernels."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("masked_train") / "tokens"
    make_token_corpus(out)
    return out


def tiny_args(tokens: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["--config", TINY, "--data.tokens_dir", str(tokens), "--trainer.default_root_dir", str(run_dir), *extra]


@pytest.fixture(scope="module")
def full_run(tokens, tmp_path_factory) -> tuple[Path, dict[int, float]]:
    root = tmp_path_factory.mktemp("masked_full_run")
    log = root / "losses.jsonl"
    train_main(tiny_args(tokens, root / "run", *RESUME_ARGS, callback_arg(RecordLosses, path=str(log))))
    return root / "run", read_losses(log)


def test_killed_masked_run_resumes_exactly_and_the_tiny_recipe_learns(tokens, full_run, tmp_path):
    """Uninterrupted 14 steps vs. killed at step 11 (last checkpoint: step 9) + resumed, as the AR test."""
    full_dir, full = full_run
    cut_dir, cut_log = tmp_path / "cut", tmp_path / "cut.jsonl"
    killed = _run_masked_subprocess(tiny_args(tokens, cut_dir, *RESUME_ARGS, callback_arg(RecordLosses, path=str(cut_log)),
                                              callback_arg(KillAtStep, step=11)))
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert torch.load(cut_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 9
    train_main(tiny_args(tokens, cut_dir, *RESUME_ARGS, callback_arg(RecordLosses, path=str(cut_log)),
                                "--ckpt_path", "last"))
    resumed = read_losses(cut_log)
    assert sorted(full) == sorted(resumed) == list(range(1, 15))
    for step in range(1, 15):
        assert resumed[step] == full[step], (step, resumed[step], full[step])
    first, last = np.mean([full[s] for s in (1, 2, 3)]), np.mean([full[s] for s in (12, 13, 14)])
    assert last < first - 0.3, (first, last)  # ln 16 = 2.77 at the start
    model = load_lm(full_dir / "pretrained")
    assert isinstance(model, MaskedLM) and model.config.codec_fingerprint == FINGERPRINT
    again = load_lm(cut_dir / "pretrained")
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name


def _run_masked_subprocess(args: list[str], timeout: int = 120):
    from test_lm_training import subprocess_env

    env = subprocess_env()
    rvqlm = Path(sys.executable).with_name("rvqlm")
    return subprocess.run([str(rvqlm), "train-lm", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_two_ddp_ranks_end_with_identical_weights(tokens, tmp_path):
    """DDP as for the AR LM: each rank draws its own masks (the seed has the rank), gradients are averaged."""
    from safetensors.torch import load_file

    out = tmp_path / "ranks"
    out.mkdir()
    proc = _run_masked_subprocess(tiny_args(tokens, tmp_path / "run", "--trainer.strategy", "ddp",
                                            "--trainer.devices", "2", "--trainer.max_steps", "3",
                                            callback_arg(SaveRankWeights, out=str(out))), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = load_file(str(out / "rank0.safetensors")), load_file(str(out / "rank1.safetensors"))
    assert not torch.equal(r0.pop("first_batch"), r1.pop("first_batch"))
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name


def test_validation_logs_per_level_losses_from_a_fixed_masking(full_run):
    run_dir, _ = full_run
    metrics = (next((run_dir / "logs").glob("version_*")) / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    assert {"val/loss", "val/loss_cb0", "val/loss_cb2", "train/loss_cb1"} <= set(header)


def test_validation_masks_are_fixed_whatever_the_global_rng(tokens):
    cfg = LMConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=32, pattern="parallel", family="masked")
    module = MaskedLMTrainingModule(cfg, n_codebooks=3, codebook_size=16, measure_peak=False).eval()
    batch = next(iter(ValidWindows(TokenFiles.of_split(tokens, "valid"), 3, 32, 4)))
    sums = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        module.on_validation_epoch_start()
        module.validation_step(batch, 0)
        sums.append((module._val_nll.clone(), module._val_count.clone()))
    assert torch.equal(sums[0][0], sums[1][0]) and torch.equal(sums[0][1], sums[1][1])
    module.on_validation_epoch_start()
    module.validation_step(batch, 1)  # another batch index draws other masks
    assert not torch.equal(module._val_count, sums[0][1]) or not torch.equal(module._val_nll, sums[0][0])


def test_scoring_masks_the_same_way_every_time(full_run, tokens):
    model = load_lm(full_run[0] / "pretrained")
    windows = ValidWindows(TokenFiles.of_split(tokens, "valid"), 3, 32, 4)
    a, count = masked_nll(model, windows, ratio=0.5)
    b, _ = masked_nll(model, windows, ratio=0.5)
    assert torch.equal(a, b) and (count > 0).all()
    frames = TokenFiles.of_split(tokens, "valid").n_frames
    assert count.tolist() == [sum(int(np.ceil(0.5 * n)) for n in _window_lengths(frames, 32))] * 3


def _window_lengths(frames, window):
    return [min(window, n - s) for n in frames for s in range(0, n, window)]


def test_eval_lm_scores_a_masked_lm_per_level(full_run, tokens, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert rvqlm_main(["eval-lm", "--lm", str(full_run[0] / "pretrained"), "--tokens", str(tokens),
                       "--window-frames", "32", "--mask-ratio", "0.5", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["family"] == "masked" and len(report["nll_per_codebook"]) == 3
    printed = capsys.readouterr().out
    assert "masked LM" in printed and f"{report['nll']:12.4f}" in printed
    assert rvqlm_main(["eval-lm", "--lm", str(full_run[0] / "pretrained"), "--tokens", str(tokens), "--unigram"]) == 2
    assert "--unigram is not an option of the 'masked' LM family" in capsys.readouterr().err


def test_init_from_an_ar_lm_copies_every_tensor_and_refuses_another_architecture(tmp_path):
    cfg = LMConfig(n_codebooks=2, codebook_size=7, d_model=16, n_layers=1, n_heads=2, max_seq_len=24,
                   codec_fingerprint="f" * 64)
    source = MultiCodebookLM(cfg)
    source.save_pretrained(tmp_path / "ar")
    masked = dataclasses.replace(cfg, family="masked", pattern="parallel", dropout=0.1)
    module = MaskedLMTrainingModule(masked, init_from=str(tmp_path / "ar"))
    for name, tensor in source.state_dict().items():
        assert torch.equal(module.model.state_dict()[name], tensor), name
    with pytest.raises(ValueError, match="d_model"):
        MaskedLMTrainingModule(dataclasses.replace(masked, d_model=32), init_from=str(tmp_path / "ar"))
    with pytest.raises(ValueError, match="'ar' LM family|'masked' LM family"):
        MaskedLMTrainingModule(cfg)


@pytest.fixture(scope="module")
def codec_and_masked(tmp_path_factory):
    """A tiny random codec (2 codebooks of 16) and a tiny masked LM on its tokens."""
    from codec import Codec, CodecConfig

    root = tmp_path_factory.mktemp("masked_pair")
    torch.manual_seed(0)
    codec = Codec(CodecConfig.from_flat(dict(encoder_channels=2, decoder_channels=2, latent_dim=8, n_codebooks=2,
                              codebook_size=16, dilations=(1,)))).eval()
    codec.save_pretrained(root / "codec")
    cfg = LMConfig(n_codebooks=2, codebook_size=16, d_model=16, n_layers=1, n_heads=2, max_seq_len=40,
                   pattern="parallel", family="masked", codec_fingerprint=codec.token_fingerprint())
    MaskedLM(cfg).save_pretrained(root / "lm")
    MultiCodebookLM(dataclasses.replace(cfg, family="ar", pattern="delay")).save_pretrained(root / "ar")
    return root


def test_generate_cli_continues_with_a_masked_lm(codec_and_masked, tmp_path, capsys):
    root = codec_and_masked
    out = tmp_path / "m.wav"
    assert rvqlm_main(["generate", "--lm", str(root / "lm"), "--codec", str(root / "codec"), "--seconds", "1.2",
                       "--steps", "4,2", "--seed", "1", "--num-samples", "2", "--out", str(out), "--no-progress",
                       "--choice-temperature", "3"]) == 0
    from codec.core.audio import audio_info

    assert audio_info(tmp_path / "m-1.wav").duration == pytest.approx(1.2)  # 60 frames: past the 40-frame window
    assert "real-time factor" in capsys.readouterr().out
    assert rvqlm_main(["generate", "--lm", str(root / "lm"), "--codec", str(root / "codec"), "--seconds", "1.2",
                       "--window", "70", "--seed", "1", "--out", str(tmp_path / "one.wav"), "--no-progress"]) == 0
    assert audio_info(tmp_path / "one.wav").duration == pytest.approx(1.2)  # 60 frames in one 70-frame pass


@pytest.mark.parametrize("flag, steps, message", [("--steps", "", "at least one"), ("--steps", "4,0", "at least 1 step"),
                                                  ("--steps", "4,2,1", "at most 2"), ("--steps", "a", "comma-separated"),
                                                  ("--choice-temperature", "-1", "finite number >= 0"),
                                                  ("--choice-temperature", "nan", "finite number >= 0")])
def test_generate_cli_refuses_bad_step_lists_in_one_line(codec_and_masked, tmp_path, capsys, flag, steps, message):
    root = codec_and_masked
    rc = rvqlm_main(["generate", "--lm", str(root / "lm"), "--codec", str(root / "codec"), flag, steps,
                     "--out", str(tmp_path / "o.wav"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("flag, value", [("--steps", "4,2"), ("--window", "70"), ("--choice-temperature", "2")])
def test_generate_cli_refuses_masked_options_for_an_ar_lm(codec_and_masked, tmp_path, capsys, flag, value):
    root = codec_and_masked
    rc = rvqlm_main(["generate", "--lm", str(root / "ar"), "--codec", str(root / "codec"), flag, value,
                     "--out", str(tmp_path / "o.wav"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{flag} is not an option of the 'ar' LM family" in err and len(err.strip().splitlines()) == 1


def test_generate_cli_refuses_a_speaker_scale_for_a_masked_lm(codec_and_masked, tmp_path, capsys):
    root = codec_and_masked
    rc = rvqlm_main(["generate", "--lm", str(root / "lm"), "--codec", str(root / "codec"), "--speaker-cfg", "2",
                     "--out", str(tmp_path / "o.wav"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "--speaker-cfg" in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())
