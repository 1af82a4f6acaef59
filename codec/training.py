"""Lightning training of the codec, and the `rvqlm train-codec` entry point (LightningCLI).

`CodecModule` trains with manual optimization: one optimizer for the codec and, when
`adversarial` is on (from `adversarial_start_step`), a second one for the multi-scale STFT
discriminator (hinge loss; the codec adds hinge + feature-matching terms). `trainer.global_step`
counts codec steps only. Every step logs the losses, the bitrate actually used (quantizer
dropout varies it), per-codebook usage (perplexity, normalized entropy, dead codes) and the
throughput in seconds of audio per second; validation logs mel distance, SI-SDR, L1 and the phase loss at the
full bitrate and mel distance with fewer codebooks, and writes a few audio examples (TensorBoard
`add_audio`, or wav files under `<log dir>/audio/` for other loggers).

After `fit`, `train_codec` exports the best checkpoint (lowest validation mel distance, else the
last weights) with `Codec.save_pretrained` to `<run dir>/pretrained/`, discriminator included.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from codec.audio import save_audio
from codec.data import CodecDataModule
from codec.discriminator import (CodecDiscriminator, discriminator_hinge_loss, feature_matching_loss,
                                 generator_hinge_loss, load_discriminator)
from codec.losses import MultiScaleMelLoss, PhaseDerivativeLoss, mel_distance, si_sdr, waveform_l1
from codec.model import DECODER_SETTINGS, DISCRIMINATOR_NAME, Codec, CodecConfig
from rvqlm_core.rng_state import get_rng_state, set_rng_state


class StepScheduleLR(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR whose factor is a method of the module (rebuilt from the run's settings, never
    pickled), and that also resumes checkpoints written while the schedule was an ExponentialLR."""

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict: dict) -> None:
        state = {k: v for k, v in state_dict.items() if k not in ("lr_lambdas", "gamma")}
        self.__dict__.update(state)


class CodecModule(L.LightningModule):
    """The codec plus its losses (and optional discriminator), trained on batches wav [B, C, S].

    adversarial: train against a `codec.discriminator.CodecDiscriminator` from
    `adversarial_start_step` on: multi-scale STFT discriminators at `disc_n_ffts` (`disc_filters`
    wide) and multi-period ones at `disc_periods` (`disc_period_filters` wide); either list may be
    empty, not both.

    codec: the architecture (a CodecConfig; a dict of its fields is accepted too, as stored in
    checkpoints). Loss weights: mel_weight * multi-scale log-mel L1 + l1_weight * waveform L1 +
    commitment (weighted by codec.commitment_weight) [+ loudness_weight * a loudness-scale distance
    on the log-mel term's spectrograms, |M|^loudness_exponent (codec.losses.MultiScaleMelLoss.terms;
    0: off, logged as val/loudness either way)] [+ phase_weight * phase-derivative loss at
    phase_n_fft / phase_hop (codec.losses.PhaseDerivativeLoss; 0: off), on the output waveform
    (`phase_on="output"`) or on the iSTFT decoder's predicted spectra before overlap-add
    (`phase_on="spectrum"`: phase_n_fft / phase_hop must then be the decoder's)] [+ adv_weight *
    hinge + feat_weight * feature matching]. Learning rate at step s: lr * warmup(s) * lr_gamma**s * cooldown(s), where
    warmup rises linearly from 1 / lr_warmup_steps to 1 over the first `lr_warmup_steps` steps (0:
    none; useful with init_from, whose optimizer starts without moment estimates), cooldown is 1
    until `lr_decay_start` (None: never) and then falls along a half cosine to `lr_min_ratio` over
    `lr_decay_steps` steps (and stays there). The schedule is a pure function of the step and these
    settings, so a run resumed with new decay settings follows them from its current step.
    init_from: a saved codec folder whose weights (codebooks and their EMA statistics included)
    the run starts from; the step count and schedule start at 0.
    train_decoder_only: train the decoder alone (needs init_from): the encoder gets no gradient and
    the quantizer is frozen (no EMA update, no k-means, no code revival; quantizer dropout still
    applies), so the codec's tokens, and its `token_fingerprint`, stay those of `init_from`: token
    shards, `.rvq` files and language models made with it remain valid for the fine-tuned codec.
    """

    def __init__(self, codec: CodecConfig = CodecConfig(), lr: float = 3e-4, betas: Sequence[float] = (0.8, 0.99),
                 weight_decay: float = 0.0, lr_gamma: float = 1.0, lr_warmup_steps: int = 0,
                 lr_decay_start: Optional[int] = None,
                 lr_decay_steps: int = 1, lr_min_ratio: float = 0.1, grad_clip: Optional[float] = 1000.0,
                 mel_weight: float = 15.0, l1_weight: float = 1.0, mel_n_ffts: Sequence[int] = (256, 512, 1024, 2048),
                 mel_max_mels: int | Sequence[int] = 80, loudness_weight: float = 0.0,
                 loudness_exponent: float = 0.3, phase_weight: float = 0.0, phase_n_fft: int = 320,
                 phase_hop: int = 80, phase_on: str = "output",
                 adversarial: bool = False, adversarial_start_step: int = 0, adv_weight: float = 1.0,
                 feat_weight: float = 2.0, disc_lr: float = 3e-4, disc_n_ffts: Sequence[int] = (1024, 512, 256),
                 disc_filters: int = 32, disc_periods: Sequence[int] = (), disc_period_filters: int = 16,
                 audio_examples: int = 2, init_from: Optional[str] = None,
                 train_decoder_only: bool = False):
        super().__init__()
        config = codec if isinstance(codec, CodecConfig) else CodecConfig.from_dict(dict(codec or {}))
        # Checkpoints hold only plain types (they load with torch.load(weights_only=True)).
        self.save_hyperparameters(ignore=["codec"])
        self.hparams["codec"] = config.to_dict()
        self.hparams["betas"] = list(betas)
        self.hparams["mel_n_ffts"], self.hparams["disc_n_ffts"] = list(mel_n_ffts), list(disc_n_ffts)
        self.hparams["disc_periods"] = list(disc_periods)
        self.hparams["mel_max_mels"] = mel_max_mels if isinstance(mel_max_mels, int) else list(mel_max_mels)
        self.automatic_optimization = False
        self.codec = Codec(config)
        self.mel_loss = MultiScaleMelLoss(config.sample_rate, mel_n_ffts, mel_max_mels,
                                          loudness_exponent=loudness_exponent)
        self.phase_loss = PhaseDerivativeLoss(phase_n_fft, phase_hop)  # a loss when phase_weight > 0, else a metric
        if loudness_weight < 0 or not loudness_exponent > 0:
            raise ValueError(f"loudness_weight must be >= 0 and loudness_exponent > 0, got {loudness_weight} "
                             f"and {loudness_exponent}")
        if phase_on not in ("output", "spectrum"):
            raise ValueError(f"phase_on must be 'output' or 'spectrum', got {phase_on!r}")
        if phase_on == "spectrum" and (config.decoder != "istft" or (phase_n_fft, phase_hop) != (
                config.istft_window, config.istft_hop)):
            raise ValueError("phase_on='spectrum' needs the iSTFT decoder, with phase_n_fft = its istft_n_fft "
                             f"({config.istft_window}) and phase_hop = istft_hop ({config.istft_hop})")
        self.discriminator = (CodecDiscriminator(disc_n_ffts, config.channels, disc_filters, periods=disc_periods,
                                                 period_filters=disc_period_filters) if adversarial else None)
        self._last_step_end: float | None = None
        self._originals_written = False
        self._rng_to_restore: dict | None = None
        if init_from is not None:
            self._load_initial_weights(init_from, new_decoder_allowed=train_decoder_only)
        if train_decoder_only:
            if init_from is None:
                raise ValueError("train_decoder_only needs init_from: a trained codec whose encoder and "
                                 "quantizer (its tokens) the decoder is fine-tuned for")
            self.codec.encoder.requires_grad_(False)
            self.codec.quantizer.frozen = True

    def _load_initial_weights(self, folder: str, new_decoder_allowed: bool = False) -> None:
        """Start from a saved codec (continue training it with fresh optimizer state, e.g. when its
        run's Lightning checkpoints are gone). Its architecture must be this recipe's, except that
        an istft_phase "angle" codec may start an "angle_vector" one (same function at step 0), a
        SEANet encoder may start a wider one (more `encoder_channels`, same function at step 0:
        `SEANetEncoder.grow_from`; not with train_decoder_only, which keeps the encoder), and
        with `new_decoder_allowed` (train_decoder_only) the decoder settings may differ: the encoder
        and quantizer are taken, and a new decoder learns their tokens from scratch."""
        start = Codec.from_pretrained(folder)
        mine, theirs = self.codec.config.to_dict(), start.config.to_dict()
        differ = sorted(k for k in mine if mine[k] != theirs[k])
        # An "angle" iSTFT head may grow phase vectors, starting as the same decoder.
        grows_vectors = differ == ["istft_phase"] and (theirs["istft_phase"], mine["istft_phase"]) == (
            "angle", "angle_vector") and mine["decoder"] == "istft"
        new_decoder = bool(differ) and not grows_vectors and new_decoder_allowed and set(differ) <= set(DECODER_SETTINGS)
        # A SEANet encoder may grow wider (more base channels), starting as the same function.
        grows_encoder = (differ == ["encoder_channels"] and mine["encoder"] == "seanet" and not new_decoder_allowed
                         and mine["encoder_channels"] > theirs["encoder_channels"])
        if differ and not (grows_vectors or new_decoder or grows_encoder):
            hint = "" if new_decoder_allowed else " (only the decoder may differ, with train_decoder_only)"
            raise ValueError(f"init_from {folder}: its codec differs from this recipe's in "
                             + ", ".join(f"{k} ({theirs[k]!r} vs {mine[k]!r})" for k in differ) + hint)
        state = start.state_dict()
        if new_decoder:
            self._load_all_but("decoder.", state, folder)
        elif grows_encoder:
            self._load_all_but("encoder.", state, folder)
            self.codec.encoder.grow_from(start.encoder)
        elif grows_vectors:
            weight, bias = state.pop("decoder.head.weight"), state.pop("decoder.head.bias")
            missing, unexpected = self.codec.load_state_dict(state, strict=False)
            if sorted(missing) != ["decoder.head.bias", "decoder.head.weight"] or unexpected:
                raise ValueError(f"init_from {folder}: unexpected tensors {unexpected} / missing {missing}")
            self.codec.decoder.from_angle_head(weight, bias)
        else:
            self.codec.load_state_dict(state)

    def _load_all_but(self, prefix: str, state: dict[str, torch.Tensor], folder: str) -> None:
        """Load every tensor of `state` outside `prefix` (e.g. "decoder."), which the caller fills."""
        kept = {k: v for k, v in state.items() if not k.startswith(prefix)}
        missing, unexpected = self.codec.load_state_dict(kept, strict=False)
        if unexpected or any(not k.startswith(prefix) for k in missing):
            raise ValueError(f"init_from {folder}: unexpected tensors {unexpected} / missing {missing}")

    # ------------------------------------------------------------------ optimization

    def configure_optimizers(self):
        hp = self.hparams
        trained = [p for p in self.codec.parameters() if p.requires_grad]  # decoder only, when so set
        opt_g = torch.optim.AdamW(trained, lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        sched_g = StepScheduleLR(opt_g, self.lr_factor)
        if self.discriminator is None:
            return [opt_g], [sched_g]
        opt_d = torch.optim.AdamW(self.discriminator.parameters(), lr=hp.disc_lr, betas=tuple(hp.betas))
        sched_d = StepScheduleLR(opt_d, self.lr_factor)
        return [opt_g, opt_d], [sched_g, sched_d]

    def lr_factor(self, step: int) -> float:
        """The learning-rate multiplier at optimizer step `step` (see the class docstring)."""
        hp = self.hparams
        factor = hp.lr_gamma ** step
        if step < hp.get("lr_warmup_steps", 0):
            factor *= (step + 1) / hp.lr_warmup_steps
        if hp.lr_decay_start is not None and step > hp.lr_decay_start:
            progress = min((step - hp.lr_decay_start) / max(hp.lr_decay_steps, 1), 1.0)
            factor *= hp.lr_min_ratio + (1 - hp.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return factor

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng_states"] = get_rng_state()  # quantizer dropout and code revival draw from it

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._rng_to_restore = checkpoint.get("rng_states")

    def on_train_start(self) -> None:
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None

    def _adversarial_now(self) -> bool:
        return self.discriminator is not None and self.global_step >= self.hparams.adversarial_start_step

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        hp = self.hparams
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        schedulers = self.lr_schedulers()
        schedulers = schedulers if isinstance(schedulers, list) else [schedulers]
        wav = batch  # [B, C, S]

        out = self.codec(wav)
        recon = out.audio
        loudness_weight = hp.get("loudness_weight", 0.0)
        mel, loudness = self.mel_loss.terms(recon, wav, loudness=loudness_weight > 0)
        l1 = waveform_l1(recon, wav)
        commit = out.quantizer.commit_loss
        loss = hp.mel_weight * mel + hp.l1_weight * l1 + commit
        logs = {"train/mel": mel, "train/l1": l1, "train/commit": commit}
        if loudness_weight > 0:
            loss = loss + loudness_weight * loudness
            logs["train/loudness"] = loudness
        if hp.phase_weight > 0:
            if hp.get("phase_on", "output") == "spectrum":
                phase = self.phase_loss.on_spectrum(out.spectrum, wav)
            else:
                phase = self.phase_loss(recon, wav)
            loss = loss + hp.phase_weight * phase
            logs["train/phase"] = phase

        if self._adversarial_now():
            opt_d = optimizers[1]
            real_logits, _ = self.discriminator(wav)
            fake_logits, _ = self.discriminator(recon.detach())
            loss_d = discriminator_hinge_loss(real_logits, fake_logits)
            opt_d.zero_grad(set_to_none=True)
            self.manual_backward(loss_d)
            if hp.grad_clip:
                self.clip_gradients(opt_d, gradient_clip_val=hp.grad_clip, gradient_clip_algorithm="norm")
            # Step the raw optimizer so that trainer.global_step counts codec updates only
            # (Lightning counts every LightningOptimizer.step in manual optimization).
            opt_d.optimizer.step()
            schedulers[1].step()

            self.discriminator.requires_grad_(False)
            with torch.no_grad():
                _, real_features = self.discriminator(wav)
            fake_logits, fake_features = self.discriminator(recon)
            adv = generator_hinge_loss(fake_logits)
            feat = feature_matching_loss(real_features, fake_features)
            self.discriminator.requires_grad_(True)
            loss = loss + hp.adv_weight * adv + hp.feat_weight * feat
            logs.update({"train/disc": loss_d, "train/adv": adv, "train/feat": feat})

        opt_g = optimizers[0]
        opt_g.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if hp.grad_clip:
            self.clip_gradients(opt_g, gradient_clip_val=hp.grad_clip, gradient_clip_algorithm="norm")
        opt_g.step()
        schedulers[0].step()

        metrics = out.quantizer.metrics
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
        return loss.detach()

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
            "val/phase": self.phase_loss(recon, wav),
            **({"val/phase_spectrum": self.phase_loss.on_spectrum(out.spectrum, wav)}
               if out.spectrum is not None and self.hparams.get("phase_on", "output") == "spectrum" else {}),
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


class CodecCLI(LightningCLI):
    """LightningCLI without subcommands: parses a recipe, then `train_codec` runs fit + export."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.codec.sample_rate", "data.sample_rate")
        parser.link_arguments("model.codec.channels", "data.channels")
        parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                            help="resume training from this Lightning checkpoint")
        parser.add_argument("--export_dir", type=Optional[str], default=None,
                            help="where to save the trained codec (default: <run dir>/pretrained)")


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

