"""The `.rvq` file: one audio signal's codes, self-describing, versioned, bit-packed.

Layout (all integers little-endian)::

    offset 0   magic       8 bytes  b"RVQLM\\x00\\r\\n" (the CR LF catches text-mode mangling)
    offset 8   version     uint16   1
    offset 10  header_len  uint32   N
    offset 14  header      N bytes  UTF-8 JSON object (below)
    offset 14+N codes      ceil(N_c * T * bits / 8) bytes

The header holds `format_version`, `codec_fingerprint` (the token fingerprint of the codec that made the
codes), `sample_rate`, `frame_rate`, `n_codebooks` (N_c), `codebook_size` (|V|), `n_frames` (T),
`n_samples` (length of the original signal at sample_rate), `bits` (= ceil(log2 |V|)),
`payload_bytes` and `payload_crc32`, plus any extra keys the writer adds (e.g. `source`).
Codes [N_c, T] are flattened codebook-major (row by row) and each written as `bits` bits, most
significant first, packed with numpy (no Python loop per code). Nothing is unpickled on reading;
a truncated, garbled or future-version file raises `RvqFileError` saying what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from codec.core.config import bits_per_code
from rvqlm_core.atomic import atomic_write_bytes

MAGIC = b"RVQLM\x00\r\n"
VERSION = 1
_PREAMBLE = struct.Struct("<8sHI")  # magic, version, header length
REQUIRED = ("codec_fingerprint", "sample_rate", "frame_rate", "codebook_size", "n_samples")


class RvqFileError(ValueError):
    """A damaged, truncated, foreign or unsupported .rvq file; the message starts with the path."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


def pack_codes(codes: np.ndarray, bits: int) -> bytes:
    """Flat non-negative integers < 2**bits -> bytes, `bits` bits each, MSB first, zero-padded to a byte."""
    if bits == 0:
        return b""
    flat = np.ascontiguousarray(codes, dtype=np.uint64).reshape(-1)
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint64)
    bit_matrix = ((flat[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)  # [n, bits]
    return np.packbits(bit_matrix.reshape(-1)).tobytes()


def unpack_codes(payload: bytes, count: int, bits: int) -> np.ndarray:
    """Inverse of pack_codes: -> int64 array of `count` values."""
    if bits == 0:
        return np.zeros(count, dtype=np.int64)
    bit_array = np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=count * bits)
    weights = (np.int64(1) << np.arange(bits - 1, -1, -1, dtype=np.int64))
    return bit_array.reshape(count, bits).astype(np.int64) @ weights


def write_rvq(path: str | os.PathLike, codes: torch.Tensor | np.ndarray, header: dict[str, Any]) -> Path:
    """Write codes [N_c, T] (integers in 0..|V|-1) with `header` atomically; returns the path.

    header must give codec_fingerprint, sample_rate, frame_rate, codebook_size and n_samples;
    n_codebooks / n_frames are taken from the codes' shape (if present they must agree).
    """
    path = Path(path)
    array = codes.detach().cpu().numpy() if isinstance(codes, torch.Tensor) else np.asarray(codes)
    if array.ndim != 2:
        raise ValueError(f"write_rvq expects codes shaped [N_c, T], got {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"write_rvq expects integer codes, got {array.dtype}")
    missing = [k for k in REQUIRED if k not in header]
    if missing:
        raise ValueError(f"write_rvq: header lacks {missing}")
    n_codebooks, n_frames = array.shape
    for key, value in (("n_codebooks", n_codebooks), ("n_frames", n_frames)):
        if key in header and int(header[key]) != value:
            raise ValueError(f"write_rvq: header says {key}={header[key]} but codes have {value}")
    size = int(header["codebook_size"])
    bits = bits_per_code(size)
    if array.size and (array.min() < 0 or array.max() >= size):
        raise ValueError(f"write_rvq: codes must lie in 0..{size - 1}, got {array.min()}..{array.max()}")
    payload = pack_codes(array, bits)
    full = {**header, "format_version": VERSION, "n_codebooks": n_codebooks, "n_frames": n_frames,
            "codebook_size": size, "bits": bits, "payload_bytes": len(payload),
            "payload_crc32": zlib.crc32(payload)}
    head = json.dumps(full, sort_keys=True).encode("utf-8")
    atomic_write_bytes(path, _PREAMBLE.pack(MAGIC, VERSION, len(head)) + head + payload)
    return path


def read_rvq(path: str | os.PathLike) -> tuple[torch.Tensor, dict[str, Any]]:
    """Read a .rvq file -> (codes LongTensor [N_c, T], header dict). Raises RvqFileError if damaged."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such .rvq file: {path}")
    data = path.read_bytes()
    if len(data) < _PREAMBLE.size:
        raise RvqFileError(path, f"too short to be an .rvq file ({len(data)} bytes)")
    magic, version, head_len = _PREAMBLE.unpack_from(data)
    if magic != MAGIC:
        raise RvqFileError(path, "not an .rvq file (bad magic bytes)")
    if version != VERSION:
        raise RvqFileError(path, f"unsupported .rvq version {version} (this rvqlm reads version {VERSION})")
    start = _PREAMBLE.size
    if len(data) < start + head_len:
        raise RvqFileError(path, f"truncated: header needs {head_len} bytes, file has {len(data) - start}")
    try:
        header = json.loads(data[start : start + head_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RvqFileError(path, f"garbled header ({e})") from None
    if not isinstance(header, dict):
        raise RvqFileError(path, "garbled header (not a JSON object)")
    needed = REQUIRED + ("n_codebooks", "n_frames", "bits", "payload_bytes", "payload_crc32")
    missing = [k for k in needed if k not in header]
    if missing:
        raise RvqFileError(path, f"header lacks {missing}")
    try:
        n_codebooks, n_frames = int(header["n_codebooks"]), int(header["n_frames"])
        size, bits, n_bytes = int(header["codebook_size"]), int(header["bits"]), int(header["payload_bytes"])
    except (TypeError, ValueError):
        raise RvqFileError(path, "garbled header (non-integer sizes)") from None
    if min(n_codebooks, n_frames, n_bytes) < 0 or size < 1 or bits != bits_per_code(size):
        raise RvqFileError(path, f"inconsistent header (N_c={n_codebooks}, T={n_frames}, |V|={size}, bits={bits})")
    if n_bytes != math.ceil(n_codebooks * n_frames * bits / 8):
        raise RvqFileError(path, f"inconsistent header: {n_bytes} payload bytes cannot hold {n_codebooks}x{n_frames} codes")
    payload = data[start + head_len :]
    if len(payload) < n_bytes:
        raise RvqFileError(path, f"truncated: codes need {n_bytes} bytes, file has {len(payload)}")
    if len(payload) > n_bytes:
        raise RvqFileError(path, f"{len(payload) - n_bytes} unexpected bytes after the codes")
    if zlib.crc32(payload) != header["payload_crc32"]:
        raise RvqFileError(path, "the codes are damaged (checksum mismatch)")
    codes = unpack_codes(payload, n_codebooks * n_frames, bits).reshape(n_codebooks, n_frames)
    if codes.size and codes.max() >= size:
        raise RvqFileError(path, f"codes out of range for |V|={size}")
    return torch.from_numpy(codes), header
