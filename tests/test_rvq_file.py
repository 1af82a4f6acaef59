"""The .rvq file: bit-packed round trips for several |V|, and clear errors for damaged files."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
import torch

from codec.core.config import bits_per_code
from codec.core.rvq_file import MAGIC, RvqFileError, pack_codes, read_rvq, unpack_codes, write_rvq


def header(size: int, **extra) -> dict:
    return {"codec_fingerprint": "ab" * 32, "sample_rate": 16000, "frame_rate": 50, "codebook_size": size,
            "n_samples": 12345, **extra}


@pytest.mark.parametrize("size, bits", [(2, 1), (3, 2), (1000, 10), (1024, 10), (1025, 11), (4096, 12), (65536, 16)])
def test_round_trip_and_packed_size(tmp_path, size, bits):
    gen = torch.Generator().manual_seed(size)
    codes = torch.randint(0, size, (8, 37), generator=gen)
    codes[0, 0], codes[-1, -1] = 0, size - 1  # both extremes
    path = write_rvq(tmp_path / "x.rvq", codes, header(size, source="a.wav"))
    back, head = read_rvq(path)
    assert torch.equal(back, codes) and back.dtype == torch.long
    assert head["bits"] == bits == bits_per_code(size)
    assert (head["n_codebooks"], head["n_frames"], head["n_samples"], head["source"]) == (8, 37, 12345, "a.wav")
    payload = math.ceil(8 * 37 * bits / 8)
    assert head["payload_bytes"] == payload
    head_len = struct.unpack_from("<I", path.read_bytes(), 10)[0]
    assert path.stat().st_size == 14 + head_len + payload


def test_pack_layout_is_msb_first():
    assert pack_codes(np.array([1, 2, 3]), 2) == bytes([0b01101100])
    assert unpack_codes(bytes([0b01101100]), 3, 2).tolist() == [1, 2, 3]


def test_empty_codes_round_trip(tmp_path):
    path = write_rvq(tmp_path / "e.rvq", torch.zeros(4, 0, dtype=torch.long), header(1024))
    codes, head = read_rvq(path)
    assert codes.shape == (4, 0) and head["n_frames"] == 0


def test_write_refuses_bad_codes(tmp_path):
    with pytest.raises(ValueError, match="0..1023"):
        write_rvq(tmp_path / "x.rvq", torch.tensor([[1024]]), header(1024))
    with pytest.raises(ValueError, match="\\[N_c, T\\]"):
        write_rvq(tmp_path / "x.rvq", torch.zeros(2, 3, 4, dtype=torch.long), header(1024))
    with pytest.raises(ValueError, match="lacks"):
        write_rvq(tmp_path / "x.rvq", torch.zeros(2, 3, dtype=torch.long), {"codebook_size": 4})
    with pytest.raises(ValueError, match="integer codes"):
        write_rvq(tmp_path / "x.rvq", torch.zeros(2, 3), header(4))
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.fixture
def good(tmp_path):
    codes = torch.randint(0, 1000, (8, 50), generator=torch.Generator().manual_seed(1))
    return write_rvq(tmp_path / "good.rvq", codes, header(1000))


def test_truncated_file(good):
    data = good.read_bytes()
    good.write_bytes(data[:-3])
    with pytest.raises(RvqFileError, match="truncated: codes need"):
        read_rvq(good)
    good.write_bytes(data[:20])
    with pytest.raises(RvqFileError, match="truncated: header"):
        read_rvq(good)
    good.write_bytes(data[:5])
    with pytest.raises(RvqFileError, match="too short"):
        read_rvq(good)


def test_garbled_files(good):
    data = bytearray(good.read_bytes())
    flipped = bytearray(data)
    flipped[-1] ^= 0xFF
    good.write_bytes(bytes(flipped))
    with pytest.raises(RvqFileError, match="checksum"):
        read_rvq(good)
    good.write_bytes(b"RIFF" + bytes(data[4:]))
    with pytest.raises(RvqFileError, match="bad magic"):
        read_rvq(good)
    head_len = struct.unpack_from("<I", data, 10)[0]
    garbled = bytearray(data)
    garbled[14:16] = b"\xff\xfe"
    good.write_bytes(bytes(garbled))
    with pytest.raises(RvqFileError, match="garbled header"):
        read_rvq(good)
    good.write_bytes(bytes(data) + b"\x00")
    with pytest.raises(RvqFileError, match="unexpected bytes"):
        read_rvq(good)
    head = json.loads(bytes(data[14 : 14 + head_len]))
    head["n_frames"] = 51
    new_head = json.dumps(head).encode()
    good.write_bytes(bytes(data[:10]) + struct.pack("<I", len(new_head)) + new_head + bytes(data[14 + head_len :]))
    with pytest.raises(RvqFileError, match="inconsistent header"):
        read_rvq(good)


def test_unknown_version(good):
    data = bytearray(good.read_bytes())
    struct.pack_into("<H", data, len(MAGIC), 9)
    good.write_bytes(bytes(data))
    with pytest.raises(RvqFileError, match="unsupported .rvq version 9"):
        read_rvq(good)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_rvq(tmp_path / "none.rvq")
