"""KVCache: keys and values of past positions, preallocated once for a whole generation.

Seed 001: "since tokens are generated one at a time, the key and value vectors of all previous
tokens are stored in memory and reused, so only the new token's query, key and value must be
computed". Each layer gets a [B, H_kv, max_len, Dh] slab for keys and one for values, allocated
up front; a step writes its new keys/values into slots in place (never torch.cat-grown), so a
one-position step costs one position's projections plus one pass over the cached keys.

Absolute positions. The cache counts every position it has seen (`length` = the next absolute
position) and records which absolute position each slot holds (`slot_pos`, -1 = empty). The
attention mask is derived from these: a query at absolute position p may attend to the key at
absolute position a iff a is a filled slot and 0 <= p - a < window.

Two modes:

* linear (default): slot = absolute position. At most `max_len` positions in all; asking for more
  raises a clear error.
* ring (`ring=True`, RoPE models only): slot = absolute position mod max_len, so the cache keeps
  the last `max_len` positions (a sliding window) and generation can run for ever. This is exact
  for RoPE because keys are cached *already rotated at their absolute positions*, and the RoPE
  score q_p . k_a depends only on p - a: nothing cached has to be recomputed when the window
  slides, and positions past the trained context are seen only through relative offsets
  < max_len <= max_seq_len, which training covered. Decoding with the ring cache equals a full
  forward with a sliding-window causal mask of width max_len (a query sees its own position and
  the max_len - 1 before it). With additive (sinusoidal / learned) encodings, a token's position
  is baked into every cached key and value of every layer, so sliding the window would need a
  recompute: the model refuses the ring mode for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, max_len: int,
                 *, ring: bool = False, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32):
        for name, value in (("n_layers", n_layers), ("batch_size", batch_size), ("n_kv_heads", n_kv_heads),
                            ("head_dim", head_dim), ("max_len", max_len)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache {name} must be a positive integer, got {value!r}")
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.slot_pos = torch.full((max_len,), -1, dtype=torch.long, device=device)
        self.max_len = max_len
        self.ring = ring
        self.length = 0  # positions seen so far = absolute position of the next one
        self._pending: _PendingWrite | None = None

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    @property
    def n_layers(self) -> int:
        return self.keys.shape[0]

    @property
    def window(self) -> int | None:
        """How many positions (the query's own included) a query sees in ring mode; None in linear mode."""
        return self.max_len if self.ring else None

    def reset(self) -> None:
        """Forget everything (the memory stays allocated)."""
        self.slot_pos.fill_(-1)
        self.length = 0
        self._pending = None

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
            # Not wrapped (yet): slot = absolute position, keys are slots [0, p0 + n_new).
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
            # Wrapped, one position: overwrite the oldest slot (the one leaving the window), then attend.
            slot = positions % cap
            self._pending = _PendingWrite("ring", 0, slot, 0)
            self.slot_pos[slot] = positions
            key_pos = self.slot_pos
            mask = _window_mask(positions, key_pos, cap)
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
        return k_all.to(k_new.dtype), v_all.to(v_new.dtype)

    def __repr__(self) -> str:
        n_l, b, h, l, d = self.keys.shape
        return (f"KVCache(layers={n_l}, batch={b}, kv_heads={h}, max_len={l}, head_dim={d}, "
                f"ring={self.ring}, length={self.length})")


def _window_mask(q_pos: Tensor, key_pos: Tensor, window: int) -> Tensor:
    """[S, K] bool: key at absolute position a (-1 = empty slot) is visible from query p iff 0 <= p - a < window."""
    offset = q_pos[:, None] - key_pos[None, :]
    return (key_pos[None, :] >= 0) & (offset >= 0) & (offset < window)
