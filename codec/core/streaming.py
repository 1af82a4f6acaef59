"""The codec live: an encoder that takes audio chunk by chunk, a decoder that takes codes frame by frame.

    enc = codec.streaming_encoder()        # or StreamingEncoder(codec, n_q=k)
    codes = enc.push(chunk)                # chunk [B, C, n], any n >= 0 -> LongTensor [B, n_q, frames completed]
    codes = enc.flush()                    # end of stream: a partial last frame, zero-padded -> [B, n_q, 0 or 1]
    dec = codec.streaming_decoder()
    audio = dec.push(codes)                # codes [B, k, t], any t >= 0 -> [B, C, samples now final]
    audio = dec.flush()                    # end of stream: the rest -> [B, C, ...]
    dec.latency_samples                    # hop_length + dec.lookahead_samples

The codes of all pushes and the flush are `Codec.encode` of the whole signal, bit for bit; the
audio of all pushes and the flush is `Codec.decode` of all the codes (within float rounding), for
any chunking. Every convolution carries its own left context (`codec.core.streaming_layers`), so a
chunk costs what its own frames cost; nothing is recomputed.

Exactness: a chunk is computed with the kernels a long signal's offline pass uses (oneDNN
convolutions, many-row matmuls, SIMD loops; `codec.core.streaming_layers`), so on the CPU the latents
are `Codec.encode`'s bit for bit wherever that pass takes them too: at batch > 1, or at batch 1 once
every convolution's input holds over 20480 values (3.1 s for the shipped codec), except the last
few frames (where the offline pass computes elementwise functions in scalar code). Elsewhere they
agree to ~1e-7, and the codes, nearest codebook vectors, still agree unless two lie within that of
a tie (none in the tests). On the GPU no kernel is pinned. The decoder, which owes only 1e-5, runs
plain kernels unless built with `exact=True` (then about twice the compute per frame).

Latency: a frame's codes exist once its last sample has arrived (no look-ahead). Each part streams
itself (`streaming_step`, codec.core.parts); a decoder's audio may lag its frames (`lookahead_samples`:
0 for SEANet, n_fft / 2 for the iSTFT decoder's overlap-add), so an input sample comes back at most
hop_length + lookahead_samples samples later (`latency_samples`), plus compute time.

Only causal codecs (config `causal: true`) stream (`AudioCodec.can_stream`; `stream_refusal` says why
not); a step object snapshots the codec's weights when it is built.
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator, NamedTuple

import torch
from einops import rearrange


def _check_can_stream(codec) -> None:
    if not codec.can_stream:
        raise ValueError(codec.stream_refusal)


def _batch_check(batch: int | None, x: torch.Tensor, what: str) -> int:
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"this stream carries {batch} signals; got a {what} chunk of batch {x.shape[0]}")
    return x.shape[0]


class FrameQuantizer:
    """`ResidualVectorQuantizer.encode` for a few frames at a time: its nearest-code search
    (`codec.core.quantizer.nearest_codes`, the same operations in the same order) with the codebook-side
    terms (mean, centred codebook, squared norms) computed once, not once per chunk.

    latents [B, D, n] -> codes [B, n_q, n], equal to the quantizer's. Snapshot of the codebooks.
    """

    def __init__(self, quantizer, candidates: int = 4):
        self.embed, self.candidates = quantizer.embed, candidates
        self.terms = []
        for codebook in quantizer.embed:
            center = codebook.mean(dim=0, keepdim=True)
            ec = codebook - center
            self.terms.append((center, ec, ec.pow(2).sum(1).unsqueeze(0)))

    def nearest(self, x: torch.Tensor, c: int) -> torch.Tensor:
        """x [N, D] -> LongTensor [N]: index of the nearest vector of codebook c (ties: lowest index)."""
        center, ec, norms = self.terms[c]
        xc = x - center
        scores = torch.addmm(norms, xc, ec.t(), alpha=-2.0)
        k = min(self.candidates, ec.shape[0])
        if k == 1:
            return scores.argmin(dim=1)
        cand = scores.topk(k, dim=1, largest=False, sorted=True).indices  # re-ranked by direct distances
        exact = (xc.unsqueeze(1) - ec[cand]).pow(2).sum(-1)
        order = cand.argsort(dim=1)
        cand, exact = cand.gather(1, order), exact.gather(1, order)
        return cand.gather(1, exact.argmin(dim=1, keepdim=True)).squeeze(1)

    def encode(self, z: torch.Tensor, n_q: int) -> torch.Tensor:
        b = z.shape[0]
        residual = rearrange(z.float(), "b d t -> (b t) d")
        codes = []
        for c in range(n_q):
            idx = self.nearest(residual, c)
            residual = residual - self.embed[c][idx]
            codes.append(idx)
        return rearrange(torch.stack(codes), "k (b t) -> b k t", b=b)


class StreamingEncoder:
    """Audio chunks -> the codes of every frame they complete. See the module docstring.

    n_q: codebooks per frame (default all). `samples` counts the samples pushed, `frames` the
    frames returned; after `flush` the stream is closed.
    """

    def __init__(self, codec, n_q: int | None = None):
        _check_can_stream(codec)
        self.codec, self.n_q = codec, codec.quantizer._check_n_q(n_q)
        with torch.no_grad():
            self.chain = codec.encoder.streaming_step()
            self.quantizer = FrameQuantizer(codec.quantizer)
        self.batch: int | None = None
        self.samples = self.frames = 0
        self.closed = False

    @torch.inference_mode()
    def push(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, C, n] float (n >= 0; B fixed by the first chunk) -> LongTensor [B, n_q, frames completed]."""
        if self.closed:
            raise ValueError("this stream was flushed; start a new StreamingEncoder")
        if not isinstance(wav, torch.Tensor) or wav.dim() != 3 or wav.shape[1] != self.codec.channels:
            shape = tuple(wav.shape) if isinstance(wav, torch.Tensor) else type(wav).__name__
            raise ValueError(f"expected a chunk shaped [B, {self.codec.channels}, n], got {shape}")
        if not wav.is_floating_point() or not torch.isfinite(wav).all():
            raise ValueError(f"expected finite float samples, got a chunk of dtype {wav.dtype} with NaN/inf or ints")
        self.batch = _batch_check(self.batch, wav, "audio")
        self.samples += wav.shape[-1]
        latent = self.chain.step(wav.to(self.codec.device, torch.float32))
        self.frames += latent.shape[-1]
        if latent.shape[-1] == 0:
            return torch.zeros(wav.shape[0], self.n_q, 0, dtype=torch.long, device=latent.device)
        return self.quantizer.encode(latent, self.n_q)

    def flush(self) -> torch.Tensor:
        """Ends the stream: zero-pads a partial last frame as `Codec.encode` does -> [B, n_q, 0 or 1]."""
        if self.batch is None:
            raise ValueError("flush before any audio: the stream is empty")
        extra = (-self.samples) % self.codec.hop_length
        device = self.codec.device
        codes = self.push(torch.zeros(self.batch, self.codec.channels, extra, device=device))
        self.closed = True
        return codes


class StreamingDecoder:
    """Codes frame by frame -> audio as soon as it is final. See the module docstring.

    lookahead_samples: how far behind the codes the decoder's audio is (see the module docstring);
    latency_samples = hop_length + lookahead_samples: from a sample entering a streaming encoder
    to its reconstruction leaving this decoder, compute time aside.
    exact: run the offline pass's kernels (see the module docstring); default plain, faster ones.
    """

    def __init__(self, codec, exact: bool = False):
        _check_can_stream(codec)
        self.codec, self.exact = codec, exact
        with torch.no_grad():
            self.stream = codec.decoder.streaming_step(exact)
        self.lookahead_samples = self.stream.lookahead_samples
        self.latency_samples = codec.hop_length + self.lookahead_samples
        self.batch: int | None = None
        self.frames = 0
        self.closed = False

    @property
    def latency_ms(self) -> float:
        return 1000.0 * self.latency_samples / self.codec.sample_rate

    @torch.inference_mode()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, k, t] (t >= 0, 1 <= k <= N_c) -> wav [B, C, samples made final]."""
        if self.closed:
            raise ValueError("this stream was flushed; start a new StreamingDecoder")
        if not isinstance(codes, torch.Tensor) or codes.dim() != 3:
            shape = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise ValueError(f"expected codes shaped [B, k, t], got {shape}")
        self.batch = b = _batch_check(self.batch, codes, "code")
        self.frames += codes.shape[-1]
        if codes.shape[-1] == 0:
            return torch.zeros(b, self.codec.channels, 0, device=self.codec.device)
        return self.stream.step(self.codec.quantizer.decode(codes.to(self.codec.device)))

    @torch.inference_mode()
    def flush(self) -> torch.Tensor:
        """Ends the stream: the samples still waiting for look-ahead -> [B, C, lookahead_samples] (empty
        for SEANet). With the pushes' output: exactly frames x hop_length samples, as `Codec.decode`."""
        if self.batch is None:
            raise ValueError("flush before any codes: the stream is empty")
        self.closed = True
        return self.stream.flush(self.batch).to(self.codec.device)


class ChunkTime(NamedTuple):
    """Seconds one chunk took in `stream_roundtrip`: wall clock and this thread's CPU time, per half."""

    encode: float
    decode: float
    encode_cpu: float
    decode_cpu: float


def stream_roundtrip(codec, wav: torch.Tensor, chunk: int, n_q: int | None = None
                     ) -> tuple[torch.Tensor, list[ChunkTime]]:
    """wav [B, C, S] through a StreamingEncoder and a StreamingDecoder in chunks of `chunk` samples, as
    live audio would come -> (audio [B, C, S], each chunk's ChunkTime; the last includes both flushes).
    The audio is `Codec.decode(Codec.encode(wav))` trimmed to S."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 sample, got {chunk}")
    done = list(stream_chunks(codec, (wav[..., at: at + chunk] for at in range(0, wav.shape[-1], chunk)), n_q))
    return torch.cat([audio for audio, _ in done], dim=-1)[..., : wav.shape[-1]], [t for _, t in done]


def stream_chunks(codec, chunks: Iterable[torch.Tensor], n_q: int | None = None
                  ) -> Iterator[tuple[torch.Tensor, ChunkTime]]:
    """Each chunk [B, C, n] of `chunks` through a StreamingEncoder and a StreamingDecoder as it comes ->
    (the audio it made final [B, C, m], its ChunkTime); the last chunk's item includes both flushes, so all
    the audio is `Codec.decode(Codec.encode(all the chunks))`, a whole frame longer at most. Memory stays
    bounded whatever the stream's length (`stream_roundtrip` on a tensor; `rechunk` for file blocks)."""
    enc, dec = StreamingEncoder(codec, n_q=n_q), StreamingDecoder(codec)
    chunks = iter(chunks)
    ahead = next(chunks, None)
    if ahead is None:
        raise ValueError("no audio to stream")
    while ahead is not None:
        wav, ahead = ahead, next(chunks, None)  # one chunk ahead, to know the last one
        t0, c0 = time.perf_counter(), time.thread_time()
        codes = enc.push(wav)
        if ahead is None:
            codes = torch.cat([codes, enc.flush()], dim=-1)
        t1, c1 = time.perf_counter(), time.thread_time()
        audio = dec.push(codes)
        if ahead is None:
            audio = torch.cat([audio, dec.flush()], dim=-1)
        yield audio, ChunkTime(t1 - t0, time.perf_counter() - t1, c1 - c0, time.thread_time() - c1)


def rechunk(blocks: Iterable[torch.Tensor], size: int) -> Iterator[torch.Tensor]:
    """Blocks [C, n] of any lengths (e.g. `codec.core.audio.iter_audio_blocks`) -> chunks [1, C, size] in order,
    the last one shorter when the total is no multiple of `size`."""
    if size < 1:
        raise ValueError(f"chunk must be at least 1 sample, got {size}")
    held = None
    for block in blocks:
        held = block if held is None else torch.cat([held, block], dim=-1)
        while held.shape[-1] >= size:
            yield held[None, :, :size]
            held = held[:, size:]
    if held is not None and held.shape[-1]:
        yield held[None]
