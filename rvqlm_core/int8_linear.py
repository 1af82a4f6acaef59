"""Int8Linear: an inference-only `nn.Linear` whose weight is int8 with one float32 scale per output
channel (rvqlm_core.weight_dtype.quantize_rows), the arithmetic done by a kept library kernel.

On a CPU with PyTorch's fbgemm ("x86" / "fbgemm" quantized engine), the weight is packed once and
each call runs `torch.ops.quantized.linear_dynamic`: the input is quantized to uint8 per call (one
scale for the whole input tensor), multiplied with int8 weights in int32, and rescaled to float32
(PyTorch's dynamic quantization). Elsewhere (GPU, no fbgemm) the weight is dequantized in the call
and multiplied in float32, the same result as weight-only quantization. docs/lm.md has the
measured speed and error of both.

Training an Int8Linear is refused (`train(True)` raises): there is no float weight to update.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rvqlm_core.weight_dtype import dequantize_rows, quantize_rows

TRAINING_REFUSED = ("holds int8 weights for inference only and cannot be trained; train (or fine-tune) "
                    "the float32 / float16 model it was exported from")


@functools.cache
def fbgemm_available() -> bool:
    """Whether this torch build runs fbgemm's dynamic int8 linear (x86 CPUs)."""
    return torch.backends.quantized.engine in ("x86", "fbgemm") and hasattr(torch.ops.quantized, "linear_dynamic")


@functools.cache
def cpu_info() -> dict[str, str]:
    """The first CPU's fields of /proc/cpuinfo ("model name", "flags", ...); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in lines:  # "key<tabs>: value"; later CPUs repeat the keys
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def _full_range_activations() -> bool:
    """fbgemm may use all 8 bits of the quantized input only where VNNI accumulates in int32;
    older AVX2 kernels saturate int16 sums, so they get 7 (PyTorch's reduce_range)."""
    flags = cpu_info().get("flags", "")
    return "avx512_vnni" in flags or "avx_vnni" in flags


class Int8Linear(nn.Module):
    """y = x (q * scale)^T + b with q [N, K] int8 and scale [N] float32 (buffers `weight`, `weight_scale`).

    x [..., K] float -> y [..., N] float32. Build with `from_float(linear)` or `from_pairs(q, scale, bias)`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self._packed = None
        self.training = False

    @classmethod
    def from_pairs(cls, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> "Int8Linear":
        module = cls(q.shape[1], q.shape[0], bias is not None)
        module.weight.copy_(q)
        module.weight_scale.copy_(scale)
        if bias is not None:
            module.bias.copy_(bias.detach())
        return module.to(q.device)

    @classmethod
    def from_float(cls, linear: nn.Linear) -> "Int8Linear":
        q, scale = quantize_rows(linear.weight)
        return cls.from_pairs(q, scale, linear.bias)

    def dequantized(self) -> Tensor:
        """The float32 weight [N, K] this layer computes with (q * scale)."""
        return dequantize_rows(self.weight, self.weight_scale)

    def train(self, mode: bool = True) -> "Int8Linear":
        if mode:
            raise RuntimeError(f"this model {TRAINING_REFUSED}")
        return super().train(False)

    def _apply(self, fn, recurse: bool = True):
        self._packed = None  # a move or cast invalidates the packed copy
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._packed = None
        super()._load_from_state_dict(*args, **kwargs)

    def pack(self) -> "Int8Linear":
        """Build fbgemm's packed weight now (a CPU layer with fbgemm; else nothing) instead of in the first
        call: loading pays for it, not the first generation step."""
        if self._packed is None and self.weight.device.type == "cpu" and fbgemm_available():
            self._packed = self._pack()
        return self

    def _pack(self):
        with warnings.catch_warnings():  # PyTorch deprecates qint8 tensors; fbgemm's packed form still needs one
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(
                self.weight, self.weight_scale.double(), torch.zeros(self.out_features, dtype=torch.long), 0)
            return torch.ops.quantized.linear_prepack(qweight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Int8Linear expects [..., {self.in_features}] inputs, got {tuple(x.shape)}")
        if self.weight.device.type == "cpu" and fbgemm_available():
            self.pack()
            flat = x.reshape(-1, self.in_features).float().contiguous()
            y = torch.ops.quantized.linear_dynamic(flat, self._packed, not _full_range_activations())
            return y.reshape(*x.shape[:-1], self.out_features)
        return F.linear(x.float(), self.dequantized(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def swap_linears(root: nn.Module, within: nn.Module, prefix: str,
                 pairs: dict[str, tuple[Tensor, Tensor]] | None = None) -> int:
    """Replace, in place, every nn.Linear inside `within` (a submodule of `root` named `prefix`) by an
    Int8Linear: from pairs[f"{name}.weight"] = (q, scale) where given (`name` as in root's state
    dict), else quantized here. Returns the number of layers swapped."""
    pairs, swapped = pairs or {}, 0
    for name, module in list(within.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                full = ".".join(part for part in (prefix, name, child_name) if part)
                pair = pairs.get(f"{full}.weight")
                layer = Int8Linear.from_pairs(*pair, child.bias) if pair else Int8Linear.from_float(child)
                setattr(module, child_name, layer)
                swapped += 1
    return swapped


def float_linear_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A state dict with each Int8Linear's int8 `weight` and `weight_scale` replaced by the float32
    `weight` it computes with, i.e. under the names of the float model it came from."""
    out = {}
    for name, value in state.items():
        if name.endswith(".weight_scale") and name[:-len("_scale")] in state:
            continue
        if value.dtype == torch.int8 and f"{name}_scale" in state:
            value = dequantize_rows(value, state[f"{name}_scale"])
        out[name] = value
    return out
