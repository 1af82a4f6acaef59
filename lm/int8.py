"""Int8 inference for a MultiCodebookLM: every linear layer and the output heads compute with int8
weights and per-output-channel scales (rvqlm_core.int8_linear), a quarter of float32's bytes.

Saved form (`save_pretrained(path, dtype="int8")`): config.json carries "weight_dtype": "int8", and
every floating-point tensor of two or more dimensions is stored as int8 rows plus one float32 scale
per row (rvqlm_core.persistence.quantized_state): the linear weights, the heads [N_c, n_outputs, d]
(one scale per codebook and output), and the embedding tables (one scale per row; they are
dequantized to float32 at load, as a lookup reads 8 rows a step). Norm gains stay float32.

Loading (`from_pretrained`) dequantizes into a float model (so every name, shape and dtype is
checked as for any folder), then `to_int8` swaps the linear layers and heads for Int8Linear
layers built from the stored int8 values themselves. The model is inference-only: `train()` and
`init_from` refuse it with one line.
"""

from __future__ import annotations

from torch import Tensor, nn

from rvqlm_core.int8_linear import TRAINING_REFUSED, Int8Linear, float_linear_state, swap_linears
from rvqlm_core.persistence import cpu_state
from rvqlm_core.weight_dtype import dequantize_rows, quantize_rows

HEAD = "int8_head"  # the attribute holding an int8 LM's heads: one Int8Linear of [N_c * n_outputs, d]


def is_int8(model: nn.Module) -> bool:
    """Whether `model` computes with int8 weights (has any Int8Linear)."""
    return any(isinstance(m, Int8Linear) for m in model.modules())


def refuse_training(model: nn.Module, source: str) -> None:
    """ValueError (one line naming `source`) when `model` is an int8 LM."""
    if is_int8(model):
        raise ValueError(f"{source} {TRAINING_REFUSED}")


def to_int8(model: nn.Module, pairs: dict[str, tuple[Tensor, Tensor]] | None = None) -> nn.Module:
    """Swap, in place, every nn.Linear of `model` for an Int8Linear and its heads for `HEAD`; returns
    the model in eval mode. pairs: {state name: (q, scale)} as stored (rvqlm_core.persistence.
    dequantized_state); a weight without a pair is quantized here (quantize_rows)."""
    pairs = pairs or {}
    model.eval()
    swap_linears(model, model, "", pairs)
    heads = model.head_weights()  # [N_c, n_outputs, d]
    q, scale = pairs.get("head_weight") or quantize_rows(heads)
    setattr(model, HEAD, Int8Linear.from_pairs(q.flatten(0, 1), scale.flatten(), None))
    if model.head_weight is not None:
        del model.head_weight  # the int8 copy replaces it
        model.head_weight = None
    return model.eval()


def head_logits(head: Int8Linear, h: Tensor, n_codebooks: int) -> Tensor:
    """h [B, S, d] -> logits [B, N_c, S, n_outputs] through the int8 heads."""
    b, s, _ = h.shape
    return head(h).view(b, s, n_codebooks, -1).permute(0, 2, 1, 3)


def int8_head_weights(head: Int8Linear, n_codebooks: int) -> Tensor:
    """The int8 heads dequantized: [N_c, n_outputs, d]."""
    return dequantize_rows(head.weight, head.weight_scale).view(n_codebooks, -1, head.in_features)


def float_state(model: nn.Module) -> dict[str, Tensor]:
    """A CPU state dict under the float model's names: the model's own, or for an int8 LM its int8
    weights dequantized (each Int8Linear back to `weight` / `bias`, the heads to `head_weight` unless tied)."""
    state = cpu_state(model)
    if not is_int8(model):
        return state
    out = {k: v for k, v in float_linear_state(state).items() if not k.startswith(f"{HEAD}.")}
    if not model.config.tie_weights:
        out["head_weight"] = int8_head_weights(getattr(model, HEAD), model.config.n_codebooks).cpu()
    return out
