"""Shared helpers of the seed conformance tests: tiny float64 models with every weight redrawn."""

from __future__ import annotations

import torch

from lm import LMConfig, MultiCodebookLM


def tiny(**overrides) -> LMConfig:
    base = dict(n_codebooks=1, codebook_size=7, d_model=8, n_layers=2, n_heads=2, max_seq_len=16,
                pattern="parallel")
    base.update(overrides)
    return LMConfig(**base)


def randomized(module: torch.nn.Module, std: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """float64, eval mode, frozen, every parameter redrawn from N(0, std^2) (norm gains around 1)."""
    gen = torch.Generator().manual_seed(seed)
    module = module.double().eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype) * std
            gain = name.endswith("weight") and p.dim() == 1  # a norm's gamma / w: keep it around 1
            p.copy_(1.0 + noise if gain else noise)
    return module.requires_grad_(False)


def tiny_model(**overrides) -> MultiCodebookLM:
    return randomized(MultiCodebookLM(tiny(**overrides)))


def keep_first_input(module: torch.nn.Module, store: dict, key: str) -> None:
    """Record the first input `module` receives as store[key] (the hook returns None: changes nothing)."""
    def hook(mod, args):
        store.setdefault(key, args[0])
    module.register_forward_pre_hook(hook)


def keep_first_output(module: torch.nn.Module, store: dict, key: str) -> None:
    """Record the first output of `module` as store[key] (the hook returns None: changes nothing)."""
    def hook(mod, args, out):
        store.setdefault(key, out)
    module.register_forward_hook(hook)
