"""Codec training on real speech: losses go down, the CLI entry trains / resumes / exports."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from codec import Codec, CodecConfig
from codec.core.discriminator import load_discriminator
from codec.neural.data import CodecDataModule, FixedCropDataset, RandomCropDataset
from codec.neural.losses import MultiScaleMelLoss, fit_n_mels, si_sdr
from codec.neural.training import CodecModule
from codec.neural.training_config import Losses, Optimization
from rvqlm.cli import main


REPO = Path(__file__).resolve().parents[1]
TINY_RECIPE = REPO / "recipes" / "codec_tiny.yaml"
SEANET = dict(kind="seanet", channels=4, dilations=(1, 3))
TINY = CodecConfig.from_dict(dict(latent_dim=16, encoder=SEANET, decoder=SEANET,
                                  quantizer=dict(n_codebooks=4, codebook_size=32, kmeans_iters=2)))


def test_n_mels_are_fitted_so_no_filter_is_empty():
    loss = MultiScaleMelLoss(16000, (256, 512, 2048), max_mels=80)
    assert loss.n_mels[0] < 80 and loss.n_mels[-1] == 80
    assert fit_n_mels(16000, 256, 80) == loss.n_mels[0]


def _train_20_steps(module: CodecModule, corpus_dir: Path) -> tuple[L.Trainer, dict, dict]:
    """20 steps on real speech crops; validation metrics before and after."""
    data = CodecDataModule(corpus_dir=str(corpus_dir), crop_seconds=0.4, valid_crop_seconds=1.0, batch_size=4,
                           max_train_files=16, max_valid_files=4, valid_batch_size=4)
    trainer = L.Trainer(accelerator="cpu", max_steps=20, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=1)
    before = trainer.validate(module, datamodule=data, verbose=False)[0]
    trainer.fit(module, datamodule=data)
    after = trainer.validate(module, datamodule=data, verbose=False)[0]
    return trainer, before, after


def test_mel_bands_per_scale():
    loss = MultiScaleMelLoss(16000, (256, 512, 1024, 2048), max_mels=(40, 80, 160, 320))
    assert loss.n_mels == [40, 80, 160, 320]
    assert [m.n_fft for m in loss.mels] == [256, 512, 1024, 2048]
    with pytest.raises(ValueError, match="max_mels has 2 entries for 4 FFT sizes"):
        MultiScaleMelLoss(16000, (256, 512, 1024, 2048), max_mels=(40, 80))


def test_istft_decoder_codec_learns_real_speech(corpus_dir):
    """The frame-rate ConvNeXt + iSTFT decoder trains end to end with the per-scale mel bands."""
    torch.manual_seed(0)
    config = CodecConfig.from_dict({**TINY.to_dict(), "decoder": {"kind": "istft", "dim": 32, "layers": 2, "hop": 80,
                                                                  "n_fft": None}})
    module = CodecModule(config, losses=Losses(mel_n_ffts=[256, 1024], mel_max_mels=[40, 160]), optim=Optimization(lr=3e-3))
    trainer, before, after = _train_20_steps(module, corpus_dir)
    assert after["val/mel_distance"] < 0.8 * before["val/mel_distance"]


def test_crop_stream_restarts_where_it_stopped_and_splits_ranks(speech_files):
    from codec.neural.data import CropBatchStream, StreamPosition

    crops = RandomCropDataset(speech_files["train"][:5], 16000, 1, crop_seconds=0.2, items=12)
    stream = CropBatchStream(crops, batch_size=2, batches_per_epoch=6)
    batches = list(stream)
    assert [int(b["batch_index"]) for b in batches] == list(range(6))
    assert batches[3]["audio"].shape == (2, 1, 3200)
    later = CropBatchStream(crops, batch_size=2, batches_per_epoch=6, position=StreamPosition(4))
    assert [int(b["batch_index"]) for b in later] == [4, 5]
    assert torch.equal(next(iter(later))["audio"], batches[4]["audio"])
    ranks = [CropBatchStream(crops, 2, 3, rank=r, world_size=2).batch(0)["audio"] for r in (0, 1)]
    assert torch.equal(torch.cat(ranks), torch.cat([batches[0]["audio"], batches[1]["audio"]]))


def test_speed_perturbation_moves_pitch_and_is_a_pure_function_of_the_crop(tmp_path):
    """At speed s a crop is s * crop_seconds of the file played back in crop_seconds: a 400 Hz tone
    comes out at s * 400 Hz, the crop keeps its length, and each crop's speed depends on (seed, i) only."""
    import soundfile as sf

    sr = 16000
    t = np.arange(5 * sr) / sr
    sf.write(tmp_path / "tone.wav", 0.5 * np.sin(2 * np.pi * 400 * t), sr)
    crops = RandomCropDataset([tmp_path / "tone.wav"], sr, 1, crop_seconds=1.0, items=40,
                              speeds=[0.9, 1.0, 1.1])
    seen = {}
    for i in range(40):
        wav = crops[i]
        assert wav.shape == (1, sr)
        peak_hz = float(np.argmax(np.abs(np.fft.rfft(wav[0].numpy())))) * sr / wav.shape[-1]
        seen.setdefault(crops.speed(i), set()).add(round(peak_hz))
    assert seen == {0.9: {360}, 1.0: {400}, 1.1: {440}}
    again = RandomCropDataset([tmp_path / "tone.wav"], sr, 1, crop_seconds=1.0, items=40, speeds=[0.9, 1.0, 1.1])
    assert [again.speed(i) for i in range(40)] == [crops.speed(i) for i in range(40)]
    assert torch.equal(again[7], crops[7])
    with pytest.raises(ValueError, match="whole number of Hz"):
        RandomCropDataset([tmp_path / "tone.wav"], sr, 1, speeds=[1.00001])
    with pytest.raises(ValueError, match="lie in"):
        RandomCropDataset([tmp_path / "tone.wav"], sr, 1, speeds=[3.0])


def test_resume_refuses_changed_speed_perturbation(corpus_dir):
    module = CodecDataModule(corpus_dir=str(corpus_dir), speeds=[0.9, 1.0, 1.1], max_valid_files=2)
    module.setup("fit")
    state = module.state_dict()
    assert state["speeds"] == [0.9, 1.0, 1.1]
    plain = CodecDataModule(corpus_dir=str(corpus_dir), max_valid_files=2)
    plain.setup("fit")
    with pytest.raises(ValueError, match="speeds"):
        plain.load_state_dict(state)


def test_si_sdr_values():
    ref = torch.randn(2, 1, 4000)
    assert torch.all(si_sdr(3 * ref, ref) > 60)  # scale-invariant
    noisy = ref + 0.1 * torch.randn(2, 1, 4000)
    assert torch.allclose(si_sdr(noisy, ref), torch.full((2,), 20.0), atol=1.0)


def test_datasets_crop_real_speech(speech_files):
    files = speech_files["train"][:3]
    train = RandomCropDataset(files, 16000, 1, crop_seconds=0.5, items=7)
    assert len(train) == 7 and all(train[i].shape == (1, 8000) for i in range(7))
    # Crop i is a pure function of (seed, i); each pass visits every file once (7 items, 3 files: 3+2+2).
    again = RandomCropDataset(files, 16000, 1, crop_seconds=0.5, items=7)
    assert torch.equal(again[12], train[12]) and train.file_and_offset(12) == again.file_and_offset(12)
    assert RandomCropDataset(files, 16000, 1, crop_seconds=0.5, items=7, seed=1).file_and_offset(3) != \
        train.file_and_offset(3)
    for epoch in range(2):
        visits = sorted(train.file_and_offset(epoch * 7 + j)[0] for j in range(7))
        assert visits == [0, 0, 0, 1, 1, 2, 2]
    valid = FixedCropDataset(speech_files["valid"][:2], 16000, 1, crop_seconds=60.0)  # longer than the files: padded
    a, b = valid[0], valid[0]
    assert a.shape == (1, 960000) and torch.equal(a, b) and a.abs().sum() > 0


def _last(rows: list[dict], key: str) -> float:
    return [float(r[key]) for r in rows if r.get(key)][-1]


def test_loudness_distance_weighs_loud_bins_and_ignores_level(speech_files):
    """Zero for the signal itself, the same for a louder copy of both (a ratio), finite gradients; and
    unlike the log-mel L1, it counts an error in the loud half of a file more than the same relative
    error in a half 40 dB quieter."""
    from codec.core.audio import load_audio

    x = load_audio(speech_files["valid"][3], 16000, 1)[None][..., :32000]  # [1, 1, S] real speech
    loss = MultiScaleMelLoss(16000, (256, 1024), max_mels=(40, 160))
    log_l1, loud = loss.terms(x, x)
    assert float(log_l1) == 0 and float(loud) == 0
    assert loss(x, x) == log_l1 and loss.terms(x, x, loudness=False)[1] is None
    noisy = x + 0.05 * x.std() * torch.randn_like(x)
    assert float(loss.terms(4 * noisy, 4 * x)[1]) == pytest.approx(float(loss.terms(noisy, x)[1]), rel=1e-3)
    # a file whose first half is 40 dB quieter than its second; scale one half of it by 0.7
    two_level = torch.cat([0.01 * x[..., :16000], x[..., 16000:]], dim=-1)
    quiet_off = torch.cat([0.7 * two_level[..., :16000], two_level[..., 16000:]], dim=-1)
    loud_off = torch.cat([two_level[..., :16000], 0.7 * two_level[..., 16000:]], dim=-1)
    (log_q, loud_q), (log_l, loud_l) = loss.terms(quiet_off, two_level), loss.terms(loud_off, two_level)
    assert float(log_q) == pytest.approx(float(log_l), rel=0.15)  # the log sees the same error twice
    assert float(loud_l) > 2 * float(loud_q)  # 100^0.3 = 4 for whole frames; frames across the seam less
    y = (0.9 * x).requires_grad_(True)
    loss.terms(y, x)[1].backward()
    assert torch.isfinite(y.grad).all() and y.grad.abs().sum() > 0


def test_loudness_weight_puts_the_term_in_the_training_loss(corpus_dir, monkeypatch):
    torch.manual_seed(0)
    module = CodecModule(TINY, losses=Losses(mel_n_ffts=[256, 1024], loudness_weight=20.0), optim=Optimization(lr=3e-3))
    asked, terms = [], module.mel_loss.terms

    def recording_terms(x_hat, x, reduction="mean", loudness=True):
        asked.append(loudness and x_hat.requires_grad)
        return terms(x_hat, x, reduction, loudness)

    monkeypatch.setattr(module.mel_loss, "terms", recording_terms)
    trainer, before, after = _train_20_steps(module, corpus_dir)
    assert sum(asked) == 20  # every training step computed it, with gradient
    assert after["val/loudness"] < before["val/loudness"] and math.isfinite(after["val/loudness"])
    with pytest.raises(ValueError, match="loudness_exponent > 0"):
        Losses(loudness_exponent=0.0)
    with pytest.raises(ValueError, match="loudness_weight must be >= 0"):
        Losses(loudness_weight=-1.0)


def test_a_few_training_steps_lower_the_loss(corpus_dir):
    torch.manual_seed(0)
    module = CodecModule(TINY, losses=Losses(mel_n_ffts=[256, 1024]), optim=Optimization(lr=3e-3))
    trainer, before, after = _train_20_steps(module, corpus_dir)
    assert trainer.global_step == 20
    assert after["val/mel_distance"] < 0.8 * before["val/mel_distance"]
    assert after["val/si_sdr"] > before["val/si_sdr"]
    assert bool(module.codec.quantizer.initialized)


def _run(tmp_path: Path, corpus_dir: Path, *extra: str) -> int:
    return main(["train-codec", "--config", str(TINY_RECIPE), "--data.corpus_dir", str(corpus_dir),
                 "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
                 "--trainer.val_check_interval", "2", "--data.max_train_files", "8", *extra])


def test_train_codec_command_logs_exports_and_resumes(tmp_path, corpus_dir, speech_files):
    assert _run(tmp_path, corpus_dir, "--trainer.max_steps", "4") == 0
    run = tmp_path / "codec_tiny" / "version_0"
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    for key in ("train/loss", "train/mel", "train/commit", "train/kbps", "codebook/perplexity/c0",
                "codebook/dead_codes/c3", "codebook/entropy_norm", "val/mel_distance", "val/si_sdr",
                "val/mel_distance_k1", "train/audio_per_second"):
        assert any(r.get(key) for r in rows), key
    assert 0 < _last(rows, "train/kbps") <= 4 * 5 * 50 / 1000
    assert (run / "audio" / "original" / "0.wav").is_file()
    assert sorted(p.name for p in (run / "audio").iterdir()) == ["original", "step0000002", "step0000004"]
    codec = Codec.from_pretrained(run / "pretrained")
    wav = torch.zeros(1, 1, 3200)
    assert codec.encode(wav).shape == (1, 4, 10)

    last = run / "checkpoints" / "last.ckpt"
    assert _run(tmp_path, corpus_dir, "--trainer.max_steps", "6", "--ckpt_path", str(last)) == 0
    resumed = list(csv.DictReader(open(tmp_path / "codec_tiny" / "version_1" / "metrics.csv")))
    steps = sorted({int(r["step"]) for r in resumed if r.get("train/loss")})
    assert steps == [4, 5]  # continued from step 4, not from 0


def test_an_interrupted_codec_run_resumes_exactly(tmp_path, corpus_dir):
    """4 steps straight == 2 steps, then a resume (mid-epoch) from the step-2 checkpoint to step 4: the same
    crops (data position in the checkpoint), the same quantizer-dropout draws (RNG state in the
    checkpoint), so the same weights bit for bit."""
    from safetensors.torch import load_file

    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--data.crop_seconds", "0.2", "--model.codec.quantizer.dropout", "1.0", "--data.items_per_epoch", "24")
    assert _run(straight, corpus_dir, "--trainer.max_steps", "4", *common) == 0
    assert _run(split, corpus_dir, "--trainer.max_steps", "2", *common) == 0
    last = split / "codec_tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert _run(split, corpus_dir, "--trainer.max_steps", "4", "--ckpt_path", str(last), *common) == 0
    a = load_file(str(straight / "codec_tiny" / "version_0" / "pretrained" / "model.safetensors"))
    b = load_file(str(split / "codec_tiny" / "version_1" / "pretrained" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [{int(r["step"]): r["train/loss"] for r in csv.DictReader(open(run / "metrics.csv")) if r.get("train/loss")}
              for run in (straight / "codec_tiny" / "version_0", split / "codec_tiny" / "version_1")]
    assert losses[1] and all(losses[0][k] == v for k, v in losses[1].items())


def test_adversarial_training_exports_the_discriminator(tmp_path, corpus_dir):
    assert _run(tmp_path, corpus_dir, "--trainer.max_steps", "3", "--model.adversarial.enabled", "true",
                "--model.adversarial.start_step", "1", "--model.adversarial.filters", "4",
                "--model.adversarial.n_ffts", "[256, 128]") == 0
    run = tmp_path / "codec_tiny" / "version_0"
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    disc_steps = sorted(int(r["step"]) for r in rows if r.get("train/disc"))
    assert disc_steps == [1, 2]  # off before adversarial_start_step; global_step counts codec steps only
    disc = load_discriminator(run / "pretrained" / "discriminator.safetensors")
    assert len(disc.discriminators) == 2 and disc.config["n_ffts"] == [256, 128] and disc.config["filters"] == 4
    logits, features = disc(torch.randn(1, 1, 4000))
    assert len(logits) == 2 and len(features[0]) == 5
    Codec.from_pretrained(run / "pretrained")  # the discriminator file does not disturb loading


def test_train_codec_command_with_the_istft_decoder_and_mel_bands(tmp_path, corpus_dir):
    assert _run(tmp_path, corpus_dir, "--trainer.max_steps", "2", "--model.codec.decoder",
                '{"kind": "istft", "dim": 16, "layers": 1}',
                "--model.losses.mel_max_mels", "[40, 160]", "--model.losses.mel_n_ffts", "[256, 1024]") == 0
    codec = Codec.from_pretrained(tmp_path / "codec_tiny" / "version_0" / "pretrained")
    assert codec.config.decoder.kind == "istft" and codec.decode(torch.zeros(1, 4, 3, dtype=torch.long)).shape == (1, 1, 960)
    config = json.loads((tmp_path / "codec_tiny" / "version_0" / "pretrained" / "config.json").read_text())
    assert config["format_version"] == 2 and config["decoder"] == {"kind": "istft", "dim": 16, "layers": 1, "hop": 160,
                                                                   "n_fft": 640}


def test_train_codec_reports_bad_recipe_values(tmp_path, corpus_dir, capsys):
    assert _run(tmp_path, corpus_dir, "--model.codec.quantizer.n_codebooks", "zero") == 2
    assert capsys.readouterr().err == ("rvqlm train-codec: error: quantizer.n_codebooks must be a positive integer, "
                                       "got 'zero'; see rvqlm train-codec --help\n")


def test_learning_rate_cooldown_schedule_and_resume_with_new_settings(tmp_path, corpus_dir):
    module = CodecModule(TINY, optim=Optimization(lr=1e-3, decay_start=10, decay_steps=20, min_lr_ratio=0.1))
    f = module.lr_factor
    assert f(0) == f(10) == 1.0
    assert abs(f(20) - 0.55) < 1e-9  # half way down the half cosine from 1 to 0.1
    assert abs(f(30) - 0.1) < 1e-9 and abs(f(1000) - 0.1) < 1e-9
    assert CodecModule(TINY, optim=Optimization(lr_gamma=0.5)).lr_factor(3) == 0.125
    warm = CodecModule(TINY, optim=Optimization(warmup_steps=4, decay_start=10, decay_steps=20)).lr_factor
    assert [warm(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert abs(warm(20) - 0.55) < 1e-9  # the warm-up leaves the cool-down as it was
    # A run resumed with a cooldown follows it from its current step.
    assert _run(tmp_path, corpus_dir, "--trainer.max_steps", "2") == 0
    last = tmp_path / "codec_tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert _run(tmp_path, corpus_dir, "--trainer.max_steps", "4", "--ckpt_path", str(last),
                "--model.optim.decay_start", "2", "--model.optim.decay_steps", "2", "--model.optim.min_lr_ratio", "0.1") == 0
    rows = list(csv.DictReader(open(tmp_path / "codec_tiny" / "version_1" / "metrics.csv")))
    lrs = {int(r["step"]): float(r["train/lr"]) for r in rows if r.get("train/lr")}
    base = float(next(r["train/lr"] for r in csv.DictReader(open(tmp_path / "codec_tiny" / "version_0" / "metrics.csv"))
                      if r.get("train/lr")))
    assert lrs, rows
    assert all(lr <= base + 1e-12 for lr in lrs.values()) and min(lrs.values()) < base


def test_init_from_a_saved_codec_continues_its_weights_and_refuses_another_architecture(tmp_path, corpus_dir):
    assert _run(tmp_path / "a", corpus_dir, "--trainer.max_steps", "2") == 0
    saved = tmp_path / "a" / "codec_tiny" / "version_0" / "pretrained"
    start = Codec.from_pretrained(saved)
    config = start.config.to_dict()
    module = CodecModule(config, init_from=str(saved))
    assert all(torch.equal(v, start.state_dict()[k]) for k, v in module.codec.state_dict().items())
    assert _run(tmp_path / "b", corpus_dir, "--trainer.max_steps", "1", "--model.init_from", str(saved)) == 0
    with pytest.raises(ValueError, match="init_from .* differs from this recipe's in quantizer"):
        CodecModule({**config, "quantizer": {**config["quantizer"], "n_codebooks": 5}}, init_from=str(saved))


def test_a_new_decoder_for_a_saved_codecs_tokens(tmp_path):
    """train_decoder_only with other decoder settings: the encoder and quantizer come from init_from
    (same tokens, same token fingerprint), the decoder starts fresh; without train_decoder_only, or
    with a setting that shapes the tokens, it is refused."""
    torch.manual_seed(0)
    config = CodecConfig.from_dict({**TINY.to_dict(), "decoder": {"kind": "istft", "dim": 16, "layers": 1}})
    saved = Codec(config).eval().save_pretrained(tmp_path / "small")
    start = Codec.from_pretrained(saved)
    wider = {**config.to_dict(), "decoder": {"kind": "istft", "dim": 24, "layers": 2}}
    module = CodecModule(wider, init_from=str(saved), train_decoder_only=True)
    codec = module.codec.eval()
    wav = torch.randn(1, 1, 3200) * 0.1
    assert torch.equal(codec.encode(wav), start.encode(wav))
    assert codec.token_fingerprint() == start.token_fingerprint()
    assert codec.decoder.head.in_features == 24 and len(codec.decoder.blocks) == 2
    with pytest.raises(ValueError, match="only the decoder may differ, with train_decoder_only"):
        CodecModule(wider, init_from=str(saved))
    with pytest.raises(ValueError, match="latent_dim \\(16 vs 8\\)"):
        CodecModule({**wider, "latent_dim": 8}, init_from=str(saved), train_decoder_only=True)


def test_decoder_only_fine_tune_keeps_the_tokens(tmp_path, corpus_dir):
    """train_decoder_only: the decoder (and discriminator) learn; encoder weights and the quantizer's
    codebooks and EMA statistics stay bit for bit, so tokens and the token fingerprint are kept."""
    assert _run(tmp_path / "a", corpus_dir, "--trainer.max_steps", "2") == 0
    saved = tmp_path / "a" / "codec_tiny" / "version_0" / "pretrained"
    start = Codec.from_pretrained(saved)
    assert _run(tmp_path / "b", corpus_dir, "--trainer.max_steps", "3", "--model.init_from", str(saved),
                "--model.train_decoder_only", "true", "--model.adversarial.enabled", "true",
                "--model.adversarial.filters", "4", "--model.optim.lr", "1e-2") == 0
    tuned = Codec.from_pretrained(tmp_path / "b" / "codec_tiny" / "version_0" / "pretrained")
    before, after = start.state_dict(), tuned.state_dict()
    kept = [k for k in before if not k.startswith("decoder.")]
    assert kept and all(torch.equal(before[k], after[k]) for k in kept)
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("decoder."))
    assert tuned.token_fingerprint() == start.token_fingerprint() and tuned.fingerprint() != start.fingerprint()
    wav = torch.randn(1, 1, 3200) * 0.1
    assert torch.equal(tuned.encode(wav), start.encode(wav))
    with pytest.raises(ValueError, match="train_decoder_only needs init_from"):
        CodecModule(start.config, train_decoder_only=True)


def test_training_settings_check_their_values_and_read_back_from_checkpoints():
    """Each group refuses bad values in one line; a module's hparams hold each group as a plain dict
    that builds the same settings again (as export_checkpoint does)."""
    from codec.neural.training_config import Adversarial, as_settings

    with pytest.raises(ValueError, match="at least one STFT scale"):
        Adversarial(enabled=True, n_ffts=[])
    with pytest.raises(ValueError, match="betas must be two numbers"):
        Optimization(betas=[0.9])
    with pytest.raises(ValueError, match="decay_steps >= 1"):
        Optimization(decay_steps=0)
    with pytest.raises(ValueError, match="unknown Losses settings \\[.lr.\\]"):
        as_settings(Losses, {"lr": 1e-3})
    with pytest.raises(ValueError, match="expected a JSON object of Adversarial settings"):
        as_settings(Adversarial, True)
    module = CodecModule(TINY, losses=Losses(mel_n_ffts=(256, 1024), loudness_weight=2.0),
                         adversarial=Adversarial(enabled=True, filters=4, n_ffts=(256, 128)), optim=Optimization(lr=1e-3))
    hp = module.hparams
    assert hp["losses"]["mel_n_ffts"] == [256, 1024] and hp["adversarial"]["n_ffts"] == [256, 128]
    again = CodecModule(hp["codec"], losses=hp["losses"], adversarial=hp["adversarial"], optim=hp["optim"])
    assert (again.losses, again.adversarial, again.optim) == (module.losses, module.adversarial, module.optim)
    assert len(again.discriminator.discriminators) == 2
