"""rvqlm's neural audio codec: encoder, residual vector quantizer, decoder.

    from codec import Codec, CodecConfig
    codec = Codec.from_pretrained("runs/codec/pretrained")
    codec = load_codec(DIR)        # that, or a Hugging Face EnCodec / DAC / Mimi folder (codec.hf)
    codes = codec.encode(wav)      # [B, C, S] -> LongTensor [B, N_c, T]
    wav = codec.decode(codes)      # [B, k, T] -> [B, C, T * hop]

Rooms: core (the codec interface, rvqlm's own codec, its parts registry, quantizer, streaming, formats,
audio I/O), neural (SEANet / iSTFT parts and GAN training), source_filter (the source-filter codec), hf
(Hugging Face adapters), tokenize (folders of audio -> token shards); loading.py opens any of them.
Names are imported lazily so `import codec.core.audio` stays light.
"""

from __future__ import annotations

__all__ = ["Codec", "CodecConfig", "load_codec", "read_rvq", "write_rvq"]


def __getattr__(name: str):
    if name == "Codec":
        from codec.core.model import Codec

        return Codec
    if name == "CodecConfig":
        from codec.core.config import CodecConfig

        return CodecConfig
    if name == "load_codec":
        from codec.loading import load_codec

        return load_codec
    if name in ("read_rvq", "write_rvq"):
        from codec.core import rvq_file

        return getattr(rvq_file, name)
    raise AttributeError(f"module 'codec' has no attribute {name!r}")
