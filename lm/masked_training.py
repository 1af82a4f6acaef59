"""Training and scoring a MaskedLM: LMTrainingModule's features (LightningCLI recipes, exact resume,
DDP, tokens/s and MFU, per-level losses, export) with the masked objective of lm.masked_model.

* Masks are drawn from a generator seeded by (mask_seed, batch index, rank), not from the global
  RNG, so a resumed run draws the same masks as the uninterrupted one by construction.
* Validation masks every held-out window with a generator seeded by (0, window batch, rank) and
  SoundStorm's draw (prefix_prob 1), whatever the run's settings, so `val/loss` is comparable
  between runs; `val/loss_cb{q}` is the loss of the windows whose level was q.
* `init_from` may name an AR LM of the same architecture (the family and pattern differ): every
  tensor is copied, its bos rows becoming the mask tokens; or a masked LM of the same architecture.

    rvqlm train-lm --config recipes/lm_masked_speech.yaml [--ckpt_path last]   (the recipe's family: masked)
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from lm.config import LMConfig
from lm.data import ValidWindows
from lm.trunk import load_lm
from lm.masked_model import MaskedLM
from lm.moe import moe_aux_loss
from lm.training import LMTrainingModule, batch_conditions, held_out_files
from lm.int8 import refuse_training
from lm.warm_start import architecture_differences, decoder_into_conditioned

VALID_SEED = 0


def seeded_generator(device: torch.device, *key: Any) -> torch.Generator:
    """A generator on `device` seeded by a hash of `key` (e.g. ("train", seed, batch index, rank))."""
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(digest[:8], "big") & (2**63 - 1))
    return g


def masked_warm_start(model: MaskedLM, start, source: str) -> list[str]:
    """Load LM `start` (masked, or AR differing only in family / pattern; unconditioned where `model` is
    conditioned) into `model`; returns the fresh tensors (lm.warm_start: the condition parts, if any).
    ValueError naming `source` and every other difference."""
    refuse_training(start, f"init_from {source}:")
    allowed = ("family ", "pattern ") if start.config.family != model.config.family else ()
    conditioned_from_plain = model.config.condition is not None and start.config.condition is None
    allowed += ("condition ",) if conditioned_from_plain else ()
    differ = [d for d in architecture_differences(model.config, start.config) if not d.startswith(allowed)]
    if differ:
        raise ValueError(f"init_from {source}: its LM differs from this recipe's in " + ", ".join(differ)
                         + " (a masked LM starts from an LM of the same architecture, AR or masked, conditioned "
                           "or not)")
    if conditioned_from_plain:
        return decoder_into_conditioned(model, start, source)
    model.load_state_dict(start.state_dict())
    return []


class MaskedLMTrainingModule(LMTrainingModule):
    """Masked-token training of a MaskedLM (config.family must be "masked"; see lm.masked_model).

    Args: those of LMTrainingModule, and
        prefix_prob: the chance a training window keeps a visible prefix (uniform length; SoundStorm: 1).
        mask_seed: seeds the training masks (with the batch index and the rank).
    """

    def __init__(self, config: LMConfig, n_codebooks: int | None = None, codebook_size: int | None = None,
                 codec_fingerprint: str | None = None, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95),
                 adam_eps: float = 1e-8, weight_decay: float = 0.1, warmup_steps: int = 100,
                 min_lr_ratio: float = 0.1, total_steps: int | None = None, measure_peak: bool = True,
                 export: bool = True, init_from: str | None = None, speakers: list[str] | None = None,
                 fresh_lr_scale: float = 1.0, prefix_prob: float = 1.0, mask_seed: int = 0, alphabet: str | None = None):
        if not 0.0 <= prefix_prob <= 1.0:
            raise ValueError(f"prefix_prob must be in [0, 1], got {prefix_prob}")
        super().__init__(config, n_codebooks, codebook_size, codec_fingerprint, lr, betas, adam_eps, weight_decay,
                         warmup_steps, min_lr_ratio, total_steps, measure_peak, export, init_from, speakers,
                         fresh_lr_scale, alphabet)
        if not isinstance(self.model, MaskedLM):
            raise ValueError(f"this config is of the {config.family!r} LM family, not 'masked': train it with its own "
                             "family's module (rvqlm train-lm reads the family from the recipe)")

    def _load_initial_weights(self, folder: str) -> None:
        self._fresh = masked_warm_start(self.model, load_lm(folder), folder)

    def _conditions(self, batch: dict) -> dict[str, Any]:
        return batch_conditions(self.model, batch, ends=False)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        g = seeded_generator(self.device, "train", self.hparams.mask_seed, int(batch["batch_index"]),
                             self.global_rank)
        out = self.model.loss(batch["codes"], batch["frame_mask"], generator=g,
                              prefix_prob=self.hparams.prefix_prob, **self._conditions(batch))
        self._log_losses("train", out.nll_sum.detach(), out.count, loss=out.loss.detach())
        total = self._with_duration(out, out.loss)
        aux = moe_aux_loss(self.model)  # a mixture of experts' load balance, as LMTrainingModule adds it
        if aux is None:
            return total
        self.log("train/moe_aux", aux.detach(), on_step=True, on_epoch=False)
        return total + self.lm_config.moe_aux_weight * aux

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        g = seeded_generator(self.device, "valid", VALID_SEED, batch_idx, self.global_rank)
        out = self.model.loss(batch["codes"], batch["frame_mask"], generator=g, **self._conditions(batch))
        self._val_nll += out.nll_sum.double()
        self._val_count += out.count.double()
        self._keep_val_aux(out)


# ---- scoring ------------------------------------------------------------------------------------------

@torch.no_grad()
def masked_nll(model: MaskedLM, windows: ValidWindows, ratio: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Summed NLL and hidden-position counts per level over all windows, each window scored once per
    level q with level q hidden at `ratio`, finer levels hidden, coarser visible, no prefix (seeded by
    window batch and level): ([N_c] f64, [N_c] int64)."""
    model.eval()
    n_c = model.config.n_codebooks
    nll = torch.zeros(n_c, dtype=torch.float64)
    count = torch.zeros(n_c, dtype=torch.int64)
    for i, batch in enumerate(windows):
        codes, fm = batch["codes"].to(model.device), batch["frame_mask"].to(model.device)
        for q in range(n_c):
            g = seeded_generator(model.device, "score", seed, i, q)
            out = model.loss(codes, fm, generator=g, level=q, ratio=ratio, prefix_prob=0.0,
                             **batch_conditions(model, batch, ends=False))
            nll += out.nll_sum.double().cpu()
            count += out.count.cpu()
    return nll, count


def masked_held_out_report(model: MaskedLM, tokens_dir: str, split: str = "valid", *, split_by: str = "prefix",
                           valid_fraction: float = 0.1, window_frames: int | None = None, batch_size: int = 8,
                           ratio: float = 0.5, seed: int = 0, max_windows: int | None = None) -> dict[str, Any]:
    """`held_out_report` for a masked LM: its masked NLL per level (`masked_nll`) on one split of a token
    folder (`max_windows`: evenly spaced windows only), refusing another codec's tokens, another layout
    and windows past its context."""
    if not 0.0 < ratio <= 1.0 or batch_size < 1:
        raise ValueError(f"need a mask ratio in (0, 1] and batch_size >= 1, got {ratio} and {batch_size}")
    cfg = model.config
    _, files, window = held_out_files(cfg, tokens_dir, split, split_by, valid_fraction, window_frames)
    windows = ValidWindows(files, cfg.n_codebooks, window, batch_size, max_windows=max_windows,
                           conditions=cfg.condition is not None)
    with torch.inference_mode():
        nll, count = masked_nll(model, windows, ratio, seed)
    return {"tokens": str(tokens_dir), "split": split, "files": len(files), "window_frames": window,
            "family": "masked", "mask_ratio": ratio,
            "scored": f"masked LM: level q scored with {ratio:g} of its frames hidden, finer levels hidden, coarser "
                      "visible (NLL over the hidden positions)", "nll_per_codebook": (nll / count).tolist(),
            "tokens_per_codebook": count.tolist(), "nll": float(nll.sum() / count.sum())}
