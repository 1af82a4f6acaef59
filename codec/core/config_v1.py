"""Codec config format version 1: every setting in one flat dict, prefixed by the part it shapes.
Version-1 folders (the shipped codec's among them) load through `nested_from_flat`, and a codec
that version 1 could describe hashes its version-1 flat settings (`flat_settings`), so its
`fingerprint()` and `token_fingerprint()` are what they were. Version 1 knew two encoders' and two
decoders' kinds ("seanet"; "seanet" and "istft"); a part of any other kind has no flat form.
"""

from __future__ import annotations

from typing import Any

FLAT_DEFAULTS: dict[str, Any] = {
    "sample_rate": 16000, "channels": 1, "strides": [4, 4, 5, 4], "encoder_channels": 8, "decoder_channels": 32,
    "encoder_full_rate_residuals": False, "latent_dim": 64, "dilations": [1, 3, 9], "kernel_size": 7,
    "residual_kernel_size": 3, "last_kernel_size": 7, "compress": 2, "causal": True, "n_codebooks": 8,
    "codebook_size": 1024, "ema_decay": 0.99, "kmeans_init": True, "kmeans_iters": 10, "dead_code_threshold": 0.02,
    "quantizer_dropout": 0.5, "commitment_weight": 1.0, "encoder": "seanet", "encoder_dim": 256,
    "encoder_layers": 6, "encoder_hop": 80, "decoder": "seanet", "decoder_dim": 384, "decoder_layers": 8,
    "istft_hop": 80, "istft_n_fft": None, "istft_phase": "angle"}
TOP = ("sample_rate", "channels", "strides", "latent_dim", "causal")
QUANTIZER = {**{k: k for k in ("n_codebooks", "codebook_size", "ema_decay", "kmeans_init", "kmeans_iters",
                                "dead_code_threshold", "commitment_weight")}, "quantizer_dropout": "dropout"}
SEANET_COMMON = ("dilations", "kernel_size", "residual_kernel_size", "last_kernel_size", "compress")
SEANET_ENCODER = {"encoder_channels": "channels", "encoder_full_rate_residuals": "full_rate_residuals",
                  **{k: k for k in SEANET_COMMON}}
SEANET_DECODER = {"decoder_channels": "channels", **{k: k for k in SEANET_COMMON}}
ISTFT_DECODER = {"decoder_dim": "dim", "decoder_layers": "layers", "istft_hop": "hop", "istft_n_fft": "n_fft"}
REMOVED = {"encoder": ("stft", "the STFT encoder"), "istft_phase": ("angle_vector", "the angle_vector phase head")}


def nested_from_flat(flat: dict[str, Any], source: str) -> dict[str, Any]:
    """A version-1 flat config (missing keys: version 1's defaults) -> the nested dict of `CodecConfig.from_dict`."""
    if not isinstance(flat, dict):
        raise ValueError(f"{source}: expected a JSON object of codec settings, got {type(flat).__name__}")
    unknown = sorted(set(flat) - set(FLAT_DEFAULTS))
    if unknown:
        raise ValueError(f"{source}: unknown version-1 codec settings {unknown}; known: {sorted(FLAT_DEFAULTS)}")
    d = {**FLAT_DEFAULTS, **flat}
    for key, (value, what) in REMOVED.items():
        if d[key] == value:
            raise ValueError(f"{source}: {key} {value!r} ({what}) was removed; git commit 69f8875 has it")
    if d["encoder"] != "seanet" or d["decoder"] not in ("seanet", "istft"):
        raise ValueError(f"{source}: version 1 has no encoder {d['encoder']!r} / decoder {d['decoder']!r}")
    decoder_names = SEANET_DECODER if d["decoder"] == "seanet" else ISTFT_DECODER
    return {**{k: d[k] for k in TOP},
            "encoder": {"kind": "seanet", **{new: d[old] for old, new in SEANET_ENCODER.items()}},
            "quantizer": {new: d[old] for old, new in QUANTIZER.items()},
            "decoder": {"kind": d["decoder"], **{new: d[old] for old, new in decoder_names.items()}}}


def flat_token_settings(config) -> dict[str, Any] | None:
    """Version 1's token-shaping settings of `config` (its `shaping_settings` less the decoder's),
    or None where its encoder has no version-1 form."""
    nested = config.to_dict()
    encoder = nested["encoder"]
    if encoder["kind"] != "seanet":
        return None
    return {**{k: nested[k] for k in TOP}, **{old: encoder[new] for old, new in SEANET_ENCODER.items()},
            **{old: nested["quantizer"][new] for old, new in QUANTIZER.items()}}


def flat_settings(config) -> dict[str, Any] | None:
    """Version 1's `shaping_settings()` of `config` (its flat dict less the settings that did not shape
    it: the STFT encoder's, a SEANet decoder's iSTFT ones, istft_phase at "angle"), or None where
    version 1 could not describe it. An iSTFT codec's flat dict held decoder_channels at its default."""
    settings = flat_token_settings(config)
    decoder = config.to_dict()["decoder"]
    if settings is None or decoder["kind"] not in ("seanet", "istft"):
        return None
    if decoder["kind"] == "seanet":
        if any(decoder[k] != settings[k] for k in SEANET_COMMON):
            return None  # version 1 shared these between encoder and decoder
        return {**settings, "decoder_channels": decoder["channels"]}
    return {**settings, "decoder": "istft", "decoder_channels": FLAT_DEFAULTS["decoder_channels"],
            **{old: decoder[new] for old, new in ISTFT_DECODER.items()}}
