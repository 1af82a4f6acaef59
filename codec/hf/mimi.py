"""Mimi (`kyutai/mimi`, Moshi's codec: 24 kHz, 12.5 frames/s, up to 32 codebooks of 2048) through
transformers' `MimiModel`.

encode(wav, n_q=k) is the model's encode with `num_quantizers=k` (its first codebook is the semantic
one, the others acoustic); the model pads the last frame itself, so the audio goes in as it is:
T = ceil(S / hop), hop = 1920 samples for kyutai/mimi. decode takes any first k codebooks. Encoding
runs the encoder's transformer over the whole file (a sliding window of `sliding_window` positions).
"""

from __future__ import annotations

import torch

from codec.hf.adapter import HFCodec


class MimiCodec(HFCodec):
    family = "mimi"
    model_class = "MimiModel"
    TOKEN_KEYS = ("sampling_rate", "audio_channels", "hidden_size", "num_filters", "num_residual_layers",
                  "upsampling_ratios", "kernel_size", "last_kernel_size", "residual_kernel_size",
                  "dilation_growth_rate", "use_causal_conv", "pad_mode", "compress", "codebook_size", "codebook_dim",
                  "num_quantizers", "use_conv_shortcut", "vector_quantization_hidden_dimension",
                  "num_semantic_quantizers", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "norm_eps",
                  "sliding_window", "rope_parameters", "layer_scale_initial_scale", "attention_bias", "frame_rate")
    DECODER_PREFIXES = ("decoder.", "decoder_transformer.", "upsample.")

    @property
    def n_codebooks(self) -> int:
        return int(self.model.config.num_quantizers)

    @property
    def hop_length(self) -> int:
        """Samples per frame: the encoder's strides times the downsampling layer's (1920 for kyutai/mimi)."""
        return int(self.model.config.frame_size)

    def _encode(self, wav: torch.Tensor, n_q: int) -> torch.Tensor:
        return self.model.encode(wav, num_quantizers=n_q).audio_codes

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.model.decode(codes).audio_values


ADAPTER = MimiCodec
