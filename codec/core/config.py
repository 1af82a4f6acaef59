"""CodecConfig: every setting that shapes a codec, nested by part (the frame grid, then `encoder`,
`quantizer`, `decoder`: registered part kinds, codec.core.parts), validated, round-trippable to JSON; and
the bitrate arithmetic (frame rate x N_c x ceil(log2 |V|)), written once. The defaults are the
shipped codec's; codec.core.config_v1 reads version 1's flat form and gives its fingerprints.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from codec.core.config_v1 import flat_settings, flat_token_settings, nested_from_flat
from codec.core.parts import part_config_class
from rvqlm_core.settings import settings_from_dict

_TOP = ("sample_rate", "channels", "latent_dim")  # positive integers


def bits_per_code(codebook_size: int) -> int:
    """ceil(log2 |V|): 0 for |V| = 1, 1 for 2, 10 for 1000 and 1024, 12 for 4096."""
    if codebook_size < 1:
        raise ValueError(f"codebook_size must be >= 1, got {codebook_size}")
    return math.ceil(math.log2(codebook_size))


def bitrate_kbps(frame_rate: float, n_codebooks: float, codebook_size: int) -> float:
    """Kilobits per second of N_c codebooks of |V| codes at `frame_rate` frames/s, ceil(log2 |V|) bits a code."""
    return frame_rate * n_codebooks * bits_per_code(codebook_size) / 1000


def positive_ints(owner: str, **values: Any) -> None:
    """ValueError naming `owner.name` unless every value is a positive int (bools are not)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class QuantizerConfig:
    """The residual vector quantizer: N_c codebooks of |V| codes, EMA-updated (codec.core.quantizer)."""

    n_codebooks: int = 8  # N_c
    codebook_size: int = 1024  # |V|
    ema_decay: float = 0.99  # of the codebooks' EMA statistics
    kmeans_init: bool = True  # k-means on the first training batch
    kmeans_iters: int = 10  # Lloyd iterations of that k-means
    dead_code_threshold: float = 0.02  # EMA assignments per step under which a code is revived
    dropout: float = 0.5  # share of training examples that use a random k in 1..N_c
    commitment_weight: float = 1.0  # weight of the commitment loss

    def __post_init__(self) -> None:
        positive_ints("quantizer", n_codebooks=self.n_codebooks, codebook_size=self.codebook_size)
        if self.codebook_size < 2:
            raise ValueError(f"quantizer.codebook_size must be >= 2, got {self.codebook_size}")


DEFAULT_KINDS = {"encoder": "seanet", "decoder": "istft"}  # the shipped codec's parts


def _default_part(role: str):
    return lambda: part_config_class(role, DEFAULT_KINDS[role])()


@dataclass(frozen=True)
class CodecConfig:
    """The settings of a `Codec`: the frame grid shared by its parts, and each part's own settings
    (`encoder` and `decoder`: registered part configs, codec.core.parts). docs/codec.md gives each reason."""

    sample_rate: int = 16000  # Hz
    channels: int = 1  # audio channels C
    strides: tuple[int, ...] = (4, 4, 5, 4)  # down/up-sampling factors; their product is the hop
    latent_dim: int = 64  # D, the quantized latent's width
    causal: bool = True  # all padding on the left: a prefix encodes to the whole file's first frames
    encoder: Any = field(default_factory=_default_part("encoder"))
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)
    decoder: Any = field(default_factory=_default_part("decoder"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))  # lists from JSON / YAML
        positive_ints("CodecConfig", **{name: getattr(self, name) for name in _TOP})
        if not self.strides or any(s < 1 for s in self.strides):
            raise ValueError(f"CodecConfig.strides must be positive integers, got {self.strides}")
        if self.sample_rate % self.hop_length:
            raise ValueError(f"sample_rate {self.sample_rate} is not a multiple of hop_length {self.hop_length}; "
                             "frame_rate would not be an integer")
        for part in (self.encoder, self.decoder):
            if hasattr(part, "check"):
                part.check(self)

    @property
    def hop_length(self) -> int:
        return math.prod(self.strides)

    @property
    def frame_rate(self) -> int:
        return self.sample_rate // self.hop_length

    @property
    def n_codebooks(self) -> int:
        return self.quantizer.n_codebooks

    @property
    def codebook_size(self) -> int:
        return self.quantizer.codebook_size

    @property
    def bitrate_kbps(self) -> float:
        """Bitrate with all N_c codebooks."""
        return bitrate_kbps(self.frame_rate, self.n_codebooks, self.codebook_size)

    def to_dict(self) -> dict[str, Any]:
        """The nested JSON form (what config.json holds from format version 2 on)."""
        top = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in (*_TOP, "causal")}
        return {**top, "strides": list(self.strides), "encoder": part_dict(self.encoder),
                "quantizer": dataclasses.asdict(self.quantizer), "decoder": part_dict(self.decoder)}

    def shaping_settings(self) -> dict[str, Any]:
        """The dict `Codec.fingerprint` hashes: the version-1 flat settings where this codec has
        them (every codec version 1 could describe keeps its fingerprint), else `to_dict()`."""
        return flat_settings(self) or {"format_version": 2, **self.to_dict()}

    def token_settings(self) -> dict[str, Any]:
        """The dict `Codec.token_fingerprint` hashes: the shaping settings of what makes the tokens
        (frame grid, encoder, quantizer), version-1 flat where version 1 had them; never the decoder's."""
        nested = {k: v for k, v in self.to_dict().items() if k != "decoder"}
        return flat_token_settings(self) or {"format_version": 2, **nested}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "codec config") -> "CodecConfig":
        """Build from the nested dict (`to_dict`'s form; any setting left out is its default),
        refusing unknown keys by name. A part given without `kind` is the default kind."""
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object of CodecConfig settings, got {type(d).__name__}")
        d = dict(d)
        for role in ("encoder", "decoder"):
            if role in d:
                d[role] = part_from_dict(role, d[role], f"{source}: {role}")
        if "quantizer" in d:
            d["quantizer"] = settings_from_dict(QuantizerConfig, d["quantizer"], f"{source}: quantizer")
        return settings_from_dict(cls, d, source)

    @classmethod
    def from_flat(cls, d: dict[str, Any], *, source: str = "codec config") -> "CodecConfig":
        """Build from version 1's flat dict (config.json of format version 1; missing settings take
        version 1's defaults, e.g. a SEANet decoder). codec.core.config_v1 has the mapping."""
        return cls.from_dict(nested_from_flat(d, source), source=source)


ADDED_LATER = "added_later"  # field metadata: a setting left out of the JSON (and so of the fingerprints) at its default


def added_later(default: Any) -> Any:
    """A part setting added after codecs were saved without it: at its default it is not written, so a
    codec saved before it keeps its config.json and fingerprints."""
    return dataclasses.field(default=default, metadata={ADDED_LATER: True})


def part_dict(part: Any) -> dict[str, Any]:
    """A part config as JSON: {"kind": ..., its fields}, tuples as lists; an `added_later` field at its
    default is left out."""
    fields = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)
              if not (f.metadata.get(ADDED_LATER) and getattr(part, f.name) == f.default)}
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
    return {"kind": part.kind, **fields}


def part_from_dict(role: str, d: Any, source: str) -> Any:
    """The registered config of `d` ({"kind": ..., settings}); an already-built config as is."""
    if dataclasses.is_dataclass(d):
        return d
    if not isinstance(d, dict):
        raise ValueError(f"{source}: expected an object of {role} settings, got {type(d).__name__}")
    d = dict(d)
    kind = d.pop("kind", DEFAULT_KINDS[role])
    return settings_from_dict(part_config_class(role, kind), d, source)
