"""Rotary position embedding (RoPE; docs/theory.md, seed 002): queries and keys are rotated inside
attention by angles proportional to their positions, so q . k sees only the relative offset.

Shapes: S positions, Dh head dimension, B batch, H heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each feature pair of queries and keys by an angle proportional to the position.

    Pair m of a head vector is (x[m], x[m + Dh/2]) (the "rotate-half" layout), rotated by the angle
    p * theta_m with theta_m = base^(-2m/Dh). Rotations preserve norms, and R(p)^T R(a) = R(a - p),
    so (R(p) q) . (R(a) k) depends on the positions only through a - p.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._tables: dict[tuple, tuple[Tensor, Tensor]] = {}  # (device, dtype) -> cos, sin [N, Dh] for 0..N-1

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [S] long -> cos, sin [S, Dh] (angles in float64, so large positions stay exact)."""
        angle = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]  # [S, Dh/2]
        angle = torch.cat([angle, angle], dim=-1)
        return angle.cos().to(dtype), angle.sin().to(dtype)

    def cos_sin_at(self, position: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """`cos_sin` of the one position `position` -> cos, sin [1, Dh], read from a table of positions
        0..N-1 that `cos_sin` computed (the same values bit for bit; tests/test_decode_step.py), grown by
        doubling when a position is past it. For a decoding step, which would otherwise recompute the angles."""
        key = (self.inv_freq.device, dtype)
        table = self._tables.get(key)
        if table is None or position >= table[0].shape[0]:
            n = max(1024, 2 * position + 2, 0 if table is None else 2 * table[0].shape[0])
            with torch.inference_mode(False):  # ordinary tensors, usable inside and outside inference mode
                table = self.cos_sin(torch.arange(n, device=self.inv_freq.device), dtype)
            self._tables[key] = table
        return table[0][position:position + 1], table[1][position:position + 1]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, S, Dh], cos/sin [S, Dh] -> x rotated pairwise, same shape."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated_half * sin
