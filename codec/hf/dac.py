"""DAC, the Descript Audio Codec (`descript/dac_16khz`, `dac_24khz`, `dac_44khz`), through transformers' `DacModel`.

encode(wav, n_q=k) zero-pads the audio on the right to a whole number of hops, as DAC's own
preprocessing and transformers' `DacFeatureExtractor` do (the model itself drops a partial last
frame), then asks the model for k codebooks (`n_quantizers`): T = ceil(S / hop). decode takes any
first k codebooks (`audio_codes`); the model's decoder returns a few samples fewer than T * hop
(its convolutions' edges), which are zero-padded to T * hop.
"""

from __future__ import annotations

import torch
from torch import nn

from codec.hf.adapter import HFCodec


class DacCodec(HFCodec):
    family = "dac"
    model_class = "DacModel"
    TOKEN_KEYS = ("sampling_rate", "encoder_hidden_size", "downsampling_ratios", "n_codebooks", "codebook_size",
                  "codebook_dim")

    @property
    def n_codebooks(self) -> int:
        return int(self.model.config.n_codebooks)

    def _encode(self, wav: torch.Tensor, n_q: int) -> torch.Tensor:
        wav = nn.functional.pad(wav, (0, -wav.shape[-1] % self.hop_length))
        return self.model.encode(wav, n_quantizers=n_q).audio_codes

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.model.decode(audio_codes=codes).audio_values.unsqueeze(1)  # [B, S'] -> [B, 1, S']


ADAPTER = DacCodec
