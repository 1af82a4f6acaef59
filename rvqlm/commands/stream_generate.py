"""`rvqlm generate --stream`: the continuation's audio is written while the LM generates it.

Each LM step completes at most one frame (codebook k of frame t is placed at step t + delay_k). The
prompt's frames, then each new frame, go through a `codec.core.streaming.StreamingDecoder`, and the audio
it makes final is appended to the continuation's wav (`GrowingWav`), so the file grows by about a
frame per step, one decoder latency behind the LM. The frames come from `lm.generate.generate`'s
`on_frames`, so the codes are generate's for the same arguments and seed; the audio is
`Codec.decode`'s within float rounding. The prompt + continuation file (`.full.wav`) is written
atomically at the end, as without --stream.
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from rvqlm_core.atomic import atomic_write_bytes


class GrowingWav:
    """A 16-bit PCM wav that is a valid, complete file at every moment while it grows.

    The file starts as a header with no samples (written atomically); `append` writes the samples
    after the data, then rewrites the header's two sizes in one 44-byte write, so a reader never
    meets a header that promises samples not yet there. Samples are clipped to [-1, 1] and rounded
    as `codec.core.audio.save_audio` does (libsndfile 1.2: floor(x * 32768), 1.0 clipped to 32767).
    """

    def __init__(self, path: str | Path, sample_rate: int, channels: int):
        self.path, self.sample_rate, self.channels = Path(path), sample_rate, channels
        self.frames = 0
        atomic_write_bytes(self.path, self._header())
        self.file = open(self.path, "r+b")  # noqa: SIM115 - held open while the file grows, closed in close()

    def _header(self) -> bytes:
        data = self.frames * self.channels * 2
        return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + data, b"WAVE", b"fmt ", 16, 1, self.channels,
                           self.sample_rate, self.sample_rate * self.channels * 2, self.channels * 2, 16,
                           b"data", data)

    def append(self, wav: Tensor) -> None:
        """wav [C, S] float -> S more frames in the file."""
        if wav.dim() != 2 or wav.shape[0] != self.channels:
            raise ValueError(f"{self.path}: expected [{self.channels}, S] samples, got {tuple(wav.shape)}")
        if not torch.isfinite(wav).all():
            raise ValueError(f"{self.path}: refusing to write NaN or infinite samples")
        if wav.shape[-1] == 0:
            return
        pcm = torch.floor(wav.detach().to("cpu", torch.float32).clamp(-1, 1) * 32768).clamp(-32768, 32767)
        pcm = pcm.to(torch.int16)
        self.file.seek(44 + self.frames * self.channels * 2)
        self.file.write(pcm.t().contiguous().numpy().tobytes())
        self.file.flush()
        self.frames += wav.shape[-1]
        self.file.seek(0)
        self.file.write(self._header())
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class ContinuationWriter:
    """Decodes frames as they come and appends each row's continuation to its GrowingWav (one per
    row), from the prompt's end to the row's end; keeps all audio for the .full files."""

    def __init__(self, codec, paths: list[Path], prompt_frames: int):
        self.codec, self.prompt_samples = codec, prompt_frames * codec.hop_length
        self.decoder = codec.streaming_decoder()
        self.files = [GrowingWav(p, codec.sample_rate, codec.channels) for p in paths]
        self.parts: list[Tensor] = []
        self.emitted = 0
        self.first_audio: float | None = None  # perf_counter time the continuation's first samples were written

    def frames(self, codes: Tensor, ends: Tensor) -> None:
        self._write(self.decoder.push(codes), ends)

    def finish(self, ends: Tensor) -> Tensor:
        """Flush the decoder, close the files -> all audio [B, C, frames * hop] (prompt included)."""
        self._write(self.decoder.flush(), ends)
        for f in self.files:
            f.close()
        return torch.cat(self.parts, dim=-1)

    def _write(self, audio: Tensor, ends: Tensor) -> None:
        a, b = self.emitted, self.emitted + audio.shape[-1]
        self.parts.append(audio.cpu())
        for row, f in enumerate(self.files):
            lo, hi = max(a, self.prompt_samples), min(b, int(ends[row]) * self.codec.hop_length)
            if hi > lo:
                f.append(audio[row, :, lo - a: hi - a])
                if self.first_audio is None:
                    self.first_audio = time.perf_counter()
        self.emitted = b


def generate_streaming(args, lm_model, codec, prompt: Tensor, new_frames: int, paths: list,
                       request: dict) -> int:
    """`rvqlm generate --stream` from the parsed args and lm.generate.generate's sampling, condition and
    options (`request`): generate, write while generating, report."""
    from codec.core.audio import save_audio
    from lm.generate import generate

    t0 = prompt.shape[-1]
    writer = ContinuationWriter(codec, [p.continuation for p in paths], t0)
    for p in paths:
        print(f"streaming to {p.continuation} (valid at every moment; follow it with a player)", file=sys.stderr)
    start = time.perf_counter()
    _, lengths = generate(lm_model, prompt, new_frames, on_frames=writer.frames, return_lengths=True, **request)
    wav = writer.finish(lengths)
    elapsed = time.perf_counter() - start
    hop, rate = codec.hop_length, codec.frame_rate
    for p, sample, n in zip(paths, wav, lengths.tolist()):
        stopped = "" if n == t0 + new_frames else ", stopped at its end-of-audio token"
        print(f"wrote {p.continuation} ({(n - t0) / rate:.2f} s continuation{stopped})")
        if p.full is not None:
            save_audio(p.full, sample[:, :n * hop], codec.sample_rate)
            print(f"wrote {p.full} ({n / rate:.2f} s prompt + continuation)")
    made = max(int(lengths.max()) - t0, 1)
    first = "no audio" if writer.first_audio is None else f"{1000 * (writer.first_audio - start):.0f} ms"
    print(f"generated {len(paths)} x {made} frames in {elapsed:.2f} s while writing them: first audio after {first}, "
          f"real-time factor {elapsed * rate / made:.3f} (< 1: the file grows faster than it plays); decoder "
          f"latency {writer.decoder.latency_ms:.0f} ms")
    return 0
