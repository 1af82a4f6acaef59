"""MultiCodebookLM: the autoregressive ("ar") family, a decoder-only transformer over N_c parallel
token streams on the shared trunk (lm.trunk): causal attention, a KV cache, a codebook pattern.

Training (next-token prediction; docs/theory.md, seed 000): frames [B, N_c, T] are laid out by
the codebook pattern into seq [B, N_c, S]; the inputs are [bos, seq[..., :-1]] (the targets
shifted right by one) and the targets are seq. Padding and pattern-invalid positions are left
out of both the sum and the count of the loss.

A conditioned AR LM also predicts an end-of-audio id in each head (lm.end_of_audio). The model
knows nothing about audio: a codec fingerprint travels in the config only so that tokens from
another codec can be refused by the code that loads both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from lm.alignment import forward_recording, guided_attention_loss, noisy_context
from lm.conditioning import ConditionInputs
from lm.decode_step import decode_step
from lm.end_of_audio import layout_with_end
from lm.kv_cache import CrossMemory, KVCache
from lm.trunk import LM_FORMAT, LMLoss, LMTrunk

__all__ = ["LM_FORMAT", "LMLoss", "MultiCodebookLM"]


class MultiCodebookLM(LMTrunk):
    """A decoder-only transformer over N_c parallel code streams (LMConfig.family = "ar"): the trunk
    with causal attention and a codebook pattern (lm.patterns) between frames and model positions.

    forward: tokens [B, N_c, S] ids (pattern space, specials included) -> logits [B, N_c, S, n_outputs]
    (n_outputs = |V|, or |V| + 1 with the end-of-audio id of a conditioned LM).
    loss / token_nll / log_likelihood: codes [B, N_c, T] in 0..|V|-1 (frames; the pattern is
    applied inside). Generation: lm.generate.generate(model, ...).
    """

    family = "ar"

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

    def decode_step(self, tokens: Tensor, cache: KVCache, memory: CrossMemory | None = None) -> Tensor:
        """One cached generation step: tokens [B, N_c, 1] (ids the decoder placed itself, unchecked) ->
        logits [B, N_c, 1, n_outputs], the same as `self(tokens, cache=cache, memory=memory)` bit for bit
        at less cost per step (lm.decode_step)."""
        return decode_step(self, tokens, cache, memory)

    def _forward_past_sink_window(self, tokens: Tensor, cache: KVCache, memory: CrossMemory | None) -> Tensor:
        """A multi-position cached step that reaches past a sink cache's window: each query there sees
        the sink at its own distance, so the positions past the window go one at a time.
        tokens [B, N_c, S] -> logits [B, N_c, S, n_outputs]."""
        inside = max(cache.max_len - cache.length, 0)  # positions that still fit the linear phase
        parts = [self(tokens[..., :inside], cache=cache, memory=memory)] if inside else []
        parts += [self(tokens[..., i:i + 1], cache=cache, memory=memory) for i in range(inside, tokens.shape[-1])]
        return torch.cat(parts, dim=2)

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
                   ends: Tensor | None, guide: bool) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """token_nll, plus with `guide` the guided-attention loss of the same forward (lm.alignment), and an
        aligned-text LM's duration loss where the condition carries duration targets (lm.aligned_text)."""
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
        guided = guided_attention_loss(recorded, memory, ends, valid, cfg.condition) if guide else None
        return nll.view_as(seq), valid, guided, self.duration_loss(memory, condition)

    def loss(self, codes: Tensor, frame_mask: Tensor | None = None, condition: ConditionInputs | None = None,
             ends: Tensor | None = None, guide: bool | None = None) -> LMLoss:
        """codes [B, N_c, T] in 0..|V|-1, frame_mask [B, T] bool (False = padding, at row ends)
        -> LMLoss: mean next-token NLL over the valid targets of all codebooks (nats/token).
        condition, ends: a conditioned LM's (see `token_nll`); guide: lm.alignment's loss too (None: if training)."""
        weighted = self.config.condition is not None and self.config.condition.guided
        nll, valid, guided, duration = self._token_nll(codes, frame_mask, condition, ends, weighted and self.training
                                                       if guide is None else guide)
        nll_sum, count = nll.sum(dim=(0, 2)), valid.sum(dim=(0, 2))
        return LMLoss(loss=nll_sum.sum() / count.sum().clamp(min=1), nll_sum=nll_sum, count=count, guide=guided,
                      duration=duration)

    def log_likelihood(self, codes: Tensor, frame_mask: Tensor | None = None, condition: ConditionInputs | None = None,
                       ends: Tensor | None = None) -> Tensor:
        """[B] summed NLL in nats over the valid positions of each sequence (the pattern handled inside)."""
        nll, _ = self.token_nll(codes, frame_mask, condition, ends)
        return nll.sum(dim=(1, 2))
