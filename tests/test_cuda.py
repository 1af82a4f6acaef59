"""What only a GPU can check: device moves of the codec and the LM, bf16 autocast, tokenizing on
CUDA, and Lightning DDP on one GPU. Marked `cuda` (scripts/device_check.sh runs `-m cuda`); every
test skips without CUDA. Needs only a stock CUDA PyTorch image's packages (no soundfile)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from codec import Codec, CodecConfig
from lm import LMConfig, MultiCodebookLM
from lm.generate import generate

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

@pytest.fixture(autouse=True)
def _full_fp32():
    """Compare with the CPU in full fp32: no TF32 convolutions or matmuls (cuDNN's default allows them)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


TINY_LM = dict(n_codebooks=3, codebook_size=16, d_model=32, n_layers=2, n_heads=2, max_seq_len=64, pattern="delay")


def _tiny_lm() -> MultiCodebookLM:
    torch.manual_seed(0)
    return MultiCodebookLM(LMConfig(**TINY_LM)).eval()


def test_lm_moves_to_cuda_with_the_same_loss_and_cached_greedy_decoding():
    model = _tiny_lm()
    codes = torch.randint(0, 16, (2, 3, 40))
    mask = torch.ones(2, 40, dtype=torch.bool)
    with torch.no_grad():
        cpu = model.loss(codes, mask).loss
        gpu_model = model.to("cuda")
        gpu = gpu_model.loss(codes.cuda(), mask.cuda()).loss
    assert gpu.device.type == "cuda" and gpu_model.device.type == "cuda"
    assert abs(cpu.item() - gpu.item()) < 1e-4 * abs(cpu.item())
    cached = generate(gpu_model, None, 20, greedy=True, batch_size=2)
    plain = generate(gpu_model, None, 20, greedy=True, batch_size=2, use_cache=False)
    assert cached.device.type == "cuda" and cached.shape == (2, 3, 20)
    assert torch.equal(cached, plain)


def test_bf16_autocast_keeps_the_lm_loss_and_gives_finite_gradients():
    model = _tiny_lm().cuda().train()
    codes = torch.randint(0, 16, (4, 3, 48), device="cuda")
    mask = torch.ones(4, 48, dtype=torch.bool, device="cuda")
    with torch.no_grad():
        fp32 = model.loss(codes, mask).loss.item()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model.loss(codes, mask)
    out.loss.backward()
    assert abs(out.loss.item() - fp32) < 0.02 * fp32
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_codec_moves_to_cuda_and_codes_and_audio_agree_with_the_cpu():
    torch.manual_seed(0)
    codec = Codec(CodecConfig()).eval()
    wav = torch.randn(2, 1, 16000) * 0.1
    with torch.no_grad():
        codes = codec.encode(wav)
        audio = codec.decode(codes)
        codec = codec.to("cuda")
        gpu_codes = codec.encode(wav.cuda())
        gpu_audio = codec.decode(codes.cuda())
    assert codec.device.type == "cuda" and gpu_codes.device.type == "cuda"
    assert (gpu_codes.cpu() == codes).float().mean() > 0.99  # other kernels' rounding may flip a rare code
    assert (gpu_audio.cpu() - audio).abs().max() < 1e-2 * audio.abs().max()


def _write_wav(path: Path, samples: np.ndarray, rate: int = 16000) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def test_tokenizing_on_cuda_gives_the_cpu_tokens(tmp_path):
    from codec.distributed_tokenize import Launch, tokenize
    from codec.tokenize import TokenizeSettings
    from rvqlm_core.token_shards import TokenShards

    rng = np.random.default_rng(0)
    (tmp_path / "audio").mkdir()
    for i in range(3):
        _write_wav(tmp_path / "audio" / f"{i}.wav", rng.normal(0, 0.1, 8000 * (i + 1)))
    torch.manual_seed(0)
    codec = Codec(CodecConfig()).eval()
    settings = TokenizeSettings(workers=0, progress=False)
    tokenize(tmp_path / "audio", tmp_path / "cpu", codec, settings, Launch())
    tokenize(tmp_path / "audio", tmp_path / "gpu", codec.to(Launch().device("cuda")), settings, Launch())
    cpu, gpu = TokenShards.open(tmp_path / "cpu"), TokenShards.open(tmp_path / "gpu")
    assert sorted(e.path for e in cpu.entries) == sorted(e.path for e in gpu.entries) == ["0.wav", "1.wav", "2.wav"]
    for e in cpu.entries:
        a, b = cpu.read(e), gpu.read(e.path)
        assert a.shape == b.shape and (a == b).mean() > 0.99


def test_lightning_ddp_on_one_gpu_trains_in_bf16(tmp_path):
    import lightning.pytorch as pl

    from lm.data import TokenDataModule
    from lm.training import LMTrainingModule
    from test_lm_data import make_token_corpus

    make_token_corpus(tmp_path / "tokens")
    data = TokenDataModule(str(tmp_path / "tokens"), window_frames=32, batch_size=4, batches_per_epoch=8)
    layout = ("n_codebooks", "codebook_size")  # given by the tokens, as LightningCLI links them
    module = LMTrainingModule(LMConfig(**{k: v for k, v in TINY_LM.items() if k not in layout}), n_codebooks=3,
                              codebook_size=16, codec_fingerprint=data.codec_fingerprint, lr=1e-2, warmup_steps=1,
                              export=False)
    before = [p.detach().clone() for p in module.model.parameters()]
    trainer = pl.Trainer(accelerator="gpu", devices=1, strategy="ddp", precision="bf16-mixed", max_steps=4,
                         limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path / "run"))
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 4 and trainer.world_size == 1
    assert module.matmul_peak and module.matmul_peak > 0  # measured on the GPU at fit start
    after = list(module.model.parameters())
    assert all(a.device.type == "cuda" for a in after)
    assert any(not torch.equal(b.cuda(), a.detach()) for b, a in zip(before, after))
    assert all(torch.isfinite(a).all() for a in after)
