"""The codec's decoder in int8 (codec.core.int8): stored as int8 with per-channel scales, loaded into
Int8Linear layers, the tokens and token fingerprint untouched, audio close to the float decoder's,
streaming still working, the weights' fingerprint metadata that of the codec as loaded, training refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from codec import Codec, CodecConfig
from codec.core.streaming import StreamingDecoder
from rvqlm_core.int8_linear import Int8Linear


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def istft_codec() -> Codec:
    torch.manual_seed(0)
    cfg = CodecConfig.from_dict(dict(latent_dim=8, encoder=dict(channels=2, dilations=(1,)),
                                     quantizer=dict(n_codebooks=2, codebook_size=16),
                                     decoder=dict(kind="istft", dim=32, layers=2, hop=80, n_fft=None)))
    return Codec(cfg).eval()


def snr_db(ref: torch.Tensor, test: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.square().sum() / (test - ref).square().sum()))


def test_int8_decoder_folder_round_trip(tmp_path):
    codec = istft_codec()
    codec.save_pretrained(tmp_path / "f32")
    codec.save_pretrained(tmp_path / "int8", decoder_dtype="int8")
    assert json.loads((tmp_path / "int8" / "config.json").read_text())["weight_dtype"] == "int8"
    loaded = Codec.from_pretrained(tmp_path / "int8")
    layers = [m for m in loaded.decoder.modules() if isinstance(m, Int8Linear)]
    assert len(layers) == 2 * 2 + 1  # up and down in each ConvNeXt block, and the spectrum head
    with safe_open(str(tmp_path / "int8" / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("decoder.head.weight").dtype == torch.int8
        assert f.get_tensor("decoder.embed.weight").dtype == torch.float32  # convolutions stay float
        assert f.metadata()["fingerprint"] == loaded.fingerprint()
    assert loaded.token_fingerprint() == codec.token_fingerprint()

    wav = torch.randn(1, 1, 16000, generator=torch.Generator().manual_seed(1)) * 0.1
    with torch.no_grad():
        codes = codec.encode(wav)
        assert torch.equal(loaded.encode(wav), codes)
        ref, got = codec.decode(codes), loaded.decode(codes)
    assert snr_db(ref, got) > 20, snr_db(ref, got)
    stream = StreamingDecoder(loaded)
    streamed = torch.cat([stream.push(codes[..., i:i + 1]) for i in range(codes.shape[-1])] + [stream.flush()], dim=-1)
    assert snr_db(got, streamed[..., : got.shape[-1]]) > 20

    loaded.save_pretrained(tmp_path / "again", decoder_dtype="int8")  # an int8 codec saves the same values
    with safe_open(str(tmp_path / "int8" / "model.safetensors"), framework="pt") as a, \
            safe_open(str(tmp_path / "again" / "model.safetensors"), framework="pt") as b:
        assert set(a.keys()) == set(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    with pytest.raises(RuntimeError, match="int8 weights for inference only"):
        loaded.train()


def test_a_decoder_without_linear_layers_is_refused(tmp_path):
    torch.manual_seed(0)
    part = dict(kind="seanet", channels=2, dilations=(1,))
    seanet = Codec(CodecConfig.from_dict(dict(latent_dim=8, encoder=part, decoder=part,
                                              quantizer=dict(n_codebooks=2, codebook_size=16))))
    with pytest.raises(ValueError, match="needs a decoder with linear layers"):
        seanet.save_pretrained(tmp_path / "x", decoder_dtype="int8")
