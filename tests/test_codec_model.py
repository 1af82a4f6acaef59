"""The Codec model: shapes, frame alignment, causality, receptive field, save/load, bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from codec import Codec, CodecConfig
from rvqlm_core.persistence import CONFIG_FILE, WEIGHTS_FILE


SEANET = dict(kind="seanet", channels=4, dilations=(1, 3))
TINY = CodecConfig.from_dict(dict(strides=(2, 4, 5, 4), latent_dim=16, encoder=SEANET, decoder=SEANET,
                                  quantizer=dict(n_codebooks=4, codebook_size=32, kmeans_iters=2)))


@pytest.fixture(scope="module")
def codec() -> Codec:
    torch.manual_seed(0)
    model = Codec(TINY)
    model.train()
    model(torch.randn(2, 1, 1600) * 0.1)  # one training pass: k-means initialises the codebooks
    return model.eval()


def test_default_config_is_16k_mono_50hz_4kbps():
    c = CodecConfig()
    assert (c.sample_rate, c.channels, c.hop_length, c.frame_rate) == (16000, 1, 320, 50)
    assert (c.n_codebooks, c.codebook_size, c.bitrate_kbps) == (8, 1024, 4.0)
    assert CodecConfig.from_dict(c.to_dict()) == c and json.loads(json.dumps(c.to_dict())) == c.to_dict()


def test_shapes_and_frame_rate(codec):
    assert codec.hop_length == 160 and codec.frame_rate == 100
    wav = torch.randn(3, 1, 1000) * 0.1  # not a multiple of hop: padded to 7 frames
    codes = codec.encode(wav)
    assert codes.shape == (3, 4, 7) and codes.dtype == torch.long
    assert 0 <= int(codes.min()) and int(codes.max()) < 32
    assert codec.decode(codes).shape == (3, 1, 7 * 160)
    assert codec.quantizer.codebooks.shape == (4, 32, 16)


def test_decode_with_every_k_and_fewer_codebooks_change_less(codec):
    wav = torch.randn(2, 1, 800) * 0.1
    codes = codec.encode(wav)
    outs = [codec.decode(codes[:, :k]) for k in range(1, 5)]
    assert all(o.shape == (2, 1, 800) for o in outs)
    assert torch.equal(codec.encode(wav, n_q=2), codes[:, :2])
    # Decoding k codebooks = decoding the sum of the first k codebook vectors.
    z = codec.quantizer.decode(codes[:, :2])
    assert torch.allclose(codec.decoder(z), outs[1], atol=1e-5)


def test_causal_prefix_encodes_to_the_same_first_frames(codec):
    wav = torch.randn(1, 1, 160 * 30) * 0.1
    full = codec.encode(wav)
    prefix = codec.encode(wav[..., : 160 * 12])
    assert torch.equal(prefix, full[..., :12])


def test_frame_span_is_the_exact_receptive_field():
    model = Codec(TINY)
    lo, hi = model.frame_span
    assert hi == model.hop_length - 1  # causal: no look-ahead
    assert model.receptive_field == hi - lo + 1
    x = torch.randn(1, 1, 160 * 60, requires_grad=True)
    t = 40
    model.encoder(x)[0, :, t].sum().backward()
    support = (x.grad[0, 0] != 0).nonzero().flatten()
    assert (int(support.min()) - t * 160, int(support.max()) - t * 160) == (lo, hi)


def test_non_causal_frame_span_has_lookahead():
    model = Codec(dataclasses.replace(TINY, causal=False, encoder=dataclasses.replace(TINY.encoder,
                                                                                    full_rate_residuals=True)))
    lo, hi = model.frame_span
    assert hi > model.hop_length - 1 and lo < 0
    x = torch.randn(1, 1, 160 * 60, requires_grad=True)
    model.encoder(x)[0, :, 30].sum().backward()
    support = (x.grad[0, 0] != 0).nonzero().flatten()
    assert (int(support.min()) - 30 * 160, int(support.max()) - 30 * 160) == (lo, hi)


def test_save_load_round_trip(codec, tmp_path):
    wav = torch.randn(2, 1, 1600) * 0.1
    codes = codec.encode(wav)
    path = codec.save_pretrained(tmp_path / "codec")
    assert sorted(p.name for p in path.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    loaded = Codec.from_pretrained(path)
    assert loaded.fingerprint() == codec.fingerprint()
    assert torch.equal(loaded.encode(wav), codes)
    assert torch.equal(loaded.decode(codes), codec.decode(codes))
    codec.save_pretrained(path)  # replacing a saved codec is allowed
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_decoder_keeps_the_tokens_and_halves_the_file(codec, tmp_path, dtype):
    """save_pretrained(decoder_dtype=...) stores the decoder's floats in half precision and the
    encoder and quantizer exactly: the loaded codec is float32, makes the same tokens (same token
    fingerprint), decodes within half-precision rounding, and its fingerprint is the one recorded."""
    from safetensors import safe_open

    wav = torch.randn(2, 1, 1600) * 0.1
    codes = codec.encode(wav)
    full = codec.save_pretrained(tmp_path / "full")
    half = codec.save_pretrained(tmp_path / "half", decoder_dtype=dtype)
    stored = load_file(str(half / WEIGHTS_FILE))
    for name, tensor in stored.items():
        original = codec.state_dict()[name]
        want = getattr(torch, dtype) if name.startswith("decoder.") and original.is_floating_point() else original.dtype
        assert tensor.dtype == want, name
        if not name.startswith("decoder."):
            assert torch.equal(tensor, original), name
    decoder_bytes = sum(v.numel() * 4 for k, v in codec.state_dict().items() if k.startswith("decoder."))
    saved = (full / WEIGHTS_FILE).stat().st_size - (half / WEIGHTS_FILE).stat().st_size
    assert saved >= 0.45 * decoder_bytes  # about half of the decoder's float32 bytes

    loaded = Codec.from_pretrained(half)
    assert all(v.dtype == codec.state_dict()[k].dtype for k, v in loaded.state_dict().items())
    assert loaded.token_fingerprint() == codec.token_fingerprint()
    assert loaded.fingerprint() != codec.fingerprint()
    with safe_open(str(half / WEIGHTS_FILE), framework="pt") as f:
        assert f.metadata()["fingerprint"] == loaded.fingerprint()
    assert torch.equal(loaded.encode(wav), codes)
    exact, rounded = codec.decode(codes), loaded.decode(codes)
    assert not torch.equal(exact, rounded)
    tolerance = 3e-2 if dtype == "bfloat16" else 3e-3
    assert (rounded - exact).abs().max() <= tolerance * exact.abs().max()
    with pytest.raises(ValueError, match="decoder_dtype must be one of"):
        codec.save_pretrained(tmp_path / "bad", decoder_dtype="int4")


def test_half_precision_outside_the_decoder_is_refused(codec, tmp_path):
    """Only the decoder may be stored in half precision: a rounded encoder would change the tokens."""
    path = codec.save_pretrained(tmp_path / "c")
    state = load_file(str(path / WEIGHTS_FILE))
    name = next(k for k, v in state.items() if k.startswith("encoder.") and v.is_floating_point())
    state[name] = state[name].half()
    save_file(state, str(path / WEIGHTS_FILE))
    with pytest.raises(ValueError, match=f"{name} has dtype torch.float16"):
        Codec.from_pretrained(path)


def test_fingerprint_depends_on_weights_and_config(codec):
    other = Codec(TINY)
    assert other.fingerprint() != codec.fingerprint()
    assert len(codec.fingerprint()) == 64 and codec.fingerprint() == codec.fingerprint()


def test_token_fingerprint_covers_the_encoder_and_quantizer_not_the_decoder(codec):
    """What decides the token ids (encoder, quantizer, their settings) is in the token fingerprint;
    the decoder is not, so a decoder fine-tune keeps token files valid."""
    import copy

    token_fp, full_fp = codec.token_fingerprint(), codec.fingerprint()
    assert len(token_fp) == 64 and token_fp != full_fp
    tuned = copy.deepcopy(codec)
    with torch.no_grad():
        next(tuned.decoder.parameters()).add_(1e-3)
    assert tuned.token_fingerprint() == token_fp and tuned.fingerprint() != full_fp
    assert tuned.accepts_tokens(token_fp) and codec.accepts_tokens(token_fp)
    assert not codec.accepts_tokens(full_fp) and not tuned.accepts_tokens(full_fp)  # tokens record the token one
    assert not codec.accepts_tokens(None) and not codec.accepts_tokens("0" * 64)
    for part in (tuned.encoder, ):
        with torch.no_grad():
            next(part.parameters()).add_(1e-3)
        assert tuned.token_fingerprint() != token_fp
    requantized = copy.deepcopy(codec)
    requantized.quantizer.embed[0, 0, 0] += 1e-3
    assert requantized.token_fingerprint() != token_fp
    wider = Codec(dataclasses.replace(codec.config, decoder=dataclasses.replace(codec.config.decoder, channels=5)))
    wider.encoder.load_state_dict(codec.encoder.state_dict())
    wider.quantizer.load_state_dict(codec.quantizer.state_dict())
    assert wider.token_fingerprint() == token_fp
    other_latent = Codec(dataclasses.replace(codec.config, quantizer=dataclasses.replace(codec.config.quantizer,
                                                                                         n_codebooks=5)))
    assert other_latent.token_fingerprint() != token_fp


def test_save_refuses_to_replace_a_foreign_folder(codec, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        codec.save_pretrained(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_from_pretrained_errors(codec, tmp_path):
    with pytest.raises(FileNotFoundError, match="no codec folder"):
        Codec.from_pretrained(tmp_path / "nothing")
    path = codec.save_pretrained(tmp_path / "c")
    (path / WEIGHTS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors is missing"):
        Codec.from_pretrained(path)

    path = codec.save_pretrained(tmp_path / "c2")
    cfg = json.loads((path / CONFIG_FILE).read_text())
    # The weights hold a copy of config.json (a mixed save is refused): drop it, so that the edits
    # below reach the config checks.
    save_file(load_file(str(path / WEIGHTS_FILE)), str(path / WEIGHTS_FILE))
    (path / CONFIG_FILE).write_text(json.dumps({**cfg, "n_codebook": 3}))
    with pytest.raises(ValueError, match="unknown CodecConfig settings \\['n_codebook'\\]"):
        Codec.from_pretrained(path)
    (path / CONFIG_FILE).write_text(json.dumps({**cfg, "quantizer": {**cfg["quantizer"], "dropuot": 0.5}}))
    with pytest.raises(ValueError, match="quantizer: unknown QuantizerConfig settings \\['dropuot'\\]"):
        Codec.from_pretrained(path)
    (path / CONFIG_FILE).write_text(json.dumps({**cfg, "decoder": {"kind": "wavenet"}}))
    with pytest.raises(ValueError, match="unknown codec decoder kind 'wavenet'; registered: .*'istft'"):
        Codec.from_pretrained(path)
    (path / CONFIG_FILE).write_text(json.dumps({**cfg, "latent_dim": 8}))  # weights no longer fit
    with pytest.raises(ValueError, match="does not match its config.json.*shape"):
        Codec.from_pretrained(path)
    (path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Codec.from_pretrained(path)
    saved = codec.save_pretrained(tmp_path / "c4")
    (saved / CONFIG_FILE).write_text(json.dumps({**cfg, "causal": False}))  # config and weights of two saves
    with pytest.raises(ValueError, match="come from different saves"):
        Codec.from_pretrained(saved)

    path = codec.save_pretrained(tmp_path / "c3")
    state = load_file(str(path / WEIGHTS_FILE))
    state.pop(next(iter(state)))
    save_file(state, str(path / WEIGHTS_FILE))
    with pytest.raises(ValueError, match="missing tensors"):
        Codec.from_pretrained(path)
    (path / WEIGHTS_FILE).write_bytes(b"\x80\x04pickle? no")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        Codec.from_pretrained(path)


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(1, 2, 320), "1-channel audio, got 2"),
    (torch.zeros(1, 320), "shaped \\[B, C, S\\]"),
    (torch.zeros(1, 1, 0), "empty waveform"),
    (torch.zeros(1, 1, 320, dtype=torch.long), "float samples"),
    (torch.full((1, 1, 320), float("nan")), "NaN"),
])
def test_encode_rejects_bad_audio(codec, bad, message):
    with pytest.raises(ValueError, match=message):
        codec.encode(bad)


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(1, 5, 3, dtype=torch.long), "decodes 1..4"),
    (torch.full((1, 2, 3), 32), "0..31"),
    (torch.full((1, 2, 3), -1), "0..31"),
    (torch.zeros(1, 2, 3), "integer codes"),
    (torch.zeros(2, 3, dtype=torch.long), "\\[B, k, T\\]"),
])
def test_decode_rejects_bad_codes(codec, bad, message):
    with pytest.raises(ValueError, match=message):
        codec.decode(bad)


def test_config_validation():
    with pytest.raises(ValueError, match="not a multiple of hop_length"):
        CodecConfig(sample_rate=16000, strides=(3, 7))
    with pytest.raises(ValueError, match="codebook_size"):
        CodecConfig.from_dict({"quantizer": {"codebook_size": 1}})
    with pytest.raises(ValueError, match="CodecConfig.latent_dim must be a positive integer"):
        CodecConfig(latent_dim=0)
    with pytest.raises(ValueError, match="SEANetEncoderConfig.dilations"):
        CodecConfig.from_dict({"encoder": {"dilations": [1, 0]}})


def test_saved_folder_gets_normal_permissions(codec, tmp_path):
    """mkdtemp and safetensors make 0700/0600 entries; a saved model must be readable like any file."""
    import os
    import stat

    out = codec.save_pretrained(tmp_path / "perm")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f
