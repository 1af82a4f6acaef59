"""Training the multi-codebook LM with Lightning: the LightningModule, its optimizer and schedule,
the LightningCLI entry point, held-out evaluation and the unigram baseline.

* AdamW with weight decay only on the matrices of matrix products (attention, FFN, output heads:
  parameters with dim >= 2 that are not embedding tables); none on embeddings, norm gains, biases.
* The learning rate rises linearly from 0 over `warmup_steps` optimizer steps, then follows a
  cosine from `lr` down to `min_lr_ratio * lr` at the last step, updated every step.
* Gradient clipping, precision, gradient accumulation and DDP are the Trainer's own (recipes/).
* Exact resume: Lightning's checkpoint (optimizer, scheduler, loops, the DataModule's stream
  position) plus the RNG states (torch, python, numpy) this module saves and restores.
* Metrics: loss and perplexity per codebook and overall (train and held-out), codebook tokens per
  second (all ranks), and MFU against the fp32 matmul peak `measure_matmul_peak` measures at fit start.
* After fit, rank 0 saves `<trainer.default_root_dir>/pretrained/` (save_pretrained); its config
  carries the codec fingerprint of the training tokens.
* A conditioned LM (config.condition) trains on windows with their file's text, speaker and end
  (`data.conditions: true`); its speaker table is the token folder's speakers unless the recipe
  lists them (`speakers` is linked from the data like the token layout).

Why these choices: docs/experiments.md, "language model".
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.cli import LightningCLI
from torch import Tensor, nn

from lm.config import LMConfig
from lm.data import TokenDataModule, TokenFiles, ValidWindows, batch_conditions, check_conditions
from lm.families import family_of, recipe_family
from lm.trunk import LMLoss, build_lm, load_lm
from lm.model import MultiCodebookLM
from lm.moe import moe_aux_loss
from lm.warm_start import warm_start
from rvqlm_core.rng_state import ResumesRngState
from rvqlm_core.run_folder import (AtomicCheckpointIO, ReadsCheckpointsClearly, ShortParseErrors,  # noqa: F401
                                    check_new_run)

# ---- measurement ------------------------------------------------------------------------------------

def measure_matmul_peak(dtype: torch.dtype = torch.float32, n: int = 2048, repeats: int = 5,
                        device: torch.device | str = "cpu") -> float:
    """This machine's dense matmul throughput in FLOP/s on `device`: the best of `repeats` timed n x n products.

    The reference for MFU. Uses torch's current thread setting, so it measures what training gets
    (on a GPU, take n >= 8192 so one product outlasts its launch).
    """
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    torch.mm(a, b)  # warm-up (allocation, kernel selection)
    sync()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


# ---- optimizer and schedule -------------------------------------------------------------------------

def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: decay for matrices of matrix products, none for embeddings/gains/biases."""
    embedding_params = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and id(p) not in embedding_params else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def with_fresh_lr(groups: list[dict[str, Any]], fresh: set[int], lr: float) -> list[dict[str, Any]]:
    """Each group split in two: its parameters whose id is in `fresh` with their own `lr`, the rest as they were."""
    out = []
    for g in groups:
        old = [p for p in g["params"] if id(p) not in fresh]
        new = [p for p in g["params"] if id(p) in fresh]
        out += [{**g, "params": old}] + ([{**g, "params": new, "lr": lr}] if new else [])
    return out


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier at optimizer step `step` (0-based): linear warmup to 1, then cosine to min_lr_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---- codec fingerprints ------------------------------------------------------------------------------

def check_fingerprint(lm_fingerprint: str | None, tokens_fingerprint: str | None, tokens_where: str) -> None:
    """Refuse to pair an LM with tokens of another codec (ValueError with both fingerprints)."""
    if lm_fingerprint != tokens_fingerprint:
        lm_fp = lm_fingerprint[:16] if lm_fingerprint else "none recorded"
        tok_fp = tokens_fingerprint[:16] if tokens_fingerprint else "none recorded"
        raise ValueError(f"codec mismatch: the LM was trained on tokens of codec {lm_fp}, but {tokens_where} "
                         f"holds tokens of codec {tok_fp}; token ids of different codecs mean different sounds")


# ---- the LightningModule ----------------------------------------------------------------------------

class LMTrainingModule(ResumesRngState, pl.LightningModule):
    """Next-token training of a MultiCodebookLM on token windows (see `lm.data.TokenDataModule`).

    Args:
        config: the LMConfig; n_codebooks / codebook_size / codec_fingerprint below override it
            (LightningCLI links them from the DataModule, i.e. from the token shards).
        lr, betas, adam_eps, weight_decay: AdamW (decay on matrices only, see `decay_groups`).
        warmup_steps, min_lr_ratio: the schedule (see `warmup_cosine`); total_steps defaults to
            the Trainer's estimated optimizer steps (max_steps).
        measure_peak: time an fp32 matmul at fit start for MFU (off: MFU is not logged).
        export: write `<default_root_dir>/pretrained/` after fit.
        init_from: a `save_pretrained` folder to start from (fine-tuning). Its architecture must
            equal `config`'s (dropout may differ), or be `config`'s without `condition` (a conditioned
            LM started from an unconditioned decoder: lm.warm_start), and it must come from the same
            codec's tokens.
        fresh_lr_scale: the learning rate of the parameters init_from leaves fresh (a conditioned LM's
            encoder and cross-attention) is lr times this; the copied ones train at lr.
        speakers: the speaker table of a conditioned LM whose config lists none (linked from the data).
        alphabet: an aligned-text LM's units where its config names none (linked from the data, lm.aligned_text).
    """

    def __init__(self, config: LMConfig, n_codebooks: int | None = None, codebook_size: int | None = None,
                 codec_fingerprint: str | None = None, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95),
                 adam_eps: float = 1e-8, weight_decay: float = 0.1, warmup_steps: int = 100,
                 min_lr_ratio: float = 0.1, total_steps: int | None = None, measure_peak: bool = True,
                 export: bool = True, init_from: str | None = None, speakers: list[str] | None = None,
                 fresh_lr_scale: float = 1.0, alphabet: str | None = None):
        super().__init__()
        overrides = {k: v for k, v in (("n_codebooks", n_codebooks), ("codebook_size", codebook_size),
                                       ("codec_fingerprint", codec_fingerprint)) if v is not None}
        if config.condition is not None and not config.condition.speakers and speakers:
            overrides["condition"] = dataclasses.replace(config.condition, speakers=list(speakers))
        if config.condition is not None and not config.condition.alphabet and alphabet:
            overrides["condition"] = dataclasses.replace(overrides.get("condition", config.condition), alphabet=alphabet)
        self.lm_config = dataclasses.replace(config, **overrides)
        if not fresh_lr_scale > 0 or (fresh_lr_scale != 1.0 and init_from is None):
            raise ValueError(f"fresh_lr_scale must be > 0, and is for the parameters init_from leaves fresh (give "
                             f"init_from); got {fresh_lr_scale} with init_from={init_from!r}")
        if warmup_steps < 0 or not 0.0 <= min_lr_ratio <= 1.0 or lr <= 0:
            raise ValueError(f"need lr > 0, warmup_steps >= 0 and min_lr_ratio in [0, 1]; got {lr}, "
                             f"{warmup_steps}, {min_lr_ratio}")
        # Plain values only, so checkpoints load with torch.load(weights_only=True).
        self.save_hyperparameters(ignore=["config", "n_codebooks", "codebook_size", "codec_fingerprint", "speakers",
                                          "alphabet"])
        self.hparams["config"] = self.lm_config.to_dict()  # complete, as LightningCLI re-reads it on resume
        self.model = build_lm(self.lm_config)  # the model of the config's family (lm.families)
        self._fresh: list[str] = []  # parameters init_from left at their initialisation
        if init_from is not None:
            self._load_initial_weights(init_from)
        self.matmul_peak: float | None = None
        self._last_batch_end: float | None = None
        self._val_nll: Tensor | None = None
        self._val_count: Tensor | None = None

    def _load_initial_weights(self, folder: str) -> None:
        self._fresh = warm_start(self.model, load_lm(folder), folder)

    # -- training ---------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if isinstance(dm, TokenDataModule):
            check_fingerprint(self.lm_config.codec_fingerprint, dm.codec_fingerprint, dm.tokens_dir)
            if (dm.n_codebooks, dm.codebook_size) != (self.lm_config.n_codebooks, self.lm_config.codebook_size):
                raise ValueError(f"the tokens have N_c={dm.n_codebooks}, |V|={dm.codebook_size}; the LM is built for "
                                 f"N_c={self.lm_config.n_codebooks}, |V|={self.lm_config.codebook_size}")
            if self.model.pattern.sequence_length(dm.window_frames) > self.lm_config.max_seq_len:
                raise ValueError(f"window_frames={dm.window_frames} needs more than max_seq_len="
                                 f"{self.lm_config.max_seq_len} positions (at most {self.lm_config.max_frames} frames)")
            check_conditions(self.lm_config, dm)
        if self.hparams.measure_peak:
            self.matmul_peak = measure_matmul_peak(device=self.device)

    def on_train_start(self) -> None:
        super().on_train_start()  # the resumed run's RNG state
        self._last_batch_end = None

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        out = self.model.loss(batch["codes"], batch["frame_mask"], **batch_conditions(self.model, batch))
        self._log_losses("train", out.nll_sum.detach(), out.count, loss=out.loss.detach())
        total = out.loss
        if out.guide is not None:  # guided attention (lm.alignment), weighted by the condition config
            self.log("train/guide", out.guide.detach(), on_step=True, on_epoch=False)
            total = total + self.lm_config.condition.guided_attention * out.guide
        total = self._with_duration(out, total)
        aux = moe_aux_loss(self.model)  # a mixture of experts' load balance (lm.moe), weighted by the config
        if aux is None:
            return total
        self.log("train/moe_aux", aux.detach(), on_step=True, on_epoch=False)
        return total + self.lm_config.moe_aux_weight * aux

    def _with_duration(self, out: LMLoss, total: Tensor) -> Tensor:
        """total plus an aligned-text LM's weighted duration loss (lm.aligned_text), logged; total if none."""
        if out.duration is not None:
            self.log("train/duration", out.duration.detach(), on_step=True, on_epoch=False)
        return total if out.duration is None else total + self.lm_config.condition.duration_loss * out.duration

    def _keep_val_aux(self, out: LMLoss) -> None:
        """Keep the held-out auxiliary losses (guide, duration) of one validation batch."""
        for name in (n for n in ("guide", "duration") if getattr(out, n) is not None):
            self._val_aux.setdefault(name, []).append(getattr(out, name).detach())

    def on_train_batch_end(self, outputs, batch: dict[str, Tensor], batch_idx: int) -> None:
        now = time.perf_counter()
        last, self._last_batch_end = self._last_batch_end, now
        if last is None:
            return
        dt = now - last
        b, n_c, t = batch["codes"].shape
        world = self.trainer.world_size
        self.log("train/tokens_per_s", b * n_c * t * world / dt, on_step=True, on_epoch=False)
        if self.matmul_peak:
            positions = self.model.pattern.sequence_length(t)
            flops = self.model.flops_per_token(positions) * b * positions
            self.log("train/mfu", flops / dt / self.matmul_peak, on_step=True, on_epoch=False)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)

    def _log_losses(self, stage: str, nll_sum: Tensor, count: Tensor, loss: Tensor | None = None) -> None:
        """Loss and perplexity overall and per codebook (level), each codebook's only where it had targets
        (a masked LM's training batch scores a few levels)."""
        overall = loss if loss is not None else (nll_sum.sum() / count.sum().clamp(min=1)).float()
        on_step = stage == "train"
        kw = dict(on_step=on_step, on_epoch=not on_step, sync_dist=False)
        self.log(f"{stage}/loss", overall, prog_bar=True, **kw)
        self.log(f"{stage}/ppl", overall.exp(), **kw)
        for k in count.nonzero()[:, 0].tolist():
            per_cb = (nll_sum[k] / count[k]).float()
            self.log(f"{stage}/loss_cb{k}", per_cb, **kw)
            self.log(f"{stage}/ppl_cb{k}", per_cb.exp(), **kw)

    # -- validation: token-weighted over every held-out window of every rank ----------------------
    def on_validation_epoch_start(self) -> None:
        n_c = self.lm_config.n_codebooks
        self._val_nll = torch.zeros(n_c, dtype=torch.float64, device=self.device)
        self._val_count = torch.zeros(n_c, dtype=torch.float64, device=self.device)
        self._val_aux: dict[str, list[Tensor]] = {}  # guide, duration: the auxiliary losses on held-out windows

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        guide = self.lm_config.condition is not None and self.lm_config.condition.guided
        out = self.model.loss(batch["codes"], batch["frame_mask"], **batch_conditions(self.model, batch), guide=guide)
        self._val_nll += out.nll_sum.double()
        self._val_count += out.count.double()
        self._keep_val_aux(out)

    def on_validation_epoch_end(self) -> None:
        self._last_batch_end = None  # the next training interval would include this validation
        nll = self.trainer.strategy.reduce(self._val_nll, reduce_op="sum")
        count = self.trainer.strategy.reduce(self._val_count, reduce_op="sum")
        if count.sum() > 0:
            self._log_losses("val", nll, count)
        for name, values in self._val_aux.items():  # guide: is the text read in order? duration: log-frame error
            self.log(f"val/{name}", torch.stack(values).mean(), on_step=False, on_epoch=True)

    # -- optimizer --------------------------------------------------------------------------------
    def configure_optimizers(self):
        hp = self.hparams
        # fused: one kernel for all parameters (docs/experiments.md, "language model").
        groups = decay_groups(self.model, hp.weight_decay)
        if hp.fresh_lr_scale != 1.0:
            fresh = {id(p) for name, p in self.model.named_parameters() if name in set(self._fresh)}
            groups = with_fresh_lr(groups, fresh, hp.lr * hp.fresh_lr_scale)
        optimizer = torch.optim.AdamW(groups, lr=hp.lr,
                                      betas=tuple(hp.betas), eps=hp.adam_eps, fused=True)
        total = hp.total_steps or int(self.trainer.estimated_stepping_batches)
        if not 0 < total < 10**12:
            raise ValueError("set trainer.max_steps (or model.total_steps): the cosine schedule needs a length")
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, hp.warmup_steps, total, hp.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # -- checkpoints ------------------------------------------------------------------------------
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("hyper_parameters", {}).get("config")
        if saved is not None:
            now = self.lm_config.to_dict()
            check_fingerprint(saved.get("codec_fingerprint"), now.get("codec_fingerprint"),
                              "the training data of this run")
            changed = [f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in now if saved.get(k) != now[k]]
            if changed:
                raise ValueError("the checkpoint's LM config differs from this run's: " + "; ".join(changed))
        super().on_load_checkpoint(checkpoint)

    def on_fit_end(self) -> None:
        if self.hparams.export and self.trainer.is_global_zero and not self.trainer.interrupted:
            self.model.save_pretrained(Path(self.trainer.default_root_dir) / "pretrained")


# ---- evaluation -------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate_nll(model: MultiCodebookLM, windows: ValidWindows, ends: bool = False) -> tuple[Tensor, Tensor]:
    """Summed NLL (nats) and target counts per codebook over all windows: ([N_c] f64, [N_c] int64).
    A conditioned LM reads each window's conditions (windows built with conditions=True); its
    end-of-audio targets count only with `ends`, so by default the targets are the codes alone."""
    model.eval()
    nll = torch.zeros(model.config.n_codebooks, dtype=torch.float64)
    count = torch.zeros(model.config.n_codebooks, dtype=torch.int64)
    for batch in windows:
        out = model.loss(batch["codes"].to(model.device), batch["frame_mask"].to(model.device),
                         **batch_conditions(model, batch, ends))
        nll += out.nll_sum.double().cpu()
        count += out.count.cpu()
    return nll, count


def unigram_nll(train: TokenFiles, held_out: TokenFiles, n_codebooks: int, codebook_size: int,
                smoothing: float = 1.0) -> tuple[Tensor, Tensor]:
    """The unigram baseline: per-codebook token frequencies of the training files (add-`smoothing`),
    scored on every frame of the held-out files. Returns ([N_c] summed NLL, [N_c] counts), the same
    targets the LM is scored on by `evaluate_nll` over `ValidWindows` of those files."""
    from rvqlm_core.token_shards import TokenShards

    shards = TokenShards.open(train.tokens_dir)
    counts = np.full((n_codebooks, codebook_size), smoothing, dtype=np.float64)
    for i in train.entry_indices:
        tokens = np.asarray(shards.read(shards.entries[i]), dtype=np.int64)[:, :n_codebooks]  # [frames, N_c]
        for k in range(n_codebooks):
            counts[k] += np.bincount(tokens[:, k], minlength=codebook_size)
    log_p = np.log(counts) - np.log(counts.sum(axis=1, keepdims=True))
    nll = np.zeros(n_codebooks)
    n = np.zeros(n_codebooks, dtype=np.int64)
    held = TokenShards.open(held_out.tokens_dir)
    for i in held_out.entry_indices:
        tokens = np.asarray(held.read(held.entries[i]), dtype=np.int64)[:, :n_codebooks]
        nll -= log_p[np.arange(n_codebooks), tokens].sum(axis=0)
        n += len(tokens)
    return torch.from_numpy(nll), torch.from_numpy(n)


def held_out_files(cfg: LMConfig, tokens_dir: str, split: str, split_by: str, valid_fraction: float,
                   window_frames: int | None) -> tuple[Any, TokenFiles, int]:
    """(shards, the split's files, window frames) of a token folder an LM of `cfg` is scored on:
    ValueError for another codec's tokens (fingerprint), another |V| or fewer codebooks than the LM
    models (an LM of the first k scores the first k), or windows past the LM's context (default: the
    whole context)."""
    from rvqlm_core.token_shards import TokenShards

    shards = TokenShards.open(tokens_dir)
    check_fingerprint(cfg.codec_fingerprint, shards.fingerprint, str(tokens_dir))
    if shards.codebook_size != cfg.codebook_size or shards.n_codebooks < cfg.n_codebooks:
        raise ValueError(f"{tokens_dir} has N_c={shards.n_codebooks}, |V|={shards.codebook_size}; "
                         f"the LM models N_c={cfg.n_codebooks} (the first of the folder's), |V|={cfg.codebook_size}")
    window = window_frames or cfg.max_frames
    if not 1 <= window <= cfg.max_frames:
        raise ValueError(f"window_frames must be in 1..{cfg.max_frames} for this LM, got {window}")
    aligned = cfg.condition is not None and bool(cfg.condition.alphabet)  # reads alignments.jsonl (lm.aligned_text)
    return shards, TokenFiles.of_split(tokens_dir, split, split_by, valid_fraction, shards, alignments=aligned), window


def held_out_report(model: MultiCodebookLM, tokens_dir: str, split: str = "valid", *, split_by: str = "prefix",
                    valid_fraction: float = 0.1, window_frames: int | None = None, batch_size: int = 8,
                    unigram: bool = False) -> dict[str, Any]:
    """Score `model` on the `split` files of a token folder: NLL per codebook (nats/token) and overall,
    optionally next to the unigram baseline of the train split on exactly the same targets.

    Refuses tokens of another codec (fingerprint) or another (N_c, |V|) layout, and windows longer
    than the LM's context. A conditioned LM reads each file's own text and speaker and is scored on
    the codes only (the unigram baseline's targets). Returns a JSON-ready dict (`rvqlm eval-lm` prints it).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    cfg = model.config
    shards, files, window = held_out_files(cfg, tokens_dir, split, split_by, valid_fraction, window_frames)
    windows = ValidWindows(files, cfg.n_codebooks, window, batch_size, conditions=cfg.condition is not None)
    with torch.inference_mode():
        nll, count = evaluate_nll(model, windows)
    report: dict[str, Any] = {"tokens": str(tokens_dir), "split": split, "files": len(files),
                              "window_frames": window, "nll_per_codebook": (nll / count).tolist(),
                              "tokens_per_codebook": count.tolist(), "nll": float(nll.sum() / count.sum())}
    if unigram:
        train = TokenFiles.of_split(tokens_dir, "train", split_by, valid_fraction, shards)
        u_nll, u_count = unigram_nll(train, files, cfg.n_codebooks, cfg.codebook_size)
        if not torch.equal(u_count, count):
            raise RuntimeError(f"the unigram baseline scored {u_count.tolist()} tokens, the LM {count.tolist()}")
        report["unigram_nll_per_codebook"] = (u_nll / u_count).tolist()
        report["unigram_nll"] = float(u_nll.sum() / u_count.sum())
    return report


# ---- LightningCLI -----------------------------------------------------------------------------------

class LMTrainingCLI(ShortParseErrors, ReadsCheckpointsClearly, LightningCLI):
    """LightningCLI for `rvqlm train-lm`: sizes the LM from the tokens and fills in run-dir defaults.

    The run folder is `trainer.default_root_dir`: checkpoints go to `<run dir>/checkpoints/` (when
    a ModelCheckpoint leaves dirpath empty), CSV logs to `<run dir>/logs/` (when no logger is set),
    the exported model to `<run dir>/pretrained/`. Resume with `--ckpt_path last`.
    """

    help_command = "rvqlm train-lm --help"

    def add_arguments_to_parser(self, parser) -> None:
        for name in ("n_codebooks", "codebook_size", "codec_fingerprint", "speakers", "alphabet"):
            parser.link_arguments(f"data.{name}", f"model.{name}", apply_on="instantiate")
        parser.add_argument("--overwrite", type=bool, default=False, help="start afresh (no --ckpt_path) in a run "
                            "folder that holds an earlier run: its pretrained/ is replaced at the end, its checkpoints "
                            "stay beside the new run's (last-v1.ckpt, ...); refused without it (rvqlm_core.run_folder)")

    def before_instantiate_classes(self) -> None:
        from jsonargparse import Namespace

        cfg = self.config[self.subcommand] if self.subcommand else self.config
        run_dir = cfg.trainer.default_root_dir or "."
        for cb in cfg.trainer.callbacks or []:
            if cb.class_path.endswith("ModelCheckpoint") and cb.init_args.get("dirpath") is None:
                cb.init_args.dirpath = str(Path(run_dir) / "checkpoints")
        check_new_run(run_dir, [cb.init_args.dirpath for cb in cfg.trainer.callbacks or []
                                if cb.class_path.endswith("ModelCheckpoint")], cfg.ckpt_path, cfg.overwrite)
        forget = Namespace(class_path="rvqlm_core.run_folder.ForgetsUnstartedLogs",
                           init_args=Namespace(log_root=str(Path(run_dir) / "logs")))
        lock = Namespace(class_path="lm.run_lock.RunFolderLock")
        cfg.trainer.callbacks = [*(cfg.trainer.callbacks or []), forget, lock]
        if cfg.trainer.logger in (None, True):
            cfg.trainer.logger = Namespace(class_path="lightning.pytorch.loggers.CSVLogger",
                                           init_args=Namespace(save_dir=str(run_dir), name="logs"))


def train_main(args: Sequence[str] | None = None) -> int:
    """`rvqlm train-lm ARGS`: LightningCLI `fit` with ARGS (e.g. --config recipes/lm_tiny.yaml) of the
    LightningModule of the recipe's LM family (lm.families.recipe_family).

    sys.argv is left alone: Lightning's DDP launcher re-runs it to start the other ranks.
    """
    args = list(sys.argv[1:] if args is None else args)
    if args and args[0] == "fit":
        args = args[1:]
    module = family_of(recipe_family(args)).resolve("training_module")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended to run from within")
        LMTrainingCLI(module, TokenDataModule, args=["fit", *args],
                      save_config_kwargs={"overwrite": True},
                      trainer_defaults={"plugins": [{"class_path": "lm.training.AtomicCheckpointIO"}]},
                      parser_kwargs={"fit": {"default_env": False}})
    return 0
