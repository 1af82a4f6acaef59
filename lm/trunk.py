"""LMTrunk: what every LM family of rvqlm shares, the trunk of a multi-codebook transformer.

    tokens [B, N_c, S] ids (specials included)
      -> sum over codebooks of E_c[tokens[:, c]]           [B, S, d]   (N_c embedding tables, summed)
      (+ the speaker's voice row; + P[positions] for sinusoidal / learned encodings)
      -> n_layers pre-norm blocks (RoPE inside attention; the mask is the family's) -> final norm
      -> N_c heads, head c: [B, S, d] -> [B, S, n_outputs]  stacked: [B, N_c, S, n_outputs]

A conditioned LM (LMConfig.condition) adds a condition encoder over text bytes and a speaker
(lm.conditioning) whose output every block reads through cross-attention. A family (lm.families)
is a subclass that adds its forward (which positions see which) and its loss; the folders
(config.json + model.safetensors) are the same for every family.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor, nn

from lm.aligned_text import frames_at
from lm.conditioning import ConditionEncoder, ConditionInputs, condition_inputs
from lm.config import LMConfig
from lm.decode_step import prepare
from lm.families import family_of
from lm.int8 import float_state, head_logits, int8_head_weights, to_int8
from lm.kv_cache import CrossMemory, KVCache
from lm.layers import (Block, LayerNorm, LearnedPositions, RMSNorm, SinusoidalPositions, init_std, make_norm,
                       residual_projections)
from lm.patterns import CodebookPattern, get_pattern
from lm.rope import RotaryEmbedding
from rvqlm_core.persistence import (FolderFormat, dequantized_state, load_state, quantized_state, read_folder,
                                    save_folder, stored_state)
from rvqlm_core.weight_dtype import QUANTIZED_DTYPES

# How an LM folder's config.json names its kind: {"model_type": ..., "format_version": 1, "config": {...}}.
LM_FORMAT = FolderFormat("LM", "model_type", "rvqlm.MultiCodebookLM", 1)

@dataclass
class LMLoss:
    """loss: mean NLL (nats) over all valid targets of all codebooks (a scalar, differentiable).
    nll_sum [N_c]: summed NLL per codebook; count [N_c]: valid targets per codebook (long)."""

    loss: Tensor
    nll_sum: Tensor
    count: Tensor
    guide: Tensor | None = None  # the guided-attention loss (lm.alignment), when asked for
    duration: Tensor | None = None  # an aligned-text LM's duration loss (lm.aligned_text), when targets are given

    def per_codebook(self) -> Tensor:
        """[N_c] mean NLL per codebook (nan where a codebook has no valid target)."""
        return self.nll_sum.detach() / self.count

    def perplexity(self) -> Tensor:
        """exp(mean cross-entropy) over all valid targets (docs/theory.md, seed 001)."""
        return self.loss.detach().exp()


class LMTrunk(nn.Module):
    """The embeddings, blocks, heads and condition encoder every LM family shares (see the module
    docstring); a family's subclass sets `family` (its LMConfig.family) and adds forward and loss.
    save_pretrained / from_pretrained: a folder of config.json + model.safetensors."""

    family = ""  # the LMConfig.family a subclass builds

    def __init__(self, cfg: LMConfig):
        super().__init__()
        if not isinstance(cfg, LMConfig):
            raise TypeError(f"{type(self).__name__} needs an LMConfig, got {type(cfg).__name__}")
        if cfg.family != self.family:
            raise ValueError(f"this config is of the {cfg.family!r} LM family, not {self.family!r}: build or load "
                             "it with lm.trunk.load_lm or build_lm")
        self.config = cfg
        self.pattern: CodebookPattern = get_pattern(cfg.pattern, cfg.n_codebooks)
        # All N_c tables live in one embedding of N_c * (|V| + 2) rows; codebook c's table is the
        # slice starting at c * (|V| + 2) (see `codebook_table`). One gather then embeds all streams.
        self.token_embedding = nn.Embedding(cfg.n_codebooks * cfg.embedding_rows, cfg.d_model)
        self.register_buffer("codebook_offsets", torch.arange(cfg.n_codebooks) * cfg.embedding_rows,
                             persistent=False)
        self.pos_embedding: nn.Module | None = None
        self.rope: RotaryEmbedding | None = None
        if cfg.pos == "sinusoidal":
            self.pos_embedding = SinusoidalPositions(cfg.d_model, cfg.max_seq_len)
        elif cfg.pos == "learned":
            self.pos_embedding = LearnedPositions(cfg.d_model, cfg.max_seq_len)
        else:
            self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_base)
        self.dropout = nn.Dropout(cfg.dropout)
        conditioned = cfg.condition is not None
        self.blocks = nn.ModuleList(Block(cfg, i, cross=conditioned) for i in range(cfg.n_layers))
        self.final_norm = make_norm(cfg)
        # Head c maps [.., d] to n_outputs logits: weight [N_c, n_outputs, d]. Tied: codebook c's table's first rows.
        self.head_weight = None if cfg.tie_weights else nn.Parameter(
            torch.empty(cfg.n_codebooks, cfg.n_outputs, cfg.d_model))
        if conditioned:  # registered last, so an unconditioned LM's modules come in their old order
            self.condition_encoder = ConditionEncoder(cfg)
        else:
            self.condition_encoder = None
        self.int8_head = None  # an int8 LM's heads (lm.int8.to_int8), which then replace head_weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 style: N(0, 0.02) for weights and embeddings, zero biases, unit norm gains, and the
        projections that write into the residual stream scaled by 1 / sqrt(2 n_layers)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=init_std(self.config.n_layers, residual=False))
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, (LayerNorm, RMSNorm)):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in residual_projections(block):
                nn.init.normal_(proj.weight, std=init_std(self.config.n_layers, residual=True))
        if self.condition_encoder is not None:
            self.condition_encoder.reset_voice()
            for block in self.condition_encoder.blocks:
                for proj in residual_projections(block):
                    nn.init.normal_(proj.weight, std=init_std(len(self.condition_encoder.blocks), residual=True))
        if self.head_weight is not None:
            nn.init.normal_(self.head_weight, std=0.02)

    def codebook_table(self, c: int) -> Tensor:
        """Codebook c's embedding table W_E^(c): [|V| + 2, d] (a view of the shared weight)."""
        rows = self.config.embedding_rows
        return self.token_embedding.weight[c * rows:(c + 1) * rows]

    def head_weights(self) -> Tensor:
        """[N_c, n_outputs, d]: head c gives logits h @ W[c]^T. Tied: each codebook's table without pad and bos."""
        if self.int8_head is not None:
            return int8_head_weights(self.int8_head, self.config.n_codebooks)
        if self.head_weight is not None:
            return self.head_weight
        w = rearrange(self.token_embedding.weight, "(c r) d -> c r d", c=self.config.n_codebooks)
        return w[:, :self.config.n_outputs]

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Trainable parameters (each shared tensor once). exclude_embeddings drops the token and learned
        position tables (tied heads then count nothing: they are the token table)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.token_embedding.weight.numel()
            if isinstance(self.pos_embedding, LearnedPositions):
                n -= self.pos_embedding.table.weight.numel()
        return n

    @property
    def device(self) -> torch.device:
        return self.token_embedding.weight.device

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, N_c, S] -> summed embeddings [B, S, d]: sum_c E_c[tokens[:, c]]."""
        rows = tokens + self.codebook_offsets[None, :, None]
        return self.token_embedding(rows).sum(dim=1)

    def trunk(self, tokens: Tensor, positions: Tensor, mask: Tensor | None, cache: KVCache | None,
              memory: CrossMemory | None) -> Tensor:
        """The summed embeddings (plus the speaker's voice row and absolute positions where the model
        has them), dropout, the blocks and the final norm: tokens [B, N_c, S] -> states [B, S, d].
        positions [S]; mask: the attention mask the blocks take (None: causal)."""
        h = self.embed(tokens)
        if memory is not None and memory.voice is not None:
            h = h + memory.voice.to(h.dtype)[:, None, :]
        if memory is not None and memory.frames is not None:
            h = h + frames_at(memory.frames, positions).to(h.dtype)
        if self.pos_embedding is not None:
            h = h + self.pos_embedding(positions)
        h = self.dropout(h)
        rope = self.rope.cos_sin(positions, h.dtype) if self.rope is not None else None
        for block in self.blocks:
            h = block(h, rope, cache, mask, memory)
        return self.final_norm(h)

    def logits(self, h: Tensor) -> Tensor:
        """The N_c heads: final-norm states h [B, S, d] -> logits [B, N_c, S, n_outputs] (int8 heads in an int8 LM)."""
        if self.int8_head is not None:
            return head_logits(self.int8_head, h, self.config.n_codebooks)
        return torch.einsum("bsd,cvd->bcsv", h, self.head_weights().to(h.dtype))

    def _memory_for(self, batch_size: int, memory: CrossMemory | None) -> CrossMemory | None:
        """The memory a forward over batch_size rows reads: the null conditions' when none is given."""
        if self.condition_encoder is None:
            if memory is not None:
                raise ValueError("this LM has no condition encoder (LMConfig.condition is None): it takes no memory")
            return None
        if memory is None:
            return self.encode_condition(None, batch_size)
        if memory.batch_size != batch_size:
            raise ValueError(f"the condition memory has {memory.batch_size} rows, the tokens {batch_size}")
        return memory

    def condition_inputs(self, text, speaker, batch_size: int, durations=None) -> ConditionInputs:
        """Texts and speaker names (one per row, one for all, or None) -> ConditionInputs on the model's
        device; ValueError naming what is allowed (see lm.conditioning.condition_inputs). durations: an
        aligned-text LM's frames per unit (None: predicted)."""
        if self.config.condition is None:
            raise ValueError("this LM is not conditioned (no condition encoder): it takes no text or speaker")
        return condition_inputs(self.config.condition, text, speaker, batch_size, durations).to(self.device)

    def encode_condition(self, inputs: ConditionInputs | None, batch_size: int | None = None) -> CrossMemory:
        """Conditions [B] -> the encoder output CrossMemory (states [B, M, d], mask [B, M]); None: B
        rows of null conditions. In training mode text and speaker are dropped at their rates."""
        if self.condition_encoder is None:
            raise ValueError("this LM is not conditioned (no condition encoder): it takes no text or speaker")
        if inputs is None:
            inputs = self.condition_encoder.null_inputs(batch_size or 1)
        return self.condition_encoder(inputs.to(self.device))

    def cross_memory(self, inputs: ConditionInputs | None, batch_size: int | None = None) -> CrossMemory:
        """`encode_condition` plus every block's cross-attention keys and values, computed once here for
        a whole generation (the cross-attention cache; each step's forward only reads them)."""
        memory = self.encode_condition(inputs, batch_size)
        memory.kv = [block.cross_attn.keys_values(memory.states) for block in self.blocks]
        return memory

    def duration_loss(self, memory: CrossMemory | None, condition: ConditionInputs | None) -> Tensor | None:
        """An aligned-text LM's duration loss (lm.aligned_text) of `memory`, the encoding of `condition`,
        where the condition carries duration targets; None otherwise."""
        if memory is None or memory.frames is None or condition is None or condition.durations is None:
            return None
        return self.condition_encoder.frame_text.duration_loss(
            memory.states, condition.durations.to(memory.states.device), memory.text_len)

    def _check_codes(self, codes: Tensor, frame_mask: Tensor | None) -> None:
        cfg = self.config
        if codes.dim() != 3 or codes.shape[1] != cfg.n_codebooks:
            raise ValueError(f"codes must have shape [B, {cfg.n_codebooks}, T], got {tuple(codes.shape)}")
        if codes.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"codes must be integers, got {codes.dtype}")
        if codes.shape[-1] < 1:
            raise ValueError("codes must hold at least one frame")
        if not torch.compiler.is_compiling() and bool(((codes < 0) | (codes >= cfg.codebook_size)).any()):
            raise ValueError(f"codes must be in 0..{cfg.codebook_size - 1} (codebook_size={cfg.codebook_size})")
        if self.pattern.sequence_length(codes.shape[-1]) > cfg.max_seq_len:
            raise ValueError(f"{codes.shape[-1]} frames take {self.pattern.sequence_length(codes.shape[-1])} "
                             f"positions with the {cfg.pattern} pattern, more than max_seq_len={cfg.max_seq_len} "
                             f"(at most {cfg.max_frames} frames)")
        if frame_mask is not None:
            if frame_mask.dtype != torch.bool or frame_mask.shape != (codes.shape[0], codes.shape[-1]):
                raise ValueError(f"frame_mask must be bool [B, T] = {[codes.shape[0], codes.shape[-1]]}, "
                                 f"got {frame_mask.dtype} {list(frame_mask.shape)}")
            if bool((frame_mask[:, 1:] & ~frame_mask[:, :-1]).any()):
                raise ValueError("frame_mask must mark padding at the end of each row only "
                                 "(True frames first, then False): the model reads left to right")

    def save_pretrained(self, path: str | Path, dtype: str | None = None) -> Path:
        """Write folder `path`: config.json ({"model_type", "format_version", "config": the LMConfig})
        and model.safetensors (the weights, with the config in their metadata), replacing the folder
        atomically (see rvqlm_core.persistence). dtype: store floating-point weights as "float16" or
        "bfloat16" (None / "float32": exactly); `from_pretrained` loads them back as float32. "int8": int8
        weights with per-row scales, loaded as an inference-only int8 LM (lm.int8); an int8 LM saves
        its weights as stored (any other dtype: dequantized)."""
        state = float_state(self)
        if dtype in QUANTIZED_DTYPES:
            return save_folder(path, LM_FORMAT, {"config": self.config.to_dict(), "weight_dtype": dtype},
                               quantized_state(state, lambda name: True))
        return save_folder(path, LM_FORMAT, {"config": self.config.to_dict()}, stored_state(state, dtype))

    @classmethod
    def from_pretrained(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "LMTrunk":
        """Load a folder written by save_pretrained. Raises FileNotFoundError / ValueError with the reason."""
        config, tensors = read_folder(path, LM_FORMAT, map_location)
        weight_dtype = config.get("weight_dtype", "float")
        state, pairs = dequantized_state(tensors)
        if weight_dtype not in ("float", *QUANTIZED_DTYPES) or bool(pairs) != (weight_dtype == "int8"):
            raise ValueError(f"{path}: weight_dtype {weight_dtype!r} does not describe its weights "
                             f"({len(pairs)} int8 tensors); export the LM again")
        model = cls(LMConfig.from_dict(config.get("config")))
        load_state(model, state, path)
        if pairs:
            to_int8(model, pairs)
        model = model.to(map_location)
        return prepare(model) if pairs else model


# ---- loading an LM of any family ---------------------------------------------------------------------

def read_lm_config(path: str | Path) -> LMConfig:
    """The LMConfig of a saved LM folder (its config.json), without the weights: the one reader of an
    LM folder's config. FileNotFoundError / ValueError in one line naming the file."""
    file = Path(path) / "config.json"
    try:
        header = json.loads(file.read_text(encoding="utf-8"))
    except OSError:
        raise FileNotFoundError(f"{path} is not a saved LM: {file.name} is missing") from None
    except ValueError as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(header, dict) or any(header.get(k) != v for k, v in LM_FORMAT.header().items()):
        raise ValueError(f"{file} does not describe an rvqlm LM of format version {LM_FORMAT.version}")
    return LMConfig.from_dict(header.get("config"), str(file))


def build_lm(config: LMConfig) -> LMTrunk:
    """A fresh model of the family `config.family` names (lm.families)."""
    return family_of(config.family).resolve("model_class")(config)


def load_lm(path: str | Path, map_location: str | torch.device = "cpu") -> LMTrunk:
    """`from_pretrained` of the class the folder's family names (where its config cannot be read, the
    trunk's, which raises the folder's own error)."""
    try:
        model_class = family_of(read_lm_config(path).family).resolve("model_class")
    except (OSError, ValueError):
        model_class = LMTrunk
    return model_class.from_pretrained(path, map_location=map_location)
