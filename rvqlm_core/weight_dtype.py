"""The precision a saved model's floating-point weights are stored in (its `model.safetensors`).

Models compute in float32; a shipped folder may store weights in half precision (half the bytes
in git), and loading casts them back to float32. One table for the codec and the LM. torch is
imported only by the functions, so the CLI can offer the names without importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Names accepted by save_pretrained and the export commands' --dtype options.
STORAGE_DTYPES = ("float32", "float16", "bfloat16")


def storage_dtype(name: "str | torch.dtype | None", option: str = "dtype") -> "torch.dtype":
    """The dtype a name (or dtype) asks for; None means float32 (stored exactly). `option` names
    the argument in the error message."""
    import torch

    if name is None:
        return torch.float32
    allowed = {n: getattr(torch, n) for n in STORAGE_DTYPES}
    if isinstance(name, torch.dtype) and name in allowed.values():
        return name
    if isinstance(name, str) and name in allowed:
        return allowed[name]
    raise ValueError(f"{option} must be one of {', '.join(STORAGE_DTYPES)}; got {name!r}")


def loads_as(stored: "torch.dtype", wanted: "torch.dtype") -> bool:
    """Whether a tensor stored as `stored` may load into a `wanted` one: the same dtype, or a
    half-precision float into float32."""
    import torch

    return stored == wanted or (wanted == torch.float32 and stored in (torch.float16, torch.bfloat16))


# Integer storage: a weight matrix kept as int8 with one float32 scale per row (per output channel).
# Not a cast: `rvqlm_core.persistence.quantized_state` writes the pairs, and the model that loads them
# computes with them (rvqlm_core.int8_linear) or dequantizes them; training refuses such a folder.
QUANTIZED_DTYPES = ("int8",)
INT8_SCALE_SUFFIX = ".int8_scale"  # the key of a weight's scale in a saved state: f"{name}{INT8_SCALE_SUFFIX}"


def quantize_rows(weight: "torch.Tensor") -> "tuple[torch.Tensor, torch.Tensor]":
    """Symmetric int8 per row: weight [..., K] -> (q [..., K] int8 in -127..127, scale [...] float32),
    scale = max |row| / 127 (1 for an all-zero row), q = round(w / scale). Each element's error
    |q * scale - w| is at most scale / 2 = max |row| / 254."""
    import torch

    w = weight.detach().float()
    amax = w.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_rows(q: "torch.Tensor", scale: "torch.Tensor") -> "torch.Tensor":
    """q [..., K] int8, scale [...] -> float32 [..., K] = q * scale."""
    import torch

    return q.to(torch.float32) * scale.to(torch.float32)[..., None]
