"""The codec's discriminator and the adversarial losses.

Multi-scale STFT (after EnCodec's MS-STFTD): each scale takes the complex STFT of the waveform
(real and imaginary parts as 2 channels per audio channel) and runs a small stack of weight-normed
2-D convolutions, dilated and strided along time, to a map of real/fake logits plus every
intermediate feature map (for the feature-matching loss). `CodecDiscriminator` holds one per
scale. Saved next to the codec as `discriminator.safetensors` (weights, with the constructor settings in the file's
metadata) so a trained codec can be fine-tuned adversarially.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import weight_norm


def _run(convs: nn.ModuleList, post: nn.Module, x: torch.Tensor, slope: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Leaky-ReLU conv stack: (logits of `post`, [every conv's output])."""
    features = []
    for conv in convs:
        x = F.leaky_relu(conv(x), slope)
        features.append(x)
    return post(x), features


class STFTDiscriminator(nn.Module):
    """One scale. wav [B, C, S] -> (logits [B, 1, F', T'], [feature maps])."""

    def __init__(self, n_fft: int, channels: int = 1, filters: int = 32, dilations: Sequence[int] = (1, 2, 4)):
        super().__init__()
        self.n_fft, self.hop = n_fft, n_fft // 4
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        convs = [weight_norm(nn.Conv2d(2 * channels, filters, (3, 9), padding=(1, 4)))]
        for d in dilations:
            convs.append(weight_norm(nn.Conv2d(filters, filters, (3, 9), stride=(2, 1), dilation=(1, d),
                                               padding=(1, 4 * d))))
        convs.append(weight_norm(nn.Conv2d(filters, filters, (3, 3), padding=(1, 1))))
        self.convs = nn.ModuleList(convs)
        self.post = weight_norm(nn.Conv2d(filters, 1, (3, 3), padding=(1, 1)))

    def forward(self, wav: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, c, s = wav.shape
        spec = torch.stft(wav.reshape(b * c, s), self.n_fft, self.hop, window=self.window, return_complex=True,
                          normalized=True)  # [B*C, F, T]
        x = torch.view_as_real(spec).reshape(b, c, *spec.shape[1:], 2)  # [B, C, F, T, 2]
        x = x.permute(0, 1, 4, 2, 3).reshape(b, 2 * c, spec.shape[1], spec.shape[2])  # [B, 2C, F, T]
        return _run(self.convs, self.post, x, slope=0.2)


class CodecDiscriminator(nn.Module):
    """Multi-scale STFT discriminators, one per FFT size in `n_ffts`, side by side.

    wav [B, C, S] -> ([logits of each discriminator], [feature maps of each]).
    """

    def __init__(self, n_ffts: Sequence[int] = (1024, 512, 256), channels: int = 1, filters: int = 32,
                 dilations: Sequence[int] = (1, 2, 4)):
        super().__init__()
        if not n_ffts:
            raise ValueError("a discriminator needs at least one STFT scale (n_ffts)")
        self.config = {"n_ffts": list(n_ffts), "channels": channels, "filters": filters, "dilations": list(dilations)}
        self.discriminators = nn.ModuleList([STFTDiscriminator(n, channels, filters, dilations) for n in n_ffts])

    def forward(self, wav: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        logits, features = [], []
        for d in self.discriminators:
            out, feats = d(wav)
            logits.append(out)
            features.append(feats)
        return logits, features


def discriminator_hinge_loss(real_logits: list[torch.Tensor], fake_logits: list[torch.Tensor]) -> torch.Tensor:
    """Mean over scales of E[relu(1 - D(x))] + E[relu(1 + D(G(z)))]."""
    terms = [F.relu(1 - r).mean() + F.relu(1 + f).mean() for r, f in zip(real_logits, fake_logits)]
    return torch.stack(terms).mean()


def generator_hinge_loss(fake_logits: list[torch.Tensor]) -> torch.Tensor:
    """Mean over scales of E[relu(1 - D(G(z)))]."""
    return torch.stack([F.relu(1 - f).mean() for f in fake_logits]).mean()


def feature_matching_loss(real_features: list[list[torch.Tensor]], fake_features: list[list[torch.Tensor]]) -> torch.Tensor:
    """Mean over scales and layers of |f_real - f_fake|_1 / mean |f_real| (relative, as in EnCodec)."""
    terms = []
    for reals, fakes in zip(real_features, fake_features):
        for r, f in zip(reals, fakes):
            r = r.detach()
            terms.append((r - f).abs().mean() / (r.abs().mean() + 1e-8))
    return torch.stack(terms).mean()


def save_discriminator(discriminator: CodecDiscriminator, path: str | os.PathLike) -> None:
    """Weights to safetensors, constructor settings in its metadata (written where the caller says)."""
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in discriminator.state_dict().items()}
    save_file(state, str(path), metadata={"config": json.dumps(discriminator.config)})


def load_discriminator(path: str | os.PathLike) -> CodecDiscriminator:
    """Rebuild a discriminator written by `save_discriminator` (or `Codec.save_pretrained(..., discriminator=)`)."""
    path = str(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no discriminator weights at {path}")
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
        state = load_file(path)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    if "config" not in meta:
        raise ValueError(f"{path}: no discriminator settings in its metadata")
    config = json.loads(meta["config"])
    if config.get("periods") == []:  # written before the period discriminators went (git 69f8875): none
        config = {k: v for k, v in config.items() if k not in ("periods", "period_filters")}
    expected = set(inspect.signature(CodecDiscriminator.__init__).parameters) - {"self"}
    if set(config) != expected:
        raise ValueError(f"{path}: discriminator settings {sorted(config)}, expected {sorted(expected)}")
    disc = CodecDiscriminator(**config)
    try:
        disc.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: weights do not match its settings ({str(e).splitlines()[0]})") from None
    return disc
