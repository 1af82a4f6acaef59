"""KVCache: the keys and values of past positions, preallocated once for a whole generation
(docs/theory.md, seed 001: only the new token's query, key and value are computed at each step).

Each layer has a [B, H_kv, max_len, Dh] slab for keys and one for values; a step writes its new
keys/values into slots in place (never torch.cat-grown). The cache counts every position it has
seen (`length` = the next absolute position) and records which absolute position each slot holds
(`slot_pos`, -1 = empty). A query at absolute position p may attend to the key at absolute
position a iff a is a filled slot and 0 <= p - a < window.

Modes (W = max_len):

* linear (default): slot = absolute position; at most W positions in all, more is a clear error.
* ring (`ring=True`, RoPE models only): slot = position mod W, so the cache keeps the last W
  positions and never fills up. Keys are cached already rotated at their absolute positions, so
  decoding equals a full forward with a sliding-window causal mask of width W (a query sees its
  own position and the W - 1 before it). Additive encodings bake positions into every cached key:
  the model refuses a ring for them.
* ring with a sink (`ring=True, sink=True`, RoPE): slot 0 keeps position 0 (bos) for ever, slots
  1..W-1 are a ring over the positions >= 1 (slot = 1 + (a - 1) mod (W - 1)). A query at p sees
  p-W+2..p and the sink as if it sat at p-W+1, the distance W-1 bos has from the last query of a
  training window: the sink key is kept un-rotated and rotated to p-W+1 into slot 0 at each step
  past the window (one key per layer per step). A multi-position step past the window needs one
  sink rotation per query, so the model feeds it one position at a time.

Why the ring is exact for RoPE and what the sink is for: docs/experiments.md, "language model".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lm.rope import RotaryEmbedding, apply_rotary


@dataclass
class _PendingWrite:
    mode: str  # "linear" (slot = position), "ring" (write one wrapped slot first), "concat" (see begin)
    start: int  # linear: first slot written
    slots: Tensor | None  # ring/concat: slot index of each kept new position
    keep_from: int  # concat: index of the first new position that is kept (the last max_len ones)


class KVCache:
    """Per-layer key/value slabs [B, H_kv, max_len, Dh] plus the absolute position of every slot.

    Usage inside a forward pass over S new positions: `positions, mask = cache.begin(S)` once,
    then `k, v = cache.update(layer, k_new, v_new)` once per layer; `mask` ([S, K] bool, True =
    may attend, or None when every returned key is visible) goes with the returned keys.
    `sink=True` (with `ring=True`) needs the model's `rope`, to re-rotate the sink key each step.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, max_len: int,
                 *, ring: bool = False, sink: bool = False, rope: RotaryEmbedding | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32):
        for name, value in (("n_layers", n_layers), ("batch_size", batch_size), ("n_kv_heads", n_kv_heads),
                            ("head_dim", head_dim), ("max_len", max_len)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache {name} must be a positive integer, got {value!r}")
        if sink:
            if not ring:
                raise ValueError("sink=True keeps position 0 in a sliding window: it needs ring=True "
                                 "(a linear cache never drops anything)")
            if rope is None:
                raise ValueError("a sink cache re-rotates the sink key at every step: pass the model's RotaryEmbedding")
            if max_len < 2:
                raise ValueError(f"a sink cache needs max_len >= 2 (the sink plus one ring slot), got {max_len}")
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.slot_pos = torch.full((max_len,), -1, dtype=torch.long, device=device)
        self.max_len = max_len
        self.ring = ring
        self.sink = sink
        self.rope = rope
        self.length = 0  # positions seen so far = absolute position of the next one
        self._pending: _PendingWrite | None = None
        self._sink_keys: Tensor | None = None  # [L, B, H_kv, 1, Dh] position 0's keys, un-rotated

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    @property
    def n_layers(self) -> int:
        return self.keys.shape[0]

    @property
    def window(self) -> int | None:
        """How many positions (the query's own and, with a sink, the sink included) a query sees in
        the ring modes; None in linear mode."""
        return self.max_len if self.ring else None

    def reset(self) -> None:
        """Forget everything (the memory stays allocated)."""
        self.slot_pos.fill_(-1)
        self.length = 0
        self._pending = None
        self._sink_keys = None

    def _ring_slot(self, position: int) -> int:
        """The slot of absolute position `position` once the ring has wrapped."""
        if self.sink:
            return 1 + (position - 1) % (self.max_len - 1)  # slot 0 is the sink's
        return position % self.max_len

    def begin(self, n_new: int) -> tuple[Tensor, Tensor | None]:
        """Reserve the next n_new absolute positions -> (positions [n_new] long, mask [n_new, K] | None).

        Must be followed by one `update` per layer. K is the number of keys `update` returns.
        """
        if n_new < 1:
            raise ValueError(f"a cached step needs at least one new position, got {n_new}")
        p0, cap = self.length, self.max_len
        device = self.slot_pos.device
        positions = torch.arange(p0, p0 + n_new, device=device)
        if p0 + n_new <= cap:
            # Not wrapped (yet): slot = absolute position, keys are slots [0, p0 + n_new). With a sink,
            # every query p <= cap - 1 sees position 0 at its true distance p <= cap - 1: nothing special.
            self._pending = _PendingWrite("linear", p0, None, 0)
            self.slot_pos[p0:p0 + n_new] = positions
            key_pos = self.slot_pos[:p0 + n_new]
            mask = None if n_new == 1 else key_pos[None, :] <= positions[:, None]
        elif not self.ring:
            raise RuntimeError(
                f"the KV cache is full: it holds {cap} positions and {p0} are used, {n_new} more were asked. "
                "Allocate a longer cache (up to the model's max_seq_len), use ring=True (RoPE models), "
                "or recompute over the last window."
            )
        elif n_new == 1:
            # Wrapped, one position: overwrite the slot leaving the window. Every slot then holds one of
            # the positions p-cap+1..p (or, with a sink, the sink and p-cap+2..p): all visible.
            slot = self._ring_slot(p0)
            self._pending = _PendingWrite("ring", 0, torch.tensor([slot], device=device), 0)
            self.slot_pos[slot] = p0
            if self.sink:
                self._place_sink(p0 - cap + 1)
            mask = None
        elif self.sink:
            raise ValueError(f"a sink cache takes one position per step past its window ({n_new} were given at "
                             f"position {p0}): each query sees the sink at its own distance "
                             "(MultiCodebookLM.forward splits such steps itself)")
        else:
            # Wrapped, several positions: earlier new queries still need keys that later new positions
            # would overwrite, so attend over [cached slots, new keys] and write the last cap ones after.
            keep_from = max(n_new - cap, 0)
            slots = positions[keep_from:] % cap
            self._pending = _PendingWrite("concat", 0, slots, keep_from)
            key_pos = torch.cat([self.slot_pos, positions])
            mask = _window_mask(positions, key_pos, cap)
            self.slot_pos[slots] = positions[keep_from:]
        self.length = p0 + n_new
        return positions, mask

    def _place_sink(self, position: int) -> None:
        """Write position 0's keys, rotated to `position`, into slot 0 of every layer (one key per layer)."""
        if self._sink_keys is None:  # first step past the window: slot 0 still holds them un-rotated
            self._sink_keys = self.keys[:, :, :, :1].clone()
        cos, sin = self.rope.cos_sin(torch.tensor([position], device=self.keys.device), torch.float32)
        self.keys[:, :, :, :1] = apply_rotary(self._sink_keys.float(), cos, sin).to(self.keys.dtype)

    def update(self, layer: int, k_new: Tensor, v_new: Tensor) -> tuple[Tensor, Tensor]:
        """Store k_new, v_new [B, H_kv, S, Dh] of `layer` -> keys, values [B, H_kv, K, Dh] to attend over."""
        p = self._pending
        if p is None:
            raise RuntimeError("KVCache.update called without KVCache.begin")
        keys, values = self.keys[layer], self.values[layer]
        if k_new.shape[:2] != keys.shape[:2] or k_new.shape[-1] != keys.shape[-1]:
            raise ValueError(f"new keys of shape {tuple(k_new.shape)} do not fit a cache of "
                             f"[B={keys.shape[0]}, H_kv={keys.shape[1]}, L, Dh={keys.shape[-1]}]")
        s = k_new.shape[2]
        if p.mode == "linear":
            keys[:, :, p.start:p.start + s] = k_new
            values[:, :, p.start:p.start + s] = v_new
            k_all, v_all = keys[:, :, :p.start + s], values[:, :, :p.start + s]
        elif p.mode == "ring":
            keys.index_copy_(2, p.slots, k_new.to(keys.dtype))
            values.index_copy_(2, p.slots, v_new.to(values.dtype))
            k_all, v_all = keys, values
        else:  # concat
            k_all = torch.cat([keys, k_new.to(keys.dtype)], dim=2)
            v_all = torch.cat([values, v_new.to(values.dtype)], dim=2)
            keys.index_copy_(2, p.slots, k_new[:, :, p.keep_from:].to(keys.dtype))
            values.index_copy_(2, p.slots, v_new[:, :, p.keep_from:].to(values.dtype))
        if layer == self.n_layers - 1:
            self._pending = None
        if k_all.dtype == k_new.dtype:
            return k_all, v_all
        return k_all.to(k_new.dtype), v_all.to(v_new.dtype)

    def __repr__(self) -> str:
        n_l, b, h, l, d = self.keys.shape
        return (f"KVCache(layers={n_l}, batch={b}, kv_heads={h}, max_len={l}, head_dim={d}, "
                f"ring={self.ring}, sink={self.sink}, length={self.length})")


def _window_mask(q_pos: Tensor, key_pos: Tensor, window: int) -> Tensor:
    """[S, K] bool: key at absolute position a (-1 = empty slot) is visible from query p iff 0 <= p - a < window."""
    offset = q_pos[:, None] - key_pos[None, :]
    return (key_pos[None, :] >= 0) & (offset >= 0) & (offset < window)


@dataclass
class CrossMemory:
    """What a conditioned decoder's cross-attention reads: the condition encoder's output and, once
    computed, every decoder layer's keys and values of it (the cross-attention cache).

    states [B, M, d]: encoder output rows (M source positions). mask [B, M] bool: True = a real
    source position (False: padding past a shorter text). kv: per decoder layer (k, v), each
    [B, H_kv, M, Dh], filled once per sequence by `MultiCodebookLM.cross_memory` for generation;
    None: each forward projects `states` itself (training). voice [B, d]: the speaker's row of the
    encoder's voice table, which the decoder adds to every input position (None: nothing added).
    text_len [B] long: the bytes of text each row reads after condition dropout (0: null text).
    frames [B, F, d]: an aligned-text LM's text stream (lm.aligned_text), added to the decoder input at
    positions 0..F-1 (None: nothing added); frame_len [B]: how many of them hold a unit in each row.
    """

    states: Tensor
    mask: Tensor
    kv: list[tuple[Tensor, Tensor]] | None = None
    voice: Tensor | None = None
    text_len: Tensor | None = None
    frames: Tensor | None = None
    frame_len: Tensor | None = None  # [B] long: the frames each row's aligned text fills (0: none)

    @property
    def batch_size(self) -> int:
        return self.states.shape[0]
