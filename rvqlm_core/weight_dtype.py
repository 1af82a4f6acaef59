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
