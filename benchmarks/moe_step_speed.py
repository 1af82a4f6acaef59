"""Training-step speed of a dense LM against mixtures of experts with the same active FFN parameters
per position, in one process (rounds interleaved, so a busy machine slows each alike).

    .venv/bin/python benchmarks/moe_step_speed.py [--threads 1] [--rounds 5] [--steps 3] [--json out.json]

Models (docs/experiments.md, "Mixture of experts"): d = 128, 4 layers, 4 heads, SwiGLU, delay
pattern, N_c = 8, |V| = 1024; dense d_ff = 352; MoE 4 experts top-1 of d_ff 352 each; MoE 4
experts top-2 of d_ff 176 each. One step = forward + loss (+ the balance loss) + backward + fused
AdamW on a batch of 8 windows of 150 frames, as `rvqlm train-lm` runs it without Lightning. Each
round times `--steps` steps of every model; the medians over all rounds are reported, on the wall
clock and in this thread's CPU time (which a busy machine inflates less).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from lm import LMConfig, MultiCodebookLM
from lm.moe import moe_aux_loss
from lm.training import decay_groups

BASE = dict(n_codebooks=8, codebook_size=1024, d_model=128, n_layers=4, n_heads=4, max_seq_len=160,
            pattern="delay", ffn="swiglu")
MODELS = {"dense": dict(d_ff=352), "moe4-top1": dict(n_experts=4, moe_top_k=1, d_ff=352),
          "moe4-top2": dict(n_experts=4, moe_top_k=2, d_ff=176)}


def stepper(overrides: dict, batch: int, frames: int, seed: int = 0):
    """A closure running one training step of the model; returns (wall s, CPU s)."""
    torch.manual_seed(seed)
    model = MultiCodebookLM(LMConfig(**{**BASE, **overrides})).train()
    optimizer = torch.optim.AdamW(decay_groups(model, 0.1), lr=1e-3, fused=True)
    codes = torch.randint(0, 1024, (batch, 8, frames), generator=torch.Generator().manual_seed(seed))

    def step() -> tuple[float, float]:
        t, c = time.perf_counter(), time.thread_time()
        loss = model.loss(codes).loss
        aux = moe_aux_loss(model)
        (loss if aux is None else loss + 0.01 * aux).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t, time.thread_time() - c

    active = model.flops_per_token(1) // 6  # matrix parameters a position runs (+ 2 L d for S = 1)
    return step, model.num_parameters(), active


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = {name: stepper(o, args.batch, args.frames) for name, o in MODELS.items()}
    for step, _, _ in steps.values():
        step()  # warm-up
    times = {name: [] for name in MODELS}
    for _ in range(args.rounds):
        for name, (step, _, _) in steps.items():
            times[name] += [step() for _ in range(args.steps)]
    tokens = args.batch * args.frames * 8
    base = None
    print(f"{'model':<10} {'params':>8} {'active':>8} {'step s':>7} {'CPU s':>7} {'tokens/s':>9} {'CPU tokens/s':>13} {'vs dense':>9}")
    out = {}
    for name, (_, params, active) in steps.items():
        wall = statistics.median(t[0] for t in times[name])
        cpu = statistics.median(t[1] for t in times[name])
        base = base or cpu
        out[name] = {"params": params, "active_matrix_params": active, "step_s": wall, "step_cpu_s": cpu,
                     "tokens_per_s": tokens / wall, "cpu_tokens_per_s": tokens / cpu}
        print(f"{name:<10} {params / 1e6:7.2f}M {active / 1e6:7.2f}M {wall:7.3f} {cpu:7.3f} {tokens / wall:9.0f} "
              f"{tokens / cpu:13.0f} {cpu / base:8.2f}x")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(Path(args.json), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
