"""Training-step speed of the LM on this machine: tokens/s and MFU against the measured fp32 peak.

One step = forward + loss + backward + AdamW update (the LightningModule's step without Lightning)
of a ~20M-parameter delay-pattern MultiCodebookLM on windows of T = 1,500 frames, N_c = 8,
|V| = 1024. The fp32 matmul peak is measured in the same run with the same thread count
(`lm.training.measure_matmul_peak`); MFU = model training FLOPs per second / that peak, where the
model's FLOPs are `MultiCodebookLM.flops_per_token` (6 N + 12 L d S per position, PaLM's
convention). Each configuration reports the median of several timed steps after warm-up steps.

    python benchmarks/lm_train_speed.py                      # default: fp32, eager, all threads
    python benchmarks/lm_train_speed.py --sweep              # threads x precision x torch.compile
    python benchmarks/lm_train_speed.py --threads 1 --precision bf16 --compile
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from lm import LMConfig, MultiCodebookLM
from lm.training import decay_groups, measure_matmul_peak

MODEL_20M = dict(n_codebooks=8, codebook_size=1024, d_model=384, n_layers=8, n_heads=6, ffn="swiglu",
                 norm="rmsnorm", pos="rope", pattern="delay", max_seq_len=1536)


def build(frames: int, **overrides) -> MultiCodebookLM:
    """The benchmark's ~20M-parameter LM (`overrides`: LMConfig fields, e.g. a tiny model for checks)."""
    cfg = LMConfig(**{**MODEL_20M, **overrides})
    if frames > cfg.max_frames:
        raise SystemExit(f"--frames must be <= {cfg.max_frames} for this model")
    return MultiCodebookLM(cfg)


def time_steps(frames: int, batch: int, threads: int, precision: str, compile_model: bool, warmup: int,
               steps: int, seed: int = 0, *, device: str = "cpu", model: dict | None = None,
               peak_dtype: torch.dtype = torch.float32, peak_n: int = 2048, compile_backend: str = "inductor") -> dict:
    """Median step time, tokens/s and MFU of `build(frames, **model)` on `device`, against the
    `peak_dtype` matmul peak measured there right before the timed steps."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    dev = torch.device(device)
    model = build(frames, **(model or {})).to(dev).train()
    optimizer = torch.optim.AdamW(decay_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.95), fused=True)  # as in training
    cfg = model.config
    codes = torch.randint(0, cfg.codebook_size, (batch, cfg.n_codebooks, frames), device=dev)
    mask = torch.ones(batch, frames, dtype=torch.bool, device=dev)
    loss_fn = torch.compile(model.loss, backend=compile_backend) if compile_model else model.loss
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step() -> float:
        t0 = time.perf_counter()
        with autocast:
            out = loss_fn(codes, mask)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0

    first = [step() for _ in range(warmup)]
    peak = measure_matmul_peak(peak_dtype, n=peak_n, device=dev)  # right before the timed steps, same threads
    times = [step() for _ in range(steps)]
    positions = model.pattern.sequence_length(frames)
    flops = model.flops_per_token(positions) * batch * positions
    dt = statistics.median(times)
    return {"threads": threads, "precision": precision, "compile": compile_model, "params": model.num_parameters(),
            "first_step_s": first[0] if first else float("nan"), "step_s": dt, "step_spread": (min(times), max(times)),
            "tokens_per_s": batch * frames * cfg.n_codebooks / dt, "gflops": flops / dt / 1e9,
            "peak_gflops": peak / 1e9, "mfu": flops / dt / peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=1500)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--compile", action="store_true", help="torch.compile the loss (inductor, CPU)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--sweep", action="store_true", help="all threads x precision x compile combinations")
    args = p.parse_args()

    if args.sweep:
        thread_options = sorted({1, torch.get_num_threads()})
        configs = list(itertools.product(thread_options, ("fp32", "bf16"), (False, True)))
    else:
        configs = [(args.threads, args.precision, args.compile)]
    model = build(args.frames)
    print(f"MultiCodebookLM {model.num_parameters() / 1e6:.1f}M parameters "
          f"({model.num_parameters(exclude_embeddings=True) / 1e6:.1f}M without embedding tables), "
          f"T={args.frames} frames x N_c=8, batch {args.batch}, "
          f"{model.flops_per_token(model.pattern.sequence_length(args.frames)) / 1e6:.0f} MFLOP/position (fwd+bwd); "
          f"median of {args.steps} steps after {args.warmup} warm-up")
    del model
    header = (f"{'threads':>7} {'precision':>9} {'compile':>7} {'step s':>7} {'(min-max)':>13} {'tokens/s':>9} "
              f"{'GFLOP/s':>8} {'fp32 peak':>9} {'MFU':>6}")
    print(header)
    print("-" * len(header))
    for threads, precision, compile_model in configs:
        try:
            r = time_steps(args.frames, args.batch, threads, precision, compile_model, args.warmup, args.steps)
        except Exception as e:  # e.g. no C++ compiler for inductor: report and go on
            print(f"{threads:>7} {precision:>9} {str(compile_model):>7}  failed: {type(e).__name__}: {e}"[:200])
            continue
        lo, hi = r["step_spread"]
        print(f"{threads:>7} {precision:>9} {str(compile_model):>7} {r['step_s']:7.2f} {f'{lo:.2f}-{hi:.2f}':>13} "
              f"{r['tokens_per_s']:9.0f} {r['gflops']:8.1f} {r['peak_gflops']:9.1f} {100 * r['mfu']:5.1f}%", flush=True)


if __name__ == "__main__":
    main()
