"""MultiCodebookLM: a decoder-only transformer over N_c parallel token streams.

    tokens [B, N_c, S] ids (pattern space, specials included)
      -> sum over codebooks of E_c[tokens[:, c]]           [B, S, d]   (N_c embedding tables, summed)
      (+ P[positions] for sinusoidal / learned encodings)
      -> n_layers pre-norm blocks (RoPE inside attention) -> final norm
      -> N_c heads, head c: [B, S, d] -> [B, S, |V|]        stacked: [B, N_c, S, |V|]

Training (next-token prediction; docs/theory.md, seed 000): frames [B, N_c, T] are laid out by
the codebook pattern into seq [B, N_c, S]; the inputs are [bos, seq[..., :-1]] (the targets
shifted right by one) and the targets are seq. Padding and pattern-invalid positions are left
out of both the sum and the count of the loss.

A conditioned LM (LMConfig.condition) adds a condition encoder over text bytes and a speaker
(lm.conditioning) whose output every block reads through cross-attention, and an end-of-audio
output in each head (lm.end_of_audio); without `condition` none of it exists.

The model knows nothing about audio: a codec fingerprint travels in the config only so that
tokens from another codec can be refused by the code that loads both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from lm.conditioning import ConditionEncoder, ConditionInputs, condition_inputs
from lm.config import LMConfig
from lm.alignment import forward_recording, guided_attention_loss, noisy_context
from lm.end_of_audio import layout_with_end
from lm.generate import generate
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

    def per_codebook(self) -> Tensor:
        """[N_c] mean NLL per codebook (nan where a codebook has no valid target)."""
        return self.nll_sum.detach() / self.count

    def perplexity(self) -> Tensor:
        """exp(mean cross-entropy) over all valid targets (docs/theory.md, seed 001)."""
        return self.loss.detach().exp()


class MultiCodebookLM(nn.Module):
    """A decoder-only transformer over N_c parallel code streams: N_c embedding tables summed at the
    input, N_c output heads, a codebook pattern (lm.patterns) between frames and model positions.

    forward: tokens [B, N_c, S] ids (pattern space, specials included) -> logits [B, N_c, S, n_outputs]
    (n_outputs = |V|, or |V| + 1 with the end-of-audio id of a conditioned LM).
    loss / token_nll / log_likelihood: codes [B, N_c, T] in 0..|V|-1 (frames; the pattern is
    applied inside). generate: prompt [B, N_c, T0] -> codes [B, N_c, T0 + n].
    save_pretrained / from_pretrained: a folder of config.json + model.safetensors.
    """

    family = "ar"  # the LMConfig.family this class builds (lm.masked_model.MaskedLM: "masked")

    def __init__(self, cfg: LMConfig):
        super().__init__()
        if not isinstance(cfg, LMConfig):
            raise TypeError(f"MultiCodebookLM needs an LMConfig, got {type(cfg).__name__}")
        if cfg.family != self.family:
            raise ValueError(f"this config is of the {cfg.family!r} LM family, not {self.family!r}: build or load "
                             "it with lm.load_lm (or the family's class, e.g. lm.masked_model.MaskedLM)")
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

    # ---- parameters ------------------------------------------------------------------------------
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

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs (forward + backward) per model position, i.e. per frame of N_c tokens.

        6 N for the N parameters used in matrix products (blocks and heads, tied or not; embedding
        lookups are gathers and cost none; of a mixture's experts, the k a position runs), plus the attention scores and weighted values,
        12 n_layers d S per position for a context of S (default max_seq_len), as in PaLM's MFU.
        A conditioned LM's cross-attention keys/values and its encoder run per source position,
        not per frame, and are left out (a text is a few hundred bytes, a window hundreds of frames).
        """
        cfg = self.config
        s = cfg.max_seq_len if seq_len is None else seq_len
        active = cfg.moe_top_k / cfg.n_experts if cfg.n_experts else 1.0  # a position runs k of E experts
        matmul_params = sum(p.numel() * (active if ".ffn.experts." in name else 1.0)
                            for name, p in self.blocks.named_parameters()
                            if p.dim() == 2 and ".cross_attn.kv." not in name)
        matmul_params += cfg.n_codebooks * cfg.n_outputs * cfg.d_model
        return int(6 * matmul_params) + 12 * cfg.n_layers * cfg.d_model * s

    @property
    def device(self) -> torch.device:
        return self.token_embedding.weight.device

    # ---- forward ---------------------------------------------------------------------------------
    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, N_c, S] -> summed embeddings [B, S, d]: sum_c E_c[tokens[:, c]]."""
        rows = tokens + self.codebook_offsets[None, :, None]
        return self.token_embedding(rows).sum(dim=1)

    def forward(self, tokens: Tensor, cache: KVCache | None = None, window: int | None = None,
                memory: CrossMemory | None = None) -> Tensor:
        """tokens [B, N_c, S] ids in 0..embedding_rows-1 -> logits [B, N_c, S, n_outputs].

        Without a cache, positions are 0..S-1 and attention is causal (or, with `window`, sliding:
        each position sees itself and the window - 1 before it). With a cache, the S tokens continue
        the cached sequence at its next absolute positions and their keys/values are stored.
        memory: a conditioned LM's encoder output for the B rows (`encode_condition` /
        `cross_memory`); None there means the null conditions. An unconditioned LM takes none.
        """
        cfg = self.config
        if tokens.dim() != 3 or tokens.shape[1] != cfg.n_codebooks:
            raise ValueError(f"tokens must have shape [B, {cfg.n_codebooks}, S], got {tuple(tokens.shape)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be integer ids, got {tokens.dtype}")
        b, _, s = tokens.shape
        if s == 0:
            raise ValueError("tokens must hold at least one position")
        if not torch.compiler.is_compiling() and bool(((tokens < 0) | (tokens >= cfg.embedding_rows)).any()):
            raise ValueError(f"token ids must be in 0..{cfg.embedding_rows - 1} (codes 0..{cfg.codebook_size - 1}, "
                             + ("" if cfg.end_id is None else f"end {cfg.end_id}, ")
                             + f"pad {cfg.pad_id}, bos {cfg.bos_id})")
        memory = self._memory_for(b, memory)
        if cache is None:
            if window is not None and not 1 <= window <= cfg.max_seq_len:
                raise ValueError(f"window must be in 1..max_seq_len={cfg.max_seq_len}, got {window}")
            # RoPE with a sliding window only ever sees offsets < window, which training covered.
            sliding_rope = window is not None and self.rope is not None
            if s > cfg.max_seq_len and not sliding_rope:
                raise ValueError(f"{s} positions exceed the model's context max_seq_len={cfg.max_seq_len}"
                                 + ("" if self.rope is None else " (a RoPE model can go further with a window)"))
            positions = torch.arange(s, device=tokens.device)
            mask = None
            if window is not None:
                offset = positions[:, None] - positions[None, :]
                mask = (offset >= 0) & (offset < window)
        else:
            if window is not None:
                raise ValueError("window applies to a full forward; a ring cache has its own (max_len)")
            if cache.batch_size != b or cache.n_layers != cfg.n_layers:
                raise ValueError(f"cache is for batch {cache.batch_size} and {cache.n_layers} layers, "
                                 f"tokens have batch {b} and the model {cfg.n_layers} layers")
            if self.rope is None and cache.length + s > cfg.max_seq_len:
                raise ValueError(f"position {cache.length + s - 1} is past the {cfg.pos} encoding's "
                                 f"max_seq_len={cfg.max_seq_len}")
            if cache.sink and s > 1 and cache.length + s > cache.max_len:
                return self._forward_past_sink_window(tokens, cache, memory)
            positions, mask = cache.begin(s)

        return self.logits(self.trunk(tokens, positions, mask, cache, memory))

    def trunk(self, tokens: Tensor, positions: Tensor, mask: Tensor | None, cache: KVCache | None,
              memory: CrossMemory | None) -> Tensor:
        """The summed embeddings (plus the speaker's voice row and absolute positions where the model
        has them), dropout, the blocks and the final norm: tokens [B, N_c, S] -> states [B, S, d].
        positions [S]; mask: the attention mask the blocks take (None: causal)."""
        h = self.embed(tokens)
        if memory is not None and memory.voice is not None:
            h = h + memory.voice.to(h.dtype)[:, None, :]
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

    def _forward_past_sink_window(self, tokens: Tensor, cache: KVCache, memory: CrossMemory | None) -> Tensor:
        """A multi-position cached step that reaches past a sink cache's window: each query there sees
        the sink at its own distance, so the positions past the window go one at a time.
        tokens [B, N_c, S] -> logits [B, N_c, S, n_outputs]."""
        inside = max(cache.max_len - cache.length, 0)  # positions that still fit the linear phase
        parts = [self(tokens[..., :inside], cache=cache, memory=memory)] if inside else []
        parts += [self(tokens[..., i:i + 1], cache=cache, memory=memory) for i in range(inside, tokens.shape[-1])]
        return torch.cat(parts, dim=2)

    # ---- conditions ------------------------------------------------------------------------------
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

    def condition_inputs(self, text, speaker, batch_size: int) -> ConditionInputs:
        """Texts and speaker names (one per row, one for all, or None) -> ConditionInputs on the model's
        device; ValueError naming what is allowed (see lm.conditioning.condition_inputs)."""
        if self.config.condition is None:
            raise ValueError("this LM is not conditioned (no condition encoder): it takes no text or speaker")
        return condition_inputs(self.config.condition, text, speaker, batch_size).to(self.device)

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

    def new_cache(self, batch_size: int, max_len: int | None = None, ring: bool = False,
                  dtype: torch.dtype | None = None, sink: bool = False) -> KVCache:
        """A KV cache for up to max_len positions (default max_seq_len), allocated now on the model's device.

        ring=True keeps a sliding window of the last max_len positions and never fills up; it needs
        RoPE (see lm.kv_cache for why it is exact there and impossible with additive encodings).
        sink=True (with ring=True) keeps position 0 (bos) in view for ever as an attention sink, shown
        to each query at the distance max_len - 1 it has in a training window (see lm.kv_cache).
        """
        cfg = self.config
        max_len = cfg.max_seq_len if max_len is None else max_len
        if not isinstance(max_len, int) or not 1 <= max_len <= cfg.max_seq_len:
            raise ValueError(f"cache max_len must be in 1..max_seq_len={cfg.max_seq_len}, got {max_len!r}")
        if ring and self.rope is None:
            raise ValueError(f"a ring (sliding-window) KV cache needs RoPE; this model uses {cfg.pos} positions, "
                             "which are baked into the cached keys: recompute over the last window instead")
        return KVCache(cfg.n_layers, batch_size, cfg.kv_heads, cfg.head_dim, max_len, ring=ring, sink=sink,
                       rope=self.rope if sink else None, device=self.device,
                       dtype=dtype or self.token_embedding.weight.dtype)

    # ---- likelihood ------------------------------------------------------------------------------
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

    def token_nll(self, codes: Tensor, frame_mask: Tensor | None = None, condition: ConditionInputs | None = None,
                  ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Per-token NLL in pattern space: codes [B, N_c, T] -> nll [B, N_c, S] in nats (0 at targets
        the pattern or padding marks invalid), valid [B, N_c, S] bool. `loss` and `log_likelihood`
        reduce it; per-position analyses (benchmarks) read it directly.

        A conditioned LM reads `condition` (B rows; None: null conditions), and `ends` [B] bool marks
        rows whose last real frame is their file's last: the end-of-audio id is a target after it
        (lm.end_of_audio). An unconditioned LM takes neither.
        """
        return self._token_nll(codes, frame_mask, condition, ends, guide=False)[:2]

    def _token_nll(self, codes: Tensor, frame_mask: Tensor | None, condition: ConditionInputs | None,
                   ends: Tensor | None, guide: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """token_nll, plus with `guide` the guided-attention loss of the same forward (lm.alignment)."""
        self._check_codes(codes, frame_mask)
        cfg = self.config
        if cfg.condition is None and (condition is not None or ends is not None):
            raise ValueError("this LM is not conditioned: it takes no condition and no file ends")
        if ends is None:
            seq, valid = self.pattern.build(codes.long(), frame_mask, fill_id=cfg.pad_id)
        else:
            seq, valid = layout_with_end(self.pattern, codes.long(), frame_mask, ends.to(codes.device),
                                         cfg.end_id, cfg.pad_id)
            if seq.shape[-1] > cfg.max_seq_len:
                raise ValueError(f"{codes.shape[-1]} frames and an end-of-audio token take {seq.shape[-1]} positions, "
                                 f"more than max_seq_len={cfg.max_seq_len}")
        inputs = torch.cat([torch.full_like(seq[..., :1], cfg.bos_id), seq[..., :-1]], dim=-1)
        if self.training and cfg.condition is not None:  # context noise (lm.alignment): none at rate 0
            inputs = noisy_context(inputs, cfg.condition.context_noise, cfg.codebook_size)
        memory = None if cfg.condition is None else self.encode_condition(condition, codes.shape[0])
        guide = guide and cfg.condition is not None and cfg.condition.guided_heads > 0
        logits, recorded = forward_recording(self, inputs, memory, cfg.condition.guided_heads if guide else 0)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16/fp16 logits: CE in fp32
        nll = F.cross_entropy(rearrange(logits, "b c s v -> (b c s) v"), seq.masked_fill(~valid, -100).flatten(),
                              ignore_index=-100, reduction="none")
        guided = guided_attention_loss(recorded, memory, ends, valid, cfg.condition, condition) if guide else None
        return nll.view_as(seq), valid, guided

    def loss(self, codes: Tensor, frame_mask: Tensor | None = None, condition: ConditionInputs | None = None,
             ends: Tensor | None = None, guide: bool | None = None) -> LMLoss:
        """codes [B, N_c, T] in 0..|V|-1, frame_mask [B, T] bool (False = padding, at row ends)
        -> LMLoss: mean next-token NLL over the valid targets of all codebooks (nats/token).
        condition, ends: a conditioned LM's (see `token_nll`); guide: lm.alignment's loss too (None: if training)."""
        weighted = self.config.condition is not None and self.config.condition.guided
        nll, valid, guided = self._token_nll(codes, frame_mask, condition, ends, weighted and self.training
                                             if guide is None else guide)
        nll_sum, count = nll.sum(dim=(0, 2)), valid.sum(dim=(0, 2))
        return LMLoss(loss=nll_sum.sum() / count.sum().clamp(min=1), nll_sum=nll_sum, count=count, guide=guided)

    def log_likelihood(self, codes: Tensor, frame_mask: Tensor | None = None, condition: ConditionInputs | None = None,
                       ends: Tensor | None = None) -> Tensor:
        """[B] summed NLL in nats over the valid positions of each sequence (the pattern handled inside)."""
        nll, _ = self.token_nll(codes, frame_mask, condition, ends)
        return nll.sum(dim=(1, 2))

    # ---- generation ------------------------------------------------------------------------------
    def generate(self, prompt_codes: Tensor | None, max_new_frames: int, **kwargs) -> Tensor:
        """Continue prompt_codes [B, N_c, T0] by max_new_frames -> [B, N_c, T0 + n] (KV cache, sampling).

        Keyword arguments (temperature, top_k, top_p, greedy, generator, seed, text, speaker,
        cfg_scale, ...) are those of `lm.generate.generate`, where the decoding loop lives.
        """
        return generate(self, prompt_codes, max_new_frames, **kwargs)

    # ---- checkpoints -----------------------------------------------------------------------------
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
    def from_pretrained(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "MultiCodebookLM":
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
        return model.to(map_location)
