"""The settings of a codec training run, grouped as `CodecModule` takes them (and recipes write them).

    model:
      codec:       {latent_dim: 64, quantizer: {...}, decoder: {kind: istft, ...}}   # CodecSettings
      losses:      {mel_weight: 15.0, loudness_weight: 20.0, ...}   # Losses
      adversarial: {enabled: true, n_ffts: [1024, 512, 256], ...}   # Adversarial
      optim:       {lr: 3.0e-4, warmup_steps: 200, decay_start: 3500, ...}   # Optimization

Each group checks its values when it is made; `settings_dict` gives the plain dict that checkpoints
store (they load with torch.load(weights_only=True)), and `as_settings` reads one back.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar, Union

from rvqlm_core.settings import settings_from_dict

T = TypeVar("T")


@dataclass
class CodecSettings:
    """`model.codec` as a recipe writes it: `codec.core.config.CodecConfig`'s nested settings, each part a
    dict (any registered kind's settings); unset (None) is CodecConfig's default. Typed here so that
    `--model.codec.decoder.hop 80` overrides one setting of a recipe's part."""

    sample_rate: Optional[int] = None
    channels: Optional[int] = None
    strides: Optional[list[int]] = None
    latent_dim: Optional[int] = None
    causal: Optional[bool] = None
    encoder: Optional[dict[str, Any]] = None
    quantizer: Optional[dict[str, Any]] = None
    decoder: Optional[dict[str, Any]] = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class Losses:
    """The codec's loss: mel_weight * multi-scale log-mel L1 + l1_weight * waveform L1 + commitment
    [+ loudness_weight * loudness-scale distance]."""

    mel_weight: float = 15.0
    l1_weight: float = 1.0
    mel_n_ffts: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])  # FFT size of each mel scale
    mel_max_mels: Union[int, list[int]] = 80  # bands at every scale, or one number per scale
    loudness_weight: float = 0.0  # |M|^loudness_exponent distance (codec.neural.losses.MultiScaleMelLoss.terms); 0: off
    loudness_exponent: float = 0.3

    def __post_init__(self) -> None:
        self.mel_n_ffts = [int(n) for n in self.mel_n_ffts]
        if not isinstance(self.mel_max_mels, int):
            self.mel_max_mels = [int(m) for m in self.mel_max_mels]
        if self.loudness_weight < 0 or not self.loudness_exponent > 0:
            raise ValueError(f"loudness_weight must be >= 0 and loudness_exponent > 0, got {self.loudness_weight} "
                             f"and {self.loudness_exponent}")
        if min(self.mel_weight, self.l1_weight) < 0:
            raise ValueError(f"loss weights must be >= 0, got mel_weight {self.mel_weight}, l1_weight "
                             f"{self.l1_weight}")


@dataclass
class Adversarial:
    """A `codec.core.discriminator.CodecDiscriminator` trained beside the codec from step `start_step` on:
    STFT scales at `n_ffts` (`filters` wide)."""

    enabled: bool = False
    start_step: int = 0
    adv_weight: float = 1.0  # generator hinge loss
    feat_weight: float = 2.0  # feature matching
    disc_lr: float = 3e-4  # the discriminator's AdamW (betas and schedule: the codec's)
    n_ffts: list[int] = field(default_factory=lambda: [1024, 512, 256])
    filters: int = 32

    def __post_init__(self) -> None:
        self.n_ffts = [int(n) for n in self.n_ffts]
        if self.enabled and not self.n_ffts:
            raise ValueError("adversarial training needs at least one STFT scale (n_ffts)")
        if self.start_step < 0 or min(self.adv_weight, self.feat_weight) < 0:
            raise ValueError(f"start_step, adv_weight and feat_weight must be >= 0, got {self.start_step}, "
                             f"{self.adv_weight} and {self.feat_weight}")


@dataclass
class Optimization:
    """AdamW and its schedule: lr at step s = lr * warmup(s) * lr_gamma**s * cooldown(s).

    warmup rises linearly from 1 / warmup_steps to 1 over the first `warmup_steps` steps (0: none);
    cooldown is 1 until `decay_start` (None: never), then falls along a half cosine to `min_lr_ratio`
    over `decay_steps` steps and stays there. A pure function of the step: a run resumed with new
    settings follows them from its current step.
    """

    lr: float = 3e-4
    betas: list[float] = field(default_factory=lambda: [0.8, 0.99])
    weight_decay: float = 0.0
    grad_clip: Optional[float] = 1000.0  # gradient norm clip (codec and discriminator); None: off
    lr_gamma: float = 1.0
    warmup_steps: int = 0
    decay_start: Optional[int] = None
    decay_steps: int = 1
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        self.betas = [float(b) for b in self.betas]
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers, got {self.betas}")
        if not self.lr > 0 or self.warmup_steps < 0 or self.decay_steps < 1:
            raise ValueError(f"lr must be > 0, warmup_steps >= 0 and decay_steps >= 1, got {self.lr}, "
                             f"{self.warmup_steps} and {self.decay_steps}")

    def lr_factor(self, step: int) -> float:
        """The learning-rate multiplier at optimizer step `step`."""
        factor = self.lr_gamma ** step
        if step < self.warmup_steps:
            factor *= (step + 1) / self.warmup_steps
        if self.decay_start is not None and step > self.decay_start:
            progress = min((step - self.decay_start) / self.decay_steps, 1.0)
            factor *= self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return factor


def as_settings(cls: type[T], value: Any) -> T:
    """`value` as a `cls`: itself, or a dict of its fields (as checkpoints store them); None: defaults."""
    if isinstance(value, cls):
        return value
    if value is None:
        return cls()
    return settings_from_dict(cls, value, "training settings")


def settings_dict(settings: Any) -> dict:
    """A settings dataclass as a dict of plain types (lists, numbers, strings, None)."""
    return dataclasses.asdict(settings)
