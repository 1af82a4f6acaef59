"""The ConvNeXt + inverse-STFT decoder: shapes, what it computes, look-ahead, codec integration, save/load."""

from __future__ import annotations

import math

import pytest
import torch

from codec import Codec, CodecConfig
from codec.core.modules import ConvNeXtBlock
from codec.neural.istft_decoder import ISTFTDecoder

TINY = CodecConfig.from_dict(dict(latent_dim=8, encoder=dict(channels=2, dilations=(1,)),
                                  quantizer=dict(n_codebooks=3, codebook_size=16, kmeans_iters=2),
                                  decoder=dict(kind="istft", dim=16, layers=2, hop=80, n_fft=None)))


def test_shapes_for_mono_and_stereo():
    for channels in (1, 2):
        dec = ISTFTDecoder(channels, latent_dim=8, hop_length=320, istft_hop=80, dim=16, n_layers=2)
        z = torch.randn(3, 8, 7)
        assert dec(z).shape == (3, channels, 7 * 320)
        spec = dec.spectrum(z)
        assert spec.shape == (3 * channels, 161, 7 * 4) and spec.is_complex()


def test_output_is_the_inverse_stft_of_the_predicted_spectra():
    """The waveform is exactly what overlap-adding the head's spectra gives: re-analysing it with the
    same STFT returns those spectra wherever they are consistent (checked by round-tripping a real
    signal's STFT through the synthesis path)."""
    torch.manual_seed(0)
    dec = ISTFTDecoder(1, latent_dim=8, hop_length=320, istft_hop=80, dim=16, n_layers=1)
    wav = torch.randn(1, 320 * 6) * 0.1
    spec = torch.stft(wav, 320, hop_length=80, window=dec.window, center=True, return_complex=True)[..., : 6 * 4]
    dec.spectrum = lambda z: spec  # the head's output replaced by a consistent spectrogram
    out = dec(torch.zeros(1, 8, 6))
    assert torch.allclose(out[0, 0], wav[0], atol=1e-5)


def test_magnitudes_are_clipped_and_phases_free():
    dec = ISTFTDecoder(1, latent_dim=8, hop_length=320, istft_hop=160, dim=16, n_layers=1)
    with torch.no_grad():
        dec.head.bias.fill_(10.0)  # log-magnitude 10 -> e^10, clipped
    spec = dec.spectrum(torch.zeros(1, 8, 3))
    assert torch.allclose(spec.abs(), torch.full(spec.shape, ISTFTDecoder.MAX_MAGNITUDE), rtol=1e-5)
    assert dec.n_fft == 640 and dec.per_frame == 2


def test_a_longer_window_is_an_exact_inverse_stft_too_with_its_own_lookahead():
    """n_fft=640 at istft_hop=160: 321 bins, two spectra per 320-sample frame, overlap-add of the
    head's spectra (a consistent spectrogram round-trips exactly), look-ahead n_fft / 2."""
    torch.manual_seed(0)
    dec = ISTFTDecoder(1, latent_dim=8, hop_length=320, istft_hop=160, dim=16, n_layers=1, causal=True, n_fft=640)
    assert (dec.n_fft, dec.n_bins, dec.per_frame) == (640, 321, 2)
    z = torch.randn(1, 8, 12, requires_grad=True)
    assert dec.spectrum(z).shape == (1, 321, 24)
    n = 5 * 320 + 100
    dec(z)[0, 0, n].backward()
    assert int((z.grad[0].abs().sum(0) > 0).nonzero().max()) == (n + 320) // 320
    wav = torch.randn(1, 320 * 6) * 0.1
    spec = torch.stft(wav, 640, hop_length=160, window=dec.window, center=True, return_complex=True)[..., :12]
    dec.spectrum = lambda z: spec
    assert torch.allclose(dec(torch.zeros(1, 8, 6))[0, 0], wav[0], atol=1e-5)


def test_convnext_block_causal_sees_no_future_frames():
    torch.manual_seed(0)
    block = ConvNeXtBlock(8, 24, causal=True)
    x = torch.randn(1, 8, 20, requires_grad=True)
    block(x)[0, :, 10].sum().backward()
    assert x.grad[0, :, 11:].abs().sum() == 0 and x.grad[0, :, 4:11].abs().sum() > 0


def test_causal_decoder_lookahead_is_at_most_half_an_fft():
    """Sample n may depend on latent frames up to (n + n_fft/2) // hop, never later ones."""
    torch.manual_seed(0)
    dec = ISTFTDecoder(1, latent_dim=8, hop_length=320, istft_hop=80, dim=16, n_layers=2, causal=True)
    z = torch.randn(1, 8, 12, requires_grad=True)
    n = 5 * 320 + 100
    dec(z)[0, 0, n].backward()
    used = (z.grad[0].abs().sum(0) > 0).nonzero().flatten()
    assert int(used.max()) == (n + dec.n_fft // 2) // 320
    # Non-causal: the ConvNeXt stack also looks 3 frames ahead per layer.
    dec_nc = ISTFTDecoder(1, latent_dim=8, hop_length=320, istft_hop=80, dim=16, n_layers=2, causal=False)
    z.grad = None
    dec_nc(z)[0, 0, n].backward()
    assert int((z.grad[0].abs().sum(0) > 0).nonzero().max()) > (n + 160) // 320


def test_codec_with_istft_decoder_trains_encodes_decodes_and_round_trips(tmp_path):
    torch.manual_seed(0)
    codec = Codec(TINY)
    assert isinstance(codec.decoder, ISTFTDecoder)
    codec.train()
    wav = torch.randn(2, 1, 3200) * 0.1
    out = codec(wav)
    assert out.audio.shape == wav.shape
    (out.audio.pow(2).mean() + out.quantizer.commit_loss).backward()
    grads = [p.grad for p in codec.decoder.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    codec.eval()
    codes = codec.encode(wav)
    assert codes.shape == (2, 3, 10)
    audio = codec.decode(codes)
    assert audio.shape == (2, 1, 3200) and torch.isfinite(audio).all()
    codec.save_pretrained(tmp_path / "c")
    loaded = Codec.from_pretrained(tmp_path / "c")
    assert loaded.config == codec.config and loaded.fingerprint() == codec.fingerprint()
    assert torch.equal(loaded.decode(codes), audio)


def test_config_validation():
    with pytest.raises(ValueError, match="istft decoder hop 96 must divide hop_length 320"):
        CodecConfig.from_dict({"decoder": {"kind": "istft", "hop": 96}})
    with pytest.raises(ValueError, match="istft decoder.dim must be a positive integer"):
        CodecConfig.from_dict({"decoder": {"dim": 0}})
    for bad in (100, 641, True):
        with pytest.raises(ValueError, match="n_fft must be None or an even integer >= 2 \\* hop"):
            CodecConfig.from_dict({"decoder": {"hop": 80, "n_fft": bad}})
    assert Codec(CodecConfig.from_dict({**TINY.to_dict(), "decoder": {"dim": 16, "layers": 1}})).decoder.n_fft == 640
    assert Codec(TINY).decoder.n_fft == 320  # n_fft None: 4 x hop


def test_istft_decoder_is_cheaper_per_frame_than_it_is_wide():
    """Parameter count is what the docstring's arithmetic says: embed + blocks + head."""
    dec = ISTFTDecoder(1, latent_dim=64, hop_length=320, istft_hop=80, dim=384, n_layers=8)
    d, h, k = 384, 3 * 384, 7
    block = d * k + d + 2 * d + d * h + h + h * d + d + d
    expected = (64 * d * k + d) + 2 * d + 8 * block + 2 * d + (d * 4 * 2 * 161 + 4 * 2 * 161)
    assert sum(p.numel() for p in dec.parameters()) == expected
    assert math.isclose(expected / 1e6, 7.79, abs_tol=0.01)
