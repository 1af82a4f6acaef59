"""Codec training-step time on this machine: SEANet decoder vs the iSTFT decoder, in one process.

    .venv/bin/python benchmarks/codec_train_speed.py [--threads 1] [--steps 7] [--batch 8] [--seconds 1.0]

Each configuration runs the real training computation of `recipes/codec_speech.yaml`
(encoder, RVQ with EMA updates, decoder, multi-scale mel + waveform L1 + commitment, backward,
AdamW step) on random audio of the recipe's batch shape; the first step (k-means init, allocator
warm-up) is left out and the median of the others is reported, with each configuration's ratio to
the SEANet decoder run in the same process (this machine is shared and noisy: compare ratios).
The discriminator is timed on its own (`--disc`), as the adversarial part of a step: the
multi-scale STFT one (FFT sizes 1024 / 512 / 256) at 32 and 8 filters.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from codec import Codec, CodecConfig
from codec.neural.istft_decoder import ISTFTDecoderConfig
from codec.neural.losses import MultiScaleMelLoss, waveform_l1
from codec.neural.seanet import SEANetDecoderConfig

CONFIGS = {  # CodecConfig keyword arguments
    "seanet (channels 32)": dict(decoder=SEANetDecoderConfig()),
    "istft dim 256 x 8": dict(decoder=ISTFTDecoderConfig(dim=256)),
    "istft dim 384 x 8 (stage 8)": dict(decoder=ISTFTDecoderConfig()),
    "istft dim 512 x 8": dict(decoder=ISTFTDecoderConfig(dim=512)),
}


def time_codec_steps(config: CodecConfig, wav: torch.Tensor, steps: int, device: str = "cpu") -> list[float]:
    """Seconds of each of `steps` training steps on `wav` [B, C, S] after one left out (k-means init)."""
    torch.manual_seed(0)
    codec = Codec(config).to(device).train()
    mel = MultiScaleMelLoss(config.sample_rate, (256, 512, 1024, 2048), (40, 80, 160, 320)).to(device)
    opt = torch.optim.AdamW(codec.parameters(), 6e-4)
    wav = wav.to(device)
    sync = torch.cuda.synchronize if wav.is_cuda else (lambda: None)
    times = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        out = codec(wav)
        loss = 15 * mel(out.audio, wav) + waveform_l1(out.audio, wav) + out.quantizer.commit_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t)
    return times[1:]


def time_discriminator(wav: torch.Tensor, steps: int, **settings) -> list[float]:
    """One discriminator update and one generator-side pass (hinge + feature matching), as in training."""
    from codec.core.discriminator import (CodecDiscriminator, discriminator_hinge_loss, feature_matching_loss,
                                          generator_hinge_loss)
    disc = CodecDiscriminator(channels=wav.shape[1], **settings)
    fake = (torch.randn_like(wav) * 0.1).requires_grad_()
    times = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        real_logits, _ = disc(wav)
        fake_logits, _ = disc(fake.detach())
        discriminator_hinge_loss(real_logits, fake_logits).backward()
        with torch.no_grad():
            _, real_features = disc(wav)
        fake_logits, fake_features = disc(fake)
        (generator_hinge_loss(fake_logits) + feature_matching_loss(real_features, fake_features)).backward()
        times.append(time.perf_counter() - t)
    return times[1:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=7, help="timed steps per configuration (after one warm-up)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seconds", type=float, default=1.0, help="crop length")
    p.add_argument("--disc", action="store_true", help="also time the MS-STFT discriminator")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    wav = torch.randn(args.batch, 1, int(16000 * args.seconds)) * 0.1
    audio_s = args.batch * args.seconds
    print(f"{args.batch} x {args.seconds} s crops ({audio_s:.0f} s of audio) per step, {args.threads} thread(s), "
          f"median of {args.steps} steps")
    base = None
    for name, kw in CONFIGS.items():
        config = CodecConfig(**kw)
        med = statistics.median(time_codec_steps(config, wav, args.steps))
        base = base or med
        params = sum(p.numel() for p in Codec(config).decoder.parameters()) / 1e6
        print(f"{name:<30} decoder {params:5.2f} M params  {med:6.3f} s/step  {audio_s / med:6.1f} s audio/s  "
              f"x{base / med:.2f} vs seanet", flush=True)
    if args.disc:
        discriminators = {f"MS-STFT, {f} filters": dict(filters=f) for f in (32, 8)}
        for name, settings in discriminators.items():
            med = statistics.median(time_discriminator(wav, max(2, args.steps // 3), **settings))
            print(f"{name + ' discriminator':<40} {'':>11}  {med:6.3f} s/step  (x{med / base:.1f} a SEANet codec step)",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
