"""LMConfig: every hyper-parameter of a MultiCodebookLM, validated, and round-trippable to JSON.

Token ids. The LM sees N_c parallel streams of ids, one per codebook, each id in 0..|V|-1
(codes are counted from 0, where docs/theory.md's seed 002 counts from 1). Every codebook's
embedding table has two extra rows for special ids the heads never predict:

    pad_id = |V|        padding, and positions the codebook pattern marks invalid
    bos_id = |V| + 1    the start symbol x_0 (docs/theory.md, seed 000): the first model input

A conditioned LM (`condition` set, see lm.conditioning) also predicts an end-of-audio id, so its
heads have |V| + 1 outputs and the specials move up by one: end_id = |V|, pad_id = |V| + 1,
bos_id = |V| + 2 (see lm.end_of_audio). Without `condition` the ids, the heads and the saved
config are exactly those of an unconditioned LM.

Families. `family` names the registered family (lm.families) whose model a config builds: "ar",
the decoder-only next-token LM (lm.model), or "masked", the bidirectional masked-token LM
(lm.masked_model, parallel pattern only) whose id |V| + 1 is its mask token where an AR LM has bos,
and which never predicts an end of audio. An "ar" config's saved dict has no `family` key.

Lengths. `max_seq_len` counts model positions, i.e. steps of the codebook pattern: with the
delay pattern, T frames take T + N_c - 1 positions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from lm.families import DEFAULT_FAMILY, PATTERNS, family_of
from rvqlm_core.settings import settings_from_dict

NORMS = ("rmsnorm", "layernorm")
FFNS = ("swiglu", "gelu", "relu")
POSITIONS = ("rope", "sinusoidal", "learned")


@dataclass
class ConditionConfig:
    """The condition encoder of a conditioned LM (lm.conditioning): a speaker table, the longest
    text it reads (UTF-8 bytes), its depth, and the rates at which training drops text and speaker
    (independently) to their learned null conditions. Speaker i of `speakers` has id i; the null
    speaker is id len(speakers)."""

    speakers: list[str] = field(default_factory=list)
    text_max_bytes: int = 512  # the built-in corpus's longest line is 297 bytes
    encoder_layers: int = 2
    text_dropout: float = 0.1
    speaker_dropout: float = 0.1
    guided_attention: float = 0.0  # weight of the guided-attention loss in training (lm.alignment); 0: none
    guided_sigma: float = 0.2  # its width g, in fractions of the text and of the audio
    guided_heads: int = 2  # the first guided_heads cross-attention heads of every decoder layer are guided
    context_noise: float = 0.0  # training: each input code replaced by a random one at this rate (Tacotron's
    # prenet-dropout bottleneck: an unreliable audio history makes the decoder lean on its text)
    alphabet: str = ""  # aligned text (lm.aligned_text): the units the LM reads (lm.text_units); "": UTF-8 bytes
    duration_loss: float = 1.0  # weight of the duration predictor's squared error (aligned text only)

    def __post_init__(self) -> None:
        if not isinstance(self.speakers, (list, tuple)) or not all(isinstance(s, str) and s for s in self.speakers):
            raise ValueError(f"condition.speakers must be a list of non-empty names, got {self.speakers!r}")
        self.speakers = list(self.speakers)
        if len(set(self.speakers)) != len(self.speakers):
            raise ValueError(f"condition.speakers names a speaker twice: {self.speakers}")
        for name, low in (("text_max_bytes", 1), ("encoder_layers", 0), ("guided_heads", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"condition.{name} must be an integer >= {low}, got {value!r}")
        for name in ("text_dropout", "speaker_dropout", "context_noise"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"condition.{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.alphabet and (not isinstance(self.alphabet, str) or not self.alphabet.startswith("_ ")
                              or len(set(self.alphabet)) != len(self.alphabet) or len(self.alphabet) > 256):
            raise ValueError("condition.alphabet must be lm.text_units' alphabet: '_', ' ', then distinct letters "
                             f"(at most 256 units), got {self.alphabet!r}")
        if not self.duration_loss >= 0.0:
            raise ValueError(f"condition.duration_loss must be >= 0, got {self.duration_loss!r}")
        if not self.guided_attention >= 0.0 or not self.guided_sigma > 0.0:
            raise ValueError(f"condition.guided_attention must be >= 0 and guided_sigma > 0, got "
                             f"{self.guided_attention!r} and {self.guided_sigma!r}")

    @property
    def guided(self) -> bool:
        """Training weights the guided-attention loss (lm.alignment) on at least one head."""
        return self.guided_attention > 0 and self.guided_heads > 0

    @property
    def null_speaker(self) -> int:
        return len(self.speakers)

    def speaker_id(self, name: str) -> int:
        """The id of speaker `name`; ValueError naming the known speakers."""
        if name not in self.speakers:
            raise ValueError(f"unknown speaker {name!r}; this LM knows: {', '.join(self.speakers) or '(none)'}")
        return self.speakers.index(name)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "LM condition config") -> "ConditionConfig":
        """Build from a dict of the fields, refusing unknown keys by name. The keys of the guided-alignment
        experiment (docs/experiments.md), off in every saved LM, are read as the nothing they did."""
        if isinstance(data, dict) and not data.get("guided_alignment"):
            data = {k: v for k, v in data.items() if k not in ("guided_alignment", "guided_sigma_bytes")}
        return settings_from_dict(cls, data, source)


@dataclass
class LMConfig:
    n_codebooks: int = 8
    codebook_size: int = 1024
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: = n_heads (plain multi-head attention); fewer: GQA
    d_ff: int | None = None  # None: 4 d for relu/gelu, ~8/3 d (rounded up to 32) for swiglu
    norm: str = "rmsnorm"
    ffn: str = "swiglu"
    pos: str = "rope"
    max_seq_len: int = 1024
    rope_base: float = 10000.0
    dropout: float = 0.0
    tie_weights: bool = False
    pattern: str = "delay"
    bias: bool = False
    norm_eps: float = 1e-5
    codec_fingerprint: str | None = None  # the codec the training tokens came from
    condition: ConditionConfig | None = None  # None: an unconditioned LM (no encoder, no end-of-audio id)
    n_experts: int = 0  # 0: a dense FFN; E > 0: a mixture of E experts of the `ffn` kind (lm.moe)
    moe_top_k: int = 1  # experts per position (softmax over their router logits)
    moe_aux_weight: float = 0.01  # weight of the load-balancing loss added in training
    family: str = DEFAULT_FAMILY  # a registered LM family (lm.families): "ar" next-token, "masked" masked-token

    def __post_init__(self) -> None:
        if isinstance(self.condition, dict):
            self.condition = ConditionConfig.from_dict(self.condition)
        if self.condition is not None and not isinstance(self.condition, ConditionConfig):
            raise ValueError(f"LMConfig.condition must be a ConditionConfig, a dict of one, or None, "
                             f"got {type(self.condition).__name__}")
        def positive_int(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LMConfig.{name} must be a positive integer, got {value!r}")

        for name in ("n_codebooks", "codebook_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
            positive_int(name)
        if self.n_kv_heads is not None:
            positive_int("n_kv_heads")
        if self.d_ff is not None:
            positive_int("d_ff")
        if isinstance(self.n_experts, bool) or not isinstance(self.n_experts, int) or self.n_experts < 0:
            raise ValueError(f"LMConfig.n_experts must be an integer >= 0 (0: dense FFN), got {self.n_experts!r}")
        if self.n_experts and not (isinstance(self.moe_top_k, int) and 1 <= self.moe_top_k <= self.n_experts):
            raise ValueError(f"LMConfig.moe_top_k must be in 1..n_experts={self.n_experts}, got {self.moe_top_k!r}")
        if not self.moe_aux_weight >= 0:
            raise ValueError(f"LMConfig.moe_aux_weight must be >= 0, got {self.moe_aux_weight!r}")
        for name, value, allowed in (("norm", self.norm, NORMS), ("ffn", self.ffn, FFNS),
                                     ("pos", self.pos, POSITIONS), ("pattern", self.pattern, PATTERNS)):
            if value not in allowed:
                raise ValueError(f"LMConfig.{name} must be one of {allowed}, got {value!r}")
        family = family_of(self.family)
        if self.pattern not in family.patterns:
            raise ValueError(f"a {family.name!r} LM takes the pattern {' or '.join(map(repr, family.patterns))}, "
                             f"got {self.pattern!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}): "
                             "each head has d_v = d_model / n_heads features")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.pos == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE rotates feature pairs, so the head dimension ({self.head_dim}) must be even")
        if self.condition is not None and self.head_dim % 2:
            raise ValueError(f"the condition encoder uses RoPE, so the head dimension ({self.head_dim}) must be even")
        if self.condition is not None and self.condition.guided_heads > self.n_heads:
            raise ValueError(f"condition.guided_heads ({self.condition.guided_heads}) is more than the "
                             f"{self.n_heads} heads of each cross-attention")
        if self.pos == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"the sinusoidal encoding needs an even d_model, got {self.d_model}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LMConfig.dropout must be in [0, 1), got {self.dropout}")
        if not self.norm_eps > 0:
            raise ValueError(f"LMConfig.norm_eps must be > 0, got {self.norm_eps}")
        if not self.rope_base > 1:
            raise ValueError(f"LMConfig.rope_base must be > 1, got {self.rope_base}")
        if self.pattern == "delay" and self.max_seq_len < self.n_codebooks:
            raise ValueError(f"max_seq_len ({self.max_seq_len}) is too short for the delay pattern "
                             f"over {self.n_codebooks} codebooks (needs at least n_codebooks positions)")

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def end_id(self) -> int | None:
        """The end-of-audio id of a conditioned LM whose family predicts one (an AR LM; None without `condition`)."""
        return None if self.condition is None or not family_of(self.family).predicts_end else self.codebook_size

    @property
    def n_outputs(self) -> int:
        """Logits per head: |V| codes, plus end-of-audio in a conditioned AR LM."""
        return self.codebook_size + (self.end_id is not None)

    @property
    def pad_id(self) -> int:
        return self.n_outputs

    @property
    def bos_id(self) -> int:
        return self.n_outputs + 1

    @property
    def embedding_rows(self) -> int:
        """Rows of each codebook's embedding table: the head's outputs + pad + bos."""
        return self.n_outputs + 2

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if self.ffn == "swiglu":  # two input matrices instead of one: 2/3 of 4d keeps the parameter count
            return 32 * math.ceil(8 * self.d_model / 3 / 32)
        return 4 * self.d_model

    @property
    def max_frames(self) -> int:
        """The most frames whose pattern sequence fits in max_seq_len positions."""
        return self.max_seq_len - (self.n_codebooks - 1 if self.pattern == "delay" else 0)

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON values; an unconditioned LM's has no `condition` key and an AR LM's no
        `family` key (as before they existed)."""
        out = dataclasses.asdict(self)
        if self.condition is None:
            del out["condition"]
        if not self.n_experts:  # a dense LM's dict is as before experts existed
            for key in ("n_experts", "moe_top_k", "moe_aux_weight"):
                del out[key]
        if self.family == DEFAULT_FAMILY:  # the default family's dict is as before families existed
            del out["family"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "LM config") -> "LMConfig":
        """Build from a dict of the fields, refusing unknown keys by name."""
        return settings_from_dict(cls, data, source)
