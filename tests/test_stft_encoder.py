"""The STFT + ConvNeXt encoder: what its analysis computes, shapes, causality, receptive field, codec use."""

from __future__ import annotations

import pytest
import torch

from codec import Codec, CodecConfig
from codec.stft_encoder import STFTEncoder

TINY = CodecConfig(strides=(4, 4, 5, 4), latent_dim=8, n_codebooks=3, codebook_size=16, kmeans_iters=2,
                   encoder="stft", encoder_dim=16, encoder_layers=2, encoder_hop=80,
                   decoder="istft", decoder_dim=16, decoder_layers=2, istft_hop=80)


def test_spectra_are_torch_stft_compressed():
    """The fixed DFT convolution is the Hann-windowed STFT (hop stft_hop, n_fft 4 * stft_hop) with
    magnitudes raised to the compression exponent and phases kept."""
    torch.manual_seed(0)
    enc = STFTEncoder(1, latent_dim=8, hop_length=320, stft_hop=80, dim=16, n_layers=1, causal=False)
    wav = torch.randn(1, 1, 320 * 5)
    got = enc.spectra(wav)  # [1, 1, 2, 161, 20]
    padded = torch.nn.functional.pad(wav[:, 0], enc.stft_pad)
    ref = torch.stft(padded, 320, hop_length=80, window=torch.hann_window(320), center=False,
                     return_complex=True)  # [1, 161, 20]
    ref = ref.abs() ** 0.3 * torch.exp(1j * ref.angle())
    assert got.shape == (1, 1, 2, 161, 20)
    assert torch.allclose(torch.complex(got[0, 0, 0], got[0, 0, 1]), ref[0], atol=1e-4)


def test_shapes_for_mono_and_stereo_and_bad_lengths():
    for channels in (1, 2):
        enc = STFTEncoder(channels, latent_dim=8, hop_length=320, stft_hop=80, dim=16, n_layers=2)
        assert enc(torch.randn(3, channels, 320 * 7)).shape == (3, 8, 7)
    with pytest.raises(ValueError, match="multiple of hop_length"):
        enc(torch.randn(1, 2, 100))
    with pytest.raises(ValueError, match="must divide"):
        STFTEncoder(1, hop_length=320, stft_hop=96)


@pytest.mark.parametrize("causal", [True, False])
def test_frame_span_bounds_the_receptive_field_to_one_sample(causal):
    torch.manual_seed(0)
    enc = STFTEncoder(1, latent_dim=8, hop_length=320, stft_hop=80, dim=16, n_layers=2, causal=causal)
    lo, hi = enc.frame_span()
    x = torch.randn(1, 1, 320 * 30, requires_grad=True)
    t = 20
    enc(x)[0, :, t].sum().backward()
    support = (x.grad[0, 0] != 0).nonzero().flatten() - t * 320
    # The Hann window's first tap is zero: the earliest sample of the span carries no weight.
    assert (int(support.min()), int(support.max())) == (lo + 1, hi)
    if causal:
        assert hi == 319  # no look-ahead
    else:
        assert hi > 319


def test_codec_with_stft_encoder_is_causal_trains_and_round_trips(tmp_path):
    torch.manual_seed(0)
    codec = Codec(TINY)
    assert isinstance(codec.encoder, STFTEncoder)
    wav = torch.randn(2, 1, 320 * 12) * 0.1
    out = codec(wav)
    (out.audio.pow(2).mean() + out.quantizer.commit_loss).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in codec.encoder.parameters())
    codec.eval()
    codes = codec.encode(wav)
    assert codes.shape == (2, 3, 12)
    assert torch.equal(codec.encode(wav[..., : 320 * 5]), codes[..., :5])  # a prefix keeps its tokens
    codec.save_pretrained(tmp_path / "c")
    loaded = Codec.from_pretrained(tmp_path / "c")
    assert loaded.config == codec.config and loaded.fingerprint() == codec.fingerprint()
    assert torch.equal(loaded.encode(wav), codes)


def test_config_validation_and_fingerprints_of_seanet_encoders_ignore_stft_settings():
    with pytest.raises(ValueError, match="encoder must be one of"):
        CodecConfig(encoder="wavelet")
    with pytest.raises(ValueError, match="encoder_hop 96 must divide"):
        CodecConfig(encoder="stft", encoder_hop=96)
    torch.manual_seed(0)
    a = Codec(CodecConfig(encoder_channels=2, latent_dim=8, n_codebooks=2, codebook_size=16))
    b = Codec(CodecConfig(**{**a.config.to_dict(), "encoder_dim": 999}))
    b.load_state_dict(a.state_dict())
    assert a.fingerprint() == b.fingerprint()  # the STFT settings do not exist for a SEANet encoder
