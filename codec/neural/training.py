"""Lightning training of the codec, and the `rvqlm train-codec` entry point (LightningCLI).

`CodecModule` trains with manual optimization: one AdamW for the codec and, when adversarial
training is on (from `adversarial.start_step`), a second one for the discriminator (hinge loss; the
codec adds hinge + feature-matching terms). `trainer.global_step` counts codec steps only. Each step
logs the losses, the bitrate used (quantizer dropout varies it), per-codebook usage and seconds of
audio per second; validation logs mel distance, SI-SDR, L1 and loudness at the full bitrate,
mel distance with fewer codebooks, and a few audio examples.

After `fit`, `train_codec` exports the best checkpoint (lowest validation mel distance, else the
last weights) with `Codec.save_pretrained` to `<run dir>/pretrained/`, discriminator included.
"""

from __future__ import annotations

import inspect
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from codec.core.audio import save_audio
from codec.neural.data import CodecDataModule
from codec.core.discriminator import (CodecDiscriminator, discriminator_hinge_loss, feature_matching_loss,
                                      generator_hinge_loss, load_discriminator)
from codec.core.config import CodecConfig
from codec.core.model import DISCRIMINATOR_NAME, Codec
from codec.neural.losses import MultiScaleMelLoss, mel_distance, si_sdr, waveform_l1
from codec.neural.training_config import Adversarial, CodecSettings, Losses, Optimization, as_settings, settings_dict
from rvqlm_core.rng_state import ResumesRngState
from rvqlm_core.run_folder import ShortParseErrors


class StepScheduleLR(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR whose factor is a method of the module: rebuilt from the run's settings, never pickled."""

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict: dict) -> None:
        state = {k: v for k, v in state_dict.items() if k != "lr_lambdas"}
        self.__dict__.update(state)


class CodecModule(ResumesRngState, L.LightningModule):
    """The codec plus its losses (and optional discriminator), trained on batches wav [B, C, S].

    codec: the architecture (a CodecConfig, or its nested settings as recipes (`CodecSettings`) and
    checkpoints (a dict) hold them; None: the defaults, the shipped codec's).
    losses, adversarial, optim: `codec.neural.training_config.Losses`, `Adversarial`, `Optimization` (or
    dicts of their fields).
    init_from: a saved codec folder whose weights (codebooks and EMA statistics included) the run
    starts from; the step count and schedule start at 0 (see `_load_initial_weights`).
    train_decoder_only: train the decoder alone (needs init_from): the encoder gets no gradient and
    the quantizer is frozen, so the tokens and `token_fingerprint` stay those of `init_from`.
    """

    def __init__(self, codec: Optional[CodecSettings] = None, losses: Losses = Losses(),
                 adversarial: Adversarial = Adversarial(), optim: Optimization = Optimization(),
                 audio_examples: int = 2, init_from: Optional[str] = None, train_decoder_only: bool = False):
        super().__init__()
        config = codec_config(codec)
        self.losses = as_settings(Losses, losses)
        self.adversarial = as_settings(Adversarial, adversarial)
        self.optim = as_settings(Optimization, optim)
        # Checkpoints hold only plain types (they load with torch.load(weights_only=True)).
        self.save_hyperparameters(ignore=["codec", "losses", "adversarial", "optim"])
        self.hparams.update(codec=config.to_dict(), losses=settings_dict(self.losses),
                            adversarial=settings_dict(self.adversarial), optim=settings_dict(self.optim))
        self.automatic_optimization = False
        self.codec = Codec(config)
        self.mel_loss = MultiScaleMelLoss(config.sample_rate, self.losses.mel_n_ffts, self.losses.mel_max_mels,
                                          loudness_exponent=self.losses.loudness_exponent)
        adv = self.adversarial
        self.discriminator = CodecDiscriminator(adv.n_ffts, config.channels, adv.filters) if adv.enabled else None
        self._last_step_end: float | None = None
        self._originals_written = False
        if train_decoder_only and init_from is None:
            raise ValueError("train_decoder_only needs init_from: a trained codec whose encoder and "
                             "quantizer (its tokens) the decoder is fine-tuned for")
        if init_from is not None:
            self._load_initial_weights(init_from, new_decoder_allowed=train_decoder_only)
        if train_decoder_only:
            self.codec.encoder.requires_grad_(False)
            self.codec.quantizer.frozen = True

    def _load_initial_weights(self, folder: str, new_decoder_allowed: bool = False) -> None:
        """Start from a saved codec with fresh optimizer state. Its config must be this recipe's,
        except that with `new_decoder_allowed` the decoder may differ, in kind or settings: the
        encoder and quantizer are taken, and the new decoder learns their tokens from scratch."""
        start = Codec.from_pretrained(folder)
        mine, theirs = self.codec.config.to_dict(), start.config.to_dict()
        differ = sorted(k for k in mine if mine[k] != theirs[k])
        if differ and not (differ == ["decoder"] and new_decoder_allowed):
            hint = "" if new_decoder_allowed else " (only the decoder may differ, with train_decoder_only)"
            raise ValueError(f"init_from {folder}: its codec differs from this recipe's in "
                             + ", ".join(f"{k} ({theirs[k]!r} vs {mine[k]!r})" for k in differ) + hint)
        # A new decoder starts fresh: the encoder's and quantizer's tensors are taken (same names and shapes).
        self.codec.load_state_dict({k: v for k, v in start.state_dict().items()
                                    if not (differ and k.startswith("decoder."))}, strict=not differ)

    # ------------------------------------------------------------------ optimization

    def configure_optimizers(self):
        o = self.optim
        trained = [p for p in self.codec.parameters() if p.requires_grad]  # decoder only, when so set
        opt_g = torch.optim.AdamW(trained, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        sched_g = StepScheduleLR(opt_g, self.lr_factor)
        if self.discriminator is None:
            return [opt_g], [sched_g]
        opt_d = torch.optim.AdamW(self.discriminator.parameters(), lr=self.adversarial.disc_lr, betas=tuple(o.betas))
        sched_d = StepScheduleLR(opt_d, self.lr_factor)
        return [opt_g, opt_d], [sched_g, sched_d]

    def lr_factor(self, step: int) -> float:
        """The learning-rate multiplier at optimizer step `step` (`Optimization.lr_factor`)."""
        return self.optim.lr_factor(step)

    def _step(self, optimizer, scheduler, loss: torch.Tensor, counted: bool) -> None:
        """Backward, clip, and step one optimizer and its schedule. Only the codec's step is
        `counted` in trainer.global_step: the discriminator steps its raw optimizer (Lightning
        counts every LightningOptimizer.step in manual optimization)."""
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if self.optim.grad_clip:
            self.clip_gradients(optimizer, gradient_clip_val=self.optim.grad_clip, gradient_clip_algorithm="norm")
        (optimizer if counted else optimizer.optimizer).step()
        scheduler.step()

    # ------------------------------------------------------------------ training

    def _adversarial_now(self) -> bool:
        return self.discriminator is not None and self.global_step >= self.adversarial.start_step

    def _reconstruction_loss(self, out, wav: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The codec's loss without the adversarial terms, and its parts to log."""
        w = self.losses
        mel, loudness = self.mel_loss.terms(out.audio, wav, loudness=w.loudness_weight > 0)
        l1 = waveform_l1(out.audio, wav)
        commit = out.quantizer.commit_loss
        loss = w.mel_weight * mel + w.l1_weight * l1 + commit
        logs = {"train/mel": mel, "train/l1": l1, "train/commit": commit}
        if w.loudness_weight > 0:
            loss = loss + w.loudness_weight * loudness
            logs["train/loudness"] = loudness
        return loss, logs

    def _adversarial_loss(self, wav: torch.Tensor, recon: torch.Tensor, opt_d, sched_d) -> tuple[torch.Tensor, dict]:
        """One discriminator step, then the codec's adversarial terms (weighted) and their logs."""
        real_logits, _ = self.discriminator(wav)
        fake_logits, _ = self.discriminator(recon.detach())
        loss_d = discriminator_hinge_loss(real_logits, fake_logits)
        self._step(opt_d, sched_d, loss_d, counted=False)
        self.discriminator.requires_grad_(False)
        with torch.no_grad():
            _, real_features = self.discriminator(wav)
        fake_logits, fake_features = self.discriminator(recon)
        adv = generator_hinge_loss(fake_logits)
        feat = feature_matching_loss(real_features, fake_features)
        self.discriminator.requires_grad_(True)
        loss = self.adversarial.adv_weight * adv + self.adversarial.feat_weight * feat
        return loss, {"train/disc": loss_d, "train/adv": adv, "train/feat": feat}

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        optimizers, schedulers = self.optimizers(), self.lr_schedulers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        schedulers = schedulers if isinstance(schedulers, list) else [schedulers]
        wav = batch  # [B, C, S]
        out = self.codec(wav)
        loss, logs = self._reconstruction_loss(out, wav)
        if self._adversarial_now():
            adv_loss, adv_logs = self._adversarial_loss(wav, out.audio, optimizers[1], schedulers[1])
            loss = loss + adv_loss
            logs.update(adv_logs)
        self._step(optimizers[0], schedulers[0], loss, counted=True)
        self._log_step(loss, logs, out.quantizer.metrics, wav, optimizers[0])
        return loss.detach()

    def _log_step(self, loss: torch.Tensor, logs: dict, metrics: dict, wav: torch.Tensor, opt_g) -> None:
        """Log a training step: losses, bitrate, learning rate, codebook usage and throughput."""
        logs["train/loss"] = loss
        logs["train/kbps"] = self.codec.bitrate_kbps(float(metrics["n_q"]))
        logs["train/lr"] = opt_g.param_groups[0]["lr"]
        logs.update({f"codebook/{k}": v for k, v in metrics.items() if k != "n_q"})
        now = time.perf_counter()
        if self._last_step_end is not None:
            audio_seconds = wav.shape[0] * wav.shape[-1] / self.codec.sample_rate
            logs["train/step_seconds"] = now - self._last_step_end
            logs["train/audio_per_second"] = audio_seconds / max(now - self._last_step_end, 1e-9)
        self._last_step_end = now
        self.log_dict(logs, on_step=True, on_epoch=False, batch_size=wav.shape[0])
        self.log("loss", loss, prog_bar=True, on_step=True, on_epoch=False, logger=False, batch_size=wav.shape[0])

    # ------------------------------------------------------------------ validation

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        wav = batch
        out = self.codec(wav)
        recon = out.audio
        n = wav.shape[0]
        logs = {
            "val/mel_distance": mel_distance(recon, wav, self.codec.sample_rate).mean(),
            "val/si_sdr": si_sdr(recon, wav).mean(),
            "val/l1": waveform_l1(recon, wav),
            "val/loudness": self.mel_loss.terms(recon, wav)[1],
            "val/commit": out.quantizer.commit_loss,
            "val/kbps": self.codec.bitrate_kbps(),
        }
        for k in sorted({1, self.codec.n_codebooks // 2} - {0, self.codec.n_codebooks}):
            recon_k = self.codec(wav, n_q=k).audio
            logs[f"val/mel_distance_k{k}"] = mel_distance(recon_k, wav, self.codec.sample_rate).mean()
        self.log_dict(logs, on_step=False, on_epoch=True, batch_size=n)
        self.log("val_mel", logs["val/mel_distance"], prog_bar=True, on_epoch=True, logger=False, batch_size=n)
        if batch_idx == 0 and not self.trainer.sanity_checking:
            self._write_audio_examples(wav, recon)

    def _write_audio_examples(self, wav: torch.Tensor, recon: torch.Tensor) -> None:
        """A few originals (once) and reconstructions: TensorBoard audio, or wav files under
        `<log dir>/audio/` for other loggers."""
        n = min(self.hparams.audio_examples, wav.shape[0])
        if n <= 0 or self.logger is None:  # no logger, no log folder: never write into the cwd
            return
        sr, step = self.codec.sample_rate, self.global_step
        if isinstance(self.logger, TensorBoardLogger):
            writer = self.logger.experiment
            for i in range(n):  # TensorBoard audio is mono [1, S]
                if not self._originals_written:
                    writer.add_audio(f"audio/{i}/original", wav[i].mean(0, keepdim=True).clamp(-1, 1).cpu(), step, sr)
                writer.add_audio(f"audio/{i}/reconstruction", recon[i].mean(0, keepdim=True).clamp(-1, 1).cpu(), step, sr)
        else:
            folder = Path(self.trainer.log_dir or self.trainer.default_root_dir) / "audio"
            for i in range(n):
                if not self._originals_written:
                    save_audio(folder / "original" / f"{i}.wav", wav[i], sr)
                save_audio(folder / f"step{step:07d}" / f"{i}.wav", recon[i], sr)
        self._originals_written = True


# ---------------------------------------------------------------------------- export and entry point


def export_pretrained(module: CodecModule, dest: str | Path, checkpoint: str | Path | None = None) -> Path:
    """Save `module`'s codec (+ discriminator) with save_pretrained; from `checkpoint` if given.

    The checkpoint is read with torch.load(weights_only=True): tensors and plain types only.
    """
    if checkpoint:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
        module.load_state_dict(state)
    return module.codec.save_pretrained(dest, discriminator=module.discriminator)


def export_checkpoint(checkpoint: str | Path, dest: str | Path, decoder_dtype: str | None = None) -> Path:
    """Export any Lightning checkpoint of a codec run (e.g. `last.ckpt` of a run still going) to a
    `from_pretrained` folder, discriminator included. Loads with weights_only=True (no pickle).

    `checkpoint` may also be a saved codec folder: it is written again, e.g. with its decoder in
    half precision (`decoder_dtype`, see `Codec.save_pretrained`; the tokens stay the same).
    """
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        codec = Codec.from_pretrained(checkpoint)
        disc_path = checkpoint / DISCRIMINATOR_NAME
        discriminator = load_discriminator(disc_path) if disc_path.is_file() else None
        return codec.save_pretrained(dest, discriminator=discriminator, decoder_dtype=decoder_dtype)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"no checkpoint at {checkpoint}")
    try:
        ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a corrupt or non-checkpoint file
        raise ValueError(f"{checkpoint} is not a readable Lightning checkpoint: {e}") from None
    if "hyper_parameters" not in ckpt or "state_dict" not in ckpt:
        raise ValueError(f"{checkpoint} is not a codec training checkpoint (no hyper_parameters/state_dict)")
    # LightningCLI adds its own keys (_instantiator, _class_path) to the saved hyperparameters.
    accepted = inspect.signature(CodecModule.__init__).parameters
    module = CodecModule(**{k: v for k, v in ckpt["hyper_parameters"].items() if k in accepted and k != "self"})
    module.load_state_dict(ckpt["state_dict"])
    return module.codec.save_pretrained(dest, discriminator=module.discriminator, decoder_dtype=decoder_dtype)


class CodecCLI(ShortParseErrors, LightningCLI):
    """LightningCLI without subcommands: parses a recipe, then `train_codec` runs fit + export."""

    help_command = "rvqlm train-codec --help"

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.codec", "data.sample_rate", compute_fn=_codec_setting("sample_rate"))
        parser.link_arguments("model.codec", "data.channels", compute_fn=_codec_setting("channels"))
        parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                            help="resume training from this Lightning checkpoint")
        parser.add_argument("--export_dir", type=Optional[str], default=None,
                            help="where to save the trained codec (default: <run dir>/pretrained)")


def codec_config(codec: "CodecConfig | CodecSettings | dict | None") -> CodecConfig:
    """`CodecModule`'s codec argument (or a recipe's `model.codec` as parsed) as a CodecConfig."""
    if isinstance(codec, CodecConfig):
        return codec
    if hasattr(codec, "as_dict"):  # a jsonargparse Namespace (of the settings or, once linked, their class)
        codec = codec.as_dict()
        codec = codec.get("init_args", codec)
    settings = codec.to_dict() if isinstance(codec, CodecSettings) else dict(codec or {})
    return CodecConfig.from_dict({k: v for k, v in settings.items() if v is not None}, source="model.codec")


def _codec_setting(name: str):
    """A recipe's `model.codec` -> its `name` setting (CodecConfig checks them all)."""
    return lambda codec: getattr(codec_config(codec), name)


def train_codec(args: Sequence[str]) -> Path:
    """`rvqlm train-codec ARGS`: parse a recipe + overrides, fit, export; returns the export folder."""
    with warnings.catch_warnings():
        # We pass `args` on purpose (sys.argv holds `rvqlm train-codec ...`); Lightning warns about that.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = CodecCLI(CodecModule, CodecDataModule, args=list(args), run=False, seed_everything_default=0,
                       save_config_kwargs={"overwrite": True}, parser_kwargs={"prog": "rvqlm train-codec"})
    trainer = cli.trainer
    trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path, weights_only=True)
    callback = trainer.checkpoint_callback
    best = getattr(callback, "best_model_path", "") if callback is not None else ""
    run_dir = Path(trainer.log_dir or trainer.default_root_dir)
    dest = Path(cli.config.export_dir) if cli.config.export_dir else run_dir / "pretrained"
    out = export_pretrained(cli.model, dest, best or None)
    print(f"codec saved to {out} ({'best checkpoint ' + str(best) if best else 'final weights'})")
    return out
