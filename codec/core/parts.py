"""The codec's parts and their registry: a part kind is a frozen settings dataclass and an nn.Module
built from it (`from_config(config, codec_config)`), registered in the part's own module with
`@register_part(role, kind, ConfigClass)`; a codec config names it (`decoder: {kind: ..., ...}`).

What `Codec`, codec.core.streaming, codec.core.int8 and codec.neural.training need of a part:
  encoder: forward(wav [B, C, T * hop]) -> z [B, latent_dim, T]; frame_span() -> (lo, hi);
           streaming_step() -> a codec.core.streaming_layers.Step (wav chunks -> latent frames)
  decoder: forward(z [B, latent_dim, T]) -> wav [B, C, T * hop]; streaming_step(exact) -> a DecoderStream
  config:  optional check(codec_config) -> None, ValueError where the part cannot fit the codec
Int8 export takes a decoder's nn.Linear layers, whatever the part. tests/test_codec_parts.py
registers a toy decoder in the test file alone.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol

import torch

ROLES = ("encoder", "decoder")
_BUILTIN_MODULES = ("codec.neural.seanet", "codec.neural.istft_decoder", "codec.source_filter.parts")  # the parts that ship with rvqlm
_REGISTRY: dict[str, dict[str, tuple[type, type]]] = {role: {} for role in ROLES}


class DecoderStream(Protocol):
    """A decoder over chunks: `step(z [B, D, t]) -> wav [B, C, samples now final]`; `flush(batch)`
    -> the samples still held back, [B, C, lookahead_samples]; `lookahead_samples`: how far the
    audio lags the latent frames."""

    lookahead_samples: int

    def step(self, z: torch.Tensor) -> torch.Tensor: ...

    def flush(self, batch: int) -> torch.Tensor: ...


def register_part(role: str, kind: str, config_class: type) -> Callable[[type], type]:
    """Class decorator: register a module class (with `from_config`) as the `kind` of `role`,
    built from `config_class` settings. A kind is registered once."""
    if role not in ROLES:
        raise ValueError(f"a codec part is one of {ROLES}, got {role!r}")

    def register(module_class: type) -> type:
        known = _REGISTRY[role].get(kind)
        if known is not None and known != (config_class, module_class):
            raise ValueError(f"codec {role} kind {kind!r} is already registered ({known[1].__name__})")
        _REGISTRY[role][kind] = (config_class, module_class)
        config_class.kind = kind
        return module_class

    return register


def _entry(role: str, kind: Any) -> tuple[type, type]:
    for name in _BUILTIN_MODULES:
        importlib.import_module(name)
    if not isinstance(kind, str) or kind not in _REGISTRY[role]:
        raise ValueError(f"unknown codec {role} kind {kind!r}; registered: {sorted(_REGISTRY[role])}")
    return _REGISTRY[role][kind]


def part_config_class(role: str, kind: str) -> type:
    """The settings dataclass of `role` kind `kind`."""
    return _entry(role, kind)[0]


def build_part(role: str, config: Any, codec_config: Any) -> torch.nn.Module:
    """The module of part `config` (a registered settings dataclass) in a codec of `codec_config`."""
    return _entry(role, config.kind)[1].from_config(config, codec_config)
