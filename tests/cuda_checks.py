"""The GPU checks as plain functions of a device, needing no pytest: tests/test_cuda.py runs them
under pytest on CUDA (marker `cuda`), benchmarks/device_check.py runs them directly where pytest is
not installed (a stock CUDA PyTorch image), and on "cpu" they check their own logic without a GPU.

Each `check(device, tmp_path)` raises AssertionError when the property fails: device moves of the
codec and LM agree with the CPU, bf16 autocast keeps the LM loss, tokenizing on the device gives the
CPU's tokens, Lightning DDP trains on one device in bf16.
"""

from __future__ import annotations

import contextlib
import wave
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from codec import Codec, CodecConfig
from lm import LMConfig, MultiCodebookLM
from lm.ar_decode import ARDecoding
from lm.generate import generate
from lm.sampling import SamplingOptions

TINY_LM = dict(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=2, max_seq_len=64, pattern="delay")


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """Compare with the CPU in full fp32: no TF32 convolutions or matmuls (cuDNN's default allows them)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _tiny_lm() -> MultiCodebookLM:
    torch.manual_seed(0)
    return MultiCodebookLM(LMConfig(**TINY_LM)).eval()


def lm_moves_with_the_same_loss_and_cached_greedy_decoding(device: str, tmp_path: Path) -> None:
    model = _tiny_lm()
    codes = torch.randint(0, 16, (2, 3, 40))
    mask = torch.ones(2, 40, dtype=torch.bool)
    with torch.no_grad():
        cpu = model.loss(codes, mask).loss
        moved = model.to(device)
        there = moved.loss(codes.to(device), mask.to(device)).loss
    assert there.device == moved.device and moved.device.type == torch.device(device).type
    assert abs(cpu.item() - there.item()) < 1e-4 * abs(cpu.item())
    cached = generate(moved, None, 20, sampling=SamplingOptions(greedy=True), batch_size=2)
    plain = generate(moved, None, 20, sampling=SamplingOptions(greedy=True), options=ARDecoding(use_cache=False),
                     batch_size=2)
    assert cached.device == moved.device and cached.shape == (2, 3, 20)
    assert torch.equal(cached, plain)


def bf16_autocast_keeps_the_lm_loss_and_gives_finite_gradients(device: str, tmp_path: Path) -> None:
    model = _tiny_lm().to(device).train()
    codes = torch.randint(0, 16, (4, 3, 48), device=device)
    mask = torch.ones(4, 48, dtype=torch.bool, device=device)
    with torch.no_grad():
        fp32 = model.loss(codes, mask).loss.item()
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        out = model.loss(codes, mask)
    out.loss.backward()
    assert abs(out.loss.item() - fp32) < 0.02 * fp32
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def codec_moves_and_codes_and_audio_agree_with_the_cpu(device: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    codec = Codec(CodecConfig()).eval()
    wav = torch.randn(2, 1, 16000) * 0.1
    with torch.no_grad():
        codes = codec.encode(wav)
        audio = codec.decode(codes)
        codec = codec.to(device)
        there_codes = codec.encode(wav.to(device))
        there_audio = codec.decode(codes.to(device))
    assert codec.device.type == torch.device(device).type and there_codes.device == codec.device
    assert (there_codes.cpu() == codes).float().mean() > 0.99  # other kernels' rounding may flip a rare code
    assert (there_audio.cpu() - audio).abs().max() < 1e-2 * audio.abs().max()


def _write_wav(path: Path, samples: np.ndarray, rate: int = 16000) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def tokenizing_gives_the_cpu_tokens(device: str, tmp_path: Path) -> None:
    from codec.tokenize.distributed import Launch, tokenize
    from codec.tokenize.folder import TokenizeSettings
    from rvqlm_core.token_shards import TokenShards

    rng = np.random.default_rng(0)
    (tmp_path / "audio").mkdir()
    for i in range(3):
        _write_wav(tmp_path / "audio" / f"{i}.wav", rng.normal(0, 0.1, 8000 * (i + 1)))
    torch.manual_seed(0)
    codec = Codec(CodecConfig()).eval()
    settings = TokenizeSettings(workers=0, progress=False)
    tokenize(tmp_path / "audio", tmp_path / "cpu", codec, settings, Launch())
    tokenize(tmp_path / "audio", tmp_path / "device", codec.to(device), settings, Launch())
    cpu, there = TokenShards.open(tmp_path / "cpu"), TokenShards.open(tmp_path / "device")
    assert sorted(e.path for e in cpu.entries) == sorted(e.path for e in there.entries) == ["0.wav", "1.wav", "2.wav"]
    for e in cpu.entries:
        a, b = cpu.read(e), there.read(e.path)
        assert a.shape == b.shape and (a == b).mean() > 0.99


def _token_corpus(out: Path) -> None:
    """A random 3 x 16 token folder with train/ and valid/ files."""
    from rvqlm_core.shard_writer import write_token_corpus

    rng = np.random.default_rng(0)
    arrays = {f"{split}/f{i:02d}.wav": rng.integers(0, 16, (int(rng.integers(40, 120)), 3))
              for split, n in (("train", 12), ("valid", 4)) for i in range(n)}
    meta = dict(fingerprint="5a" * 32, n_codebooks=3, codebook_size=16, frame_rate=50.0, sample_rate=16000,
                codec_config={"synthetic": True})
    write_token_corpus(out, arrays, meta, shard_frames=500)


def lightning_ddp_trains_on_one_device_in_bf16(device: str, tmp_path: Path) -> None:
    import lightning.pytorch as pl

    from lm.data import TokenDataModule
    from lm.training import LMTrainingModule

    _token_corpus(tmp_path / "tokens")
    data = TokenDataModule(str(tmp_path / "tokens"), window_frames=32, batch_size=4, batches_per_epoch=8)
    layout = ("n_codebooks", "codebook_size")  # given by the tokens, as LightningCLI links them
    module = LMTrainingModule(LMConfig(**{k: v for k, v in TINY_LM.items() if k not in layout}), n_codebooks=3,
                              codebook_size=16, codec_fingerprint=data.codec_fingerprint, lr=1e-2, warmup_steps=1,
                              export=False)
    before = [p.detach().clone() for p in module.model.parameters()]
    cuda = torch.device(device).type == "cuda"
    trainer = pl.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, strategy="ddp", precision="bf16-mixed",
                         max_steps=4, limit_val_batches=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path / "run"))
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 4 and trainer.world_size == 1
    assert module.matmul_peak and module.matmul_peak > 0  # measured on the device at fit start
    after = list(module.model.parameters())
    assert all(a.device.type == torch.device(device).type for a in after)
    assert any(not torch.equal(b.to(a.device), a.detach()) for b, a in zip(before, after))
    assert all(torch.isfinite(a).all() for a in after)


CHECKS = [lm_moves_with_the_same_loss_and_cached_greedy_decoding,
          bf16_autocast_keeps_the_lm_loss_and_gives_finite_gradients,
          codec_moves_and_codes_and_audio_agree_with_the_cpu,
          tokenizing_gives_the_cpu_tokens,
          lightning_ddp_trains_on_one_device_in_bf16]
