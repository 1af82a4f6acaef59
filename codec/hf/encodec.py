"""EnCodec (`facebook/encodec_24khz`, `facebook/encodec_32khz`) through transformers' `EncodecModel`.

The model picks its number of codebooks by bandwidth (`config.target_bandwidths`); N_c is that of the
largest. encode(wav, n_q=k) asks the model for the smallest target bandwidth that gives at least k
codebooks and keeps the first k (a residual quantizer's first k codes do not depend on later ones).
decode takes any first k codebooks (the model sums their vectors). The model pads the last frame
itself (`pad_mode`), so the audio goes in as it is: T = ceil(S / hop).

Folders with `chunk_length_s` (encodec_48khz) or `normalize: true` encode per-chunk scales that a
token stream does not carry, and are refused.
"""

from __future__ import annotations

import torch

from codec.hf.adapter import HFCodec


class EncodecCodec(HFCodec):
    family = "encodec"
    model_class = "EncodecModel"
    TOKEN_KEYS = ("sampling_rate", "audio_channels", "normalize", "chunk_length_s", "overlap", "hidden_size",
                  "num_filters", "num_residual_layers", "upsampling_ratios", "norm_type", "kernel_size",
                  "last_kernel_size", "residual_kernel_size", "dilation_growth_rate", "use_causal_conv", "pad_mode",
                  "compress", "num_lstm_layers", "codebook_size", "codebook_dim", "use_conv_shortcut",
                  "target_bandwidths")

    def check_config(self, config) -> None:
        if config.chunk_length_s is not None or config.normalize:
            raise ValueError(f"{self.source}: an EnCodec model with chunk_length_s or normalize (such as "
                             "encodec_48khz) encodes a loudness scale per chunk that tokens cannot carry; rvqlm "
                             "takes EnCodec folders without them (encodec_24khz, encodec_32khz)")

    @property
    def n_codebooks(self) -> int:
        return int(self.model.quantizer.get_num_quantizers_for_bandwidth(max(self.model.config.target_bandwidths)))

    def _bandwidth(self, n_q: int) -> float:
        """The smallest target bandwidth at which the model makes at least n_q codebooks."""
        rvq = self.model.quantizer
        return min(b for b in self.model.config.target_bandwidths if rvq.get_num_quantizers_for_bandwidth(b) >= n_q)

    def _encode(self, wav: torch.Tensor, n_q: int) -> torch.Tensor:
        out = self.model.encode(wav, bandwidth=self._bandwidth(n_q))
        return out.audio_codes[0, :, :n_q]  # [chunks = 1, B, n, T] -> [B, n_q, T]

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.model.decode(codes[None], [None]).audio_values


ADAPTER = EncodecCodec
