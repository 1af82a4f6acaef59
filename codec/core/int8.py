"""The codec's decoder in int8: its nn.Linear layers, whatever the decoder part (in the iSTFT decoder,
the ConvNeXt MLPs and the spectrum head, ~97% of its weights), stored as int8 rows with
per-output-channel scales and run as rvqlm_core Int8Linear layers; its convolutions stay float32. The encoder and quantizer are never
touched, so the tokens and `token_fingerprint()` stay those of the float codec.

`Codec.save_pretrained(path, decoder_dtype="int8")` writes `"weight_dtype": "int8"` beside the
config; `Codec.from_pretrained` loads such a folder into an inference-only codec (`train()` refuses).
What it gains: docs/codec.md.
"""

from __future__ import annotations

from torch import Tensor, nn

from rvqlm_core.int8_linear import Int8Linear, float_linear_state, swap_linears
from rvqlm_core.persistence import quantized_state


def decoder_linear_weights(codec: nn.Module) -> set[str]:
    """State names `decoder.<...>.weight` of the decoder's linear layers (float or int8)."""
    return {f"decoder.{name}.weight" for name, m in codec.decoder.named_modules() if isinstance(m, (nn.Linear, Int8Linear))}


def int8_decoder_state(codec: nn.Module, state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """`state` (float names) -> (what the folder stores: the decoder's linear weights as int8 pairs,
    the state dict the loaded int8 codec will have, for its fingerprint). ValueError for a decoder
    without linear layers."""
    linears = decoder_linear_weights(codec)
    if not linears:
        raise ValueError("decoder_dtype int8 needs a decoder with linear layers (e.g. the iSTFT decoder); "
                         "this codec's decoder has none")
    stored = quantized_state(float_linear_state(state), which=lambda name: name in linears)
    as_loaded = {}
    for name, value in stored.items():
        if name.endswith(".int8_scale"):
            as_loaded[name[:-len(".int8_scale")] + "_scale"] = value
        else:
            as_loaded[name] = value
    return stored, as_loaded


def to_int8_decoder(codec: nn.Module, pairs: dict[str, tuple[Tensor, Tensor]]) -> nn.Module:
    """Swap, in place, the decoder's nn.Linear layers for Int8Linear ones built from the stored `pairs`."""
    unknown = set(pairs) - decoder_linear_weights(codec)
    if unknown:
        raise ValueError(f"int8 tensors outside the decoder's linear layers: {sorted(unknown)[:3]}")
    swap_linears(codec, codec.decoder, "decoder", pairs)
    return codec.eval()

