"""One codec interface (codec/core/interface.py, issue 49): rvqlm's own codec and the Hugging Face adapters
are `AudioCodec`s; a family missing a member fails when it is built; capabilities are properties, and
streaming is refused through `stream_refusal`. The adapters built from real (tiny) models: test_hf_codecs.py."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from codec import Codec, CodecConfig, load_codec
from codec.core.interface import AudioCodec
from codec.core.streaming import StreamingDecoder, StreamingEncoder
from codec.hf.adapter import FAMILIES, HFCodec

TINY = dict(strides=(2, 4, 5, 4), latent_dim=8, encoder=dict(kind="seanet", channels=4, dilations=(1,)),
            decoder=dict(kind="seanet", channels=4, dilations=(1,)),
            quantizer=dict(n_codebooks=2, codebook_size=8, kmeans_init=False))


class ToyCodec(AudioCodec):
    """Every member, nothing more: 1 channel at 8 kHz, hop 80, 2 codebooks of 4 codes (all zero)."""

    sample_rate, channels, hop_length, frame_rate, n_codebooks, codebook_size = 8000, 1, 80, 100, 2, 4
    causal, frame_span = True, (-79, 79)
    device = torch.device("cpu")
    stream_refusal = "this toy cannot stream; run without --stream"

    def encode(self, wav, n_q=None):
        return torch.zeros(wav.shape[0], n_q or 2, self.frames_for(wav.shape[-1]), dtype=torch.long)

    def decode(self, codes):
        return torch.zeros(codes.shape[0], 1, codes.shape[-1] * 80)

    def streaming_encoder(self, n_q=None):
        raise ValueError(self.stream_refusal)

    def streaming_decoder(self, exact=False):
        raise ValueError(self.stream_refusal)

    def config_dict(self):
        return {"toy": True}

    def fingerprint(self):
        return "f" * 64

    def token_fingerprint(self):
        return "t" * 64


def test_a_complete_family_is_built_and_gets_the_shared_members():
    toy = ToyCodec()
    assert toy.encode(torch.zeros(1, 1, 161)).shape == (1, 2, 3) and toy.frames_for(160) == 2
    assert toy.bitrate_kbps() == 0.4 and toy.bitrate_kbps(1) == 0.2  # 100 frames/s x 2 bits
    assert toy.accepts_tokens("t" * 64) and not toy.accepts_tokens("f" * 64) and not toy.accepts_tokens(None)
    assert not toy.can_stream and not toy.tokenizes_whole_files


@pytest.mark.parametrize("member", sorted(AudioCodec.__abstractmethods__))
def test_a_family_missing_a_member_fails_when_it_is_built(member):
    assert {"encode", "decode", "stream_refusal", "frame_span", "token_fingerprint"} <= AudioCodec.__abstractmethods__
    lacking = type("Lacking", (AudioCodec,), {k: v for k, v in vars(ToyCodec).items()
                                              if k in AudioCodec.__abstractmethods__ and k != member})
    with pytest.raises(TypeError, match=f"abstract.*{member}"):
        lacking()


def test_rvqlms_codec_and_every_hugging_face_adapter_are_audio_codecs():
    assert issubclass(Codec, AudioCodec) and issubclass(HFCodec, AudioCodec)
    for module in FAMILIES.values():
        adapter = importlib.import_module(module).ADAPTER
        assert issubclass(adapter, HFCodec) and not inspect.isabstract(adapter), module
    shipped = load_codec("models/codec-speech-16k")
    assert isinstance(shipped, AudioCodec) and shipped.can_stream and shipped.stream_refusal is None
    assert shipped.config_dict() == shipped.config.to_dict() and not shipped.tokenizes_whole_files


def test_streaming_is_refused_through_the_property():
    """A non-causal codec says why it cannot stream, and the streaming codec refuses with those words; a
    family's own refusal (here the toy's) comes through the same property."""
    torch.manual_seed(0)
    offline = Codec(CodecConfig.from_dict({**TINY, "causal": False})).eval()
    assert not offline.can_stream and "causal" in offline.stream_refusal
    for make in (StreamingEncoder, StreamingDecoder, offline.streaming_encoder, offline.streaming_decoder):
        with pytest.raises(ValueError) as refused:
            make(offline) if make in (StreamingEncoder, StreamingDecoder) else make()
        assert str(refused.value) == offline.stream_refusal
    live = Codec(CodecConfig.from_dict(TINY)).eval()
    assert live.can_stream and live.stream_refusal is None
    assert live.streaming_encoder().push(torch.zeros(1, 1, 160)).shape == (1, 2, 1)
    with pytest.raises(ValueError, match="^this toy cannot stream; run without --stream$"):
        StreamingEncoder(ToyCodec())
