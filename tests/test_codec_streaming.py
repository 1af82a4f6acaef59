"""The streaming codec (codec/core/streaming.py): chunk by chunk it gives `Codec.encode`'s codes bit for bit
and `Codec.decode`'s audio within 1e-5, for every chunking, with both decoder parts,
and its audio leaves a fixed latency (hop + look-ahead) after its input."""

from __future__ import annotations

import math

import pytest
import torch

from codec import Codec, CodecConfig
from codec.core.audio import load_audio
from codec.core.streaming import StreamingDecoder, StreamingEncoder

SEANET = dict(kind="seanet", channels=4, dilations=(1, 3))
BASE = dict(strides=(2, 4, 5, 4), latent_dim=16, encoder=SEANET,  # hop 160 (10 ms at 16 kHz)
            quantizer=dict(n_codebooks=4, codebook_size=32, kmeans_iters=2))
# Both decoders; one iSTFT window (100) that is no multiple of its hop (40).
KINDS = {"istft": dict(decoder=dict(kind="istft", dim=32, layers=2, hop=40, n_fft=None)),
         "seanet": dict(decoder=SEANET),
         "istft100": dict(decoder=dict(kind="istft", dim=32, layers=2, hop=40, n_fft=100))}
MAX_CHUNK = 3 * 16000  # 3 s


@pytest.fixture(scope="module", params=sorted(KINDS))
def codec(request) -> Codec:
    torch.manual_seed(0)
    model = Codec(CodecConfig.from_dict({**BASE, **KINDS[request.param]})).train()
    model(torch.randn(2, 1, 1600) * 0.1)  # k-means initialises the codebooks
    return model.eval()


def chunk_sizes(total: int, seed: int, top: int = MAX_CHUNK, ones: int = 40) -> list[int]:
    """`ones` chunks of 1, then sizes log-uniform in 1..top, summing to total."""
    g = torch.Generator().manual_seed(seed)
    sizes = [1] * ones
    while sum(sizes) < total:
        sizes.append(int(math.exp(torch.rand(1, generator=g).item() * math.log(top))))
    sizes[-1] -= sum(sizes) - total
    return sizes


def stream_encode(codec: Codec, wav: torch.Tensor, sizes: list[int], n_q: int | None = None) -> torch.Tensor:
    enc, out, at = StreamingEncoder(codec, n_q=n_q), [], 0
    for n in sizes:
        codes = enc.push(wav[..., at: at + n])
        at += n
        assert codes.shape[-1] == at // codec.hop_length - sum(c.shape[-1] for c in out)  # every complete frame
        out.append(codes)
    out.append(enc.flush())
    return torch.cat(out, dim=-1)


def stream_decode(codec: Codec, codes: torch.Tensor, sizes: list[int], exact: bool = False) -> torch.Tensor:
    dec, out, at = StreamingDecoder(codec, exact=exact), [], 0
    for n in sizes:
        out.append(dec.push(codes[..., at: at + n]))
        at += n
        # Audio leaves as soon as it is final: all but the look-ahead of the frames so far.
        assert sum(a.shape[-1] for a in out) == max(at * codec.hop_length - dec.lookahead_samples, 0)
    out.append(dec.flush())
    return torch.cat(out, dim=-1)


@pytest.mark.parametrize("batch,seconds", [(2, 2.5), (1, 4.5), (1, 0.3)])
def test_streamed_codes_are_encode_bit_for_bit(codec, batch, seconds):
    wav = torch.randn(batch, 1, int(seconds * 16000) + 37) * 0.1  # a partial last frame
    expected = codec.encode(wav)
    for seed in range(3):
        assert torch.equal(stream_encode(codec, wav, chunk_sizes(wav.shape[-1], seed)), expected)


def test_streamed_codes_with_fewer_codebooks(codec):
    wav = torch.randn(1, 1, 8000) * 0.1
    assert torch.equal(stream_encode(codec, wav, chunk_sizes(8000, 5, top=4000), n_q=2), codec.encode(wav, n_q=2))


def test_streamed_audio_is_decode(codec):
    codes = codec.encode(torch.randn(2, 1, 16000 * 2) * 0.1)
    expected = codec.decode(codes)
    for seed in range(3):
        audio = stream_decode(codec, codes, chunk_sizes(codes.shape[-1], seed, top=codes.shape[-1], ones=25))
        assert audio.shape == expected.shape
        assert (audio - expected).abs().max() < 1e-5
    assert (stream_decode(codec, codes[:, :1], [codes.shape[-1]]) - codec.decode(codes[:, :1])).abs().max() < 1e-5
    # exact=True: the offline pass's kernels, leaving only the overlap-adds' order of sums.
    exact = stream_decode(codec, codes, chunk_sizes(codes.shape[-1], 9, top=40, ones=25), exact=True)
    assert (exact - expected).abs().max() < 1e-6


def test_latency_is_hop_plus_lookahead(codec):
    dec = StreamingDecoder(codec)
    if codec.config.decoder.kind == "istft":
        assert dec.lookahead_samples == codec.config.decoder.window // 2
    else:
        assert dec.lookahead_samples == 0
    assert dec.latency_samples == codec.hop_length + dec.lookahead_samples
    assert dec.latency_ms == pytest.approx(1000 * dec.latency_samples / 16000)


def test_audio_is_final_when_it_leaves_and_leaves_at_once(codec):
    """Other codes at frame f change nothing of the audio returned before frame f, and change what
    frame f's own push returns: audio is final when returned, and returned as soon as it can change."""
    codes = codec.encode(torch.randn(1, 1, 160 * 20) * 0.1)
    f = 12
    other = codes.clone()
    other[..., f] = (other[..., f] + 1) % codec.codebook_size
    runs = []
    for c in (codes, other):
        dec = StreamingDecoder(codec)
        runs.append([dec.push(c[..., t: t + 1]) for t in range(c.shape[-1])])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][:f], runs[1][:f]))
    assert not torch.equal(runs[0][f], runs[1][f])


def test_shipped_codec_streams_real_speech_in_20ms_chunks(speech_files):
    codec = Codec.from_pretrained("models/codec-speech-16k")
    wav = load_audio(speech_files["test"][0], codec.sample_rate, codec.channels)[None]  # 6.7 s
    codes = stream_encode(codec, wav, [320] * (wav.shape[-1] // 320) + [wav.shape[-1] % 320])
    assert torch.equal(codes, codec.encode(wav))
    dec = StreamingDecoder(codec)
    assert (dec.lookahead_samples, dec.latency_samples, dec.latency_ms) == (320, 640, 40.0)
    audio = stream_decode(codec, codes, [1] * codes.shape[-1])
    assert (audio - codec.decode(codes)).abs().max() < 1e-5
    # The source-filter decoder runs its pulse phase in float64: any chunking lands within float rounding.
    exact = stream_decode(codec, codes, chunk_sizes(codes.shape[-1], 0, top=20, ones=20), exact=True)
    assert (exact - codec.decode(codes)).abs().max() < 1e-6


def test_non_causal_codecs_are_refused():
    model = Codec(CodecConfig.from_dict({**BASE, "causal": False}))
    for make in (StreamingEncoder, StreamingDecoder):
        with pytest.raises(ValueError, match="causal"):
            make(model)


def test_bad_chunks_are_refused(codec):
    enc = StreamingEncoder(codec)
    with pytest.raises(ValueError, match=r"\[B, 1, n\]"):
        enc.push(torch.zeros(1, 2, 100))
    with pytest.raises(ValueError, match="finite float"):
        enc.push(torch.full((1, 1, 10), float("nan")))
    with pytest.raises(ValueError, match="empty"):
        enc.flush()
    enc.push(torch.zeros(2, 1, 10))
    with pytest.raises(ValueError, match="carries 2 signals"):
        enc.push(torch.zeros(1, 1, 10))
    enc.flush()
    with pytest.raises(ValueError, match="flushed"):
        enc.push(torch.zeros(2, 1, 10))
    dec = StreamingDecoder(codec)
    with pytest.raises(ValueError, match=r"\[B, k, t\]"):
        dec.push(torch.zeros(4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="0..31"):
        dec.push(torch.full((1, 4, 2), 32))


def test_reconstruct_stream_writes_what_reconstruct_writes_and_reports_compute(codec, speech_files, tmp_path,
                                                                              capsys):
    import numpy as np
    import soundfile as sf

    from rvqlm.cli import main

    folder = codec.save_pretrained(tmp_path / "codec")
    speech = str(speech_files["test"][0])
    assert main(["reconstruct", speech, str(tmp_path / "plain.wav"), "--codec", str(folder)]) == 0
    assert main(["reconstruct", speech, str(tmp_path / "live.wav"), "--codec", str(folder), "--stream",
                 "--chunk-ms", "7.5", "--n-codebooks", "4"]) == 0
    printed = capsys.readouterr().out
    assert "chunks of 7.5 ms" in printed and "median" in printed and "p95" in printed
    assert f"algorithmic latency {StreamingDecoder(codec).latency_ms:.1f} ms" in printed
    plain = sf.read(str(tmp_path / "plain.wav"), dtype="int16")[0].astype(int)
    live = sf.read(str(tmp_path / "live.wav"), dtype="int16")[0].astype(int)
    assert plain.shape == live.shape and np.abs(plain - live).max() <= 1  # float rounding only
    assert main(["reconstruct", speech, str(tmp_path / "x.wav"), "--codec", str(folder), "--stream",
                 "--chunk-ms", "0"]) != 0
    assert "--chunk-ms must be at least one sample" in capsys.readouterr().err
