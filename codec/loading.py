"""`load_codec(path)`: the one way the CLI, the demo and the benchmarks open a `--codec DIR`.

    codec = load_codec("models/codec-speech-16k")   # rvqlm's own codec folder -> codec.core.model.Codec
    codec = load_codec("hf/mimi")                    # a Hugging Face EnCodec / DAC / Mimi folder -> a codec.hf adapter

Both are an `AudioCodec` (codec.core.interface: sample_rate, channels, frame_rate, hop_length,
n_codebooks, codebook_size, fingerprints, capabilities such as `can_stream`, encode [B, C, S] ->
[B, N_c, T], decode [B, k, T] -> [B, C, T * hop]). A folder is a Hugging Face one when its config.json has a `model_type`
(what save_pretrained writes); any other `model_type` than encodec, dac or mimi is refused naming them.
"""

from __future__ import annotations

import os

import torch

from codec.core.interface import AudioCodec


def load_codec(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> AudioCodec:
    """The codec in folder `path`, in eval mode on `map_location` (see the module docstring)."""
    from codec.hf.adapter import hf_model_type, load_hf_codec

    if hf_model_type(path) is not None:
        return load_hf_codec(path, map_location)
    from codec.core.model import Codec

    return Codec.from_pretrained(path, map_location=map_location).eval()
