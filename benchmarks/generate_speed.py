"""Generation speed on the models users run, per frame against each model's memory-bandwidth bound.

    .venv/bin/python benchmarks/generate_speed.py [--lm models/lm-speech-16k] [--frames 250] [--repeats 5]
        [--dtype both] [--cond-lm models/lm-speech-conditioned-16k] [--masked-lm models/lm-masked-speech-16k]
        [--threads 1] [--json out.json]
    .venv/bin/python benchmarks/generate_speed.py --synthetic [--frames 1500] [--batches 1 8] [--dtype int8]

Default (issue 40): the saved AR LM `--lm` (the shipped one), float32 and its int8 form (lm.int8.to_int8, what
`rvqlm export-lm --dtype int8` stores), `--frames` frames from bos at batch 1, top-k 250, seed 0, with the
fast cached step (lm.decode_step) and with the reference step through the model's forward (the same tokens),
alternated `--repeats` times in this process, medians. Each against its bandwidth bound: (weights a step
reads + the mean KV cache it attends over) / the measured copy bandwidth (benchmarks/step_profile.py), and
what each part of a step costs per frame, timed where it runs. Then the conditioned LM at --cfg (2 rows a
step: conditional and null) the same way, and the masked LM (its default decoding) end to end.

--synthetic: the benchmark before issue 40, on a model it builds. Model: a randomly initialised ~20M-parameter MultiCodebookLM (N_c = 8 codebooks of 1024, d = 512,
4 layers, SwiGLU, RoPE, delay pattern), i.e. tokens of a 50 frames/s codec. Random weights decode
as fast as trained ones: every step does the same work whatever the logits are.

* cache: `lm.generate.generate` from bos for `--frames` frames (delay pattern: frames + 7 steps),
  sampling with temperature 1 and top-k 250, measured end to end, at each batch size.
* recompute: the same steps without a cache cost one full forward over the whole prefix each.
  Running all of them is ~1,500 forwards of up to 1,507 positions (tens of minutes at batch 8 on a
  2-core CPU), so by default they are MEASURED at a grid of prefix lengths, fitted by least squares
  with t(L) = a + b L + c L^2 (projections are linear in L, attention quadratic), and the fit is
  SUMMED over the real steps: an extrapolation, labelled as such in the output. The fit is checked
  against a real `generate(use_cache=False)` run of `--check-frames` frames after a long prompt.
  `--exact-recompute` runs the real thing instead.
* bandwidth bound: at batch 1 a step must read every weight used in a matrix product once (the
  embedding tables are gathers: 8 rows) plus the cached keys and values, so its latency is at
  least (weight bytes + KV bytes) / memory bandwidth. The bandwidth is measured here as the best
  of a few large tensor copies, counting bytes read + bytes written.

* --dtype int8: the same model's linear layers and heads in int8 (lm.int8.to_int8), generated
  with the cache in the same process after the float32 rows, at each batch size: frames/s, the
  ratio to float32, and the bandwidth bound with int8 weights.

Real-time factor RTF = compute time / duration of the audio generated per sequence (< 1 is faster
than real time); frames/s are per sequence, with the batch's total alongside.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks/ is a package of the repository
    sys.path.insert(0, str(REPO))

from benchmarks.shipped_speed import shipped_main  # noqa: E402
from benchmarks.step_profile import copy_bandwidth, weight_bytes as step_weight_bytes  # noqa: E402
from lm import LMConfig, MultiCodebookLM
from lm.ar_decode import ARDecoding
from lm.generate import generate
from lm.sampling import SamplingOptions, sample_next

FRAME_RATE = 50


def bench_config(max_seq_len: int) -> LMConfig:
    return LMConfig(n_codebooks=8, codebook_size=1024, d_model=512, n_layers=4, n_heads=8, ffn="swiglu",
                    norm="rmsnorm", pos="rope", pattern="delay", max_seq_len=max_seq_len)


def time_cached(model: MultiCodebookLM, batch: int, frames: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one cached generation of `frames` frames on the model's device."""
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    generate(model, None, 16, sampling=SamplingOptions(top_k=250, seed=0), batch_size=batch)  # warm-up
    sync()
    t, c = time.perf_counter(), time.process_time()
    generate(model, None, frames, sampling=SamplingOptions(top_k=250, seed=0), batch_size=batch)
    sync()
    return time.perf_counter() - t, time.process_time() - c


@torch.inference_mode()
def recompute_step_time(model: MultiCodebookLM, batch: int, length: int, repeats: int = 2) -> float:
    """Seconds for one no-cache step at prefix length `length`: full forward + sampling the last position."""
    cfg = model.config
    tokens = torch.randint(0, cfg.codebook_size, (batch, cfg.n_codebooks, length))
    g = torch.Generator().manual_seed(0)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        logits = model(tokens)[:, :, -1]
        sample_next(logits, 1.0, 250, None, False, g)
        best = min(best, time.perf_counter() - t)
    return best


def fit_quadratic(lengths: list[int], seconds: list[float]) -> list[float]:
    x = torch.tensor(lengths, dtype=torch.float64)
    a = torch.stack([torch.ones_like(x), x, x * x], dim=1)
    coef = torch.linalg.lstsq(a, torch.tensor(seconds, dtype=torch.float64)[:, None]).solution.flatten()
    return coef.tolist()


def predicted_recompute(coef: list[float], first_len: int, last_len: int) -> float:
    """Sum of the fitted step time over prefix lengths first_len..last_len (one step each)."""
    x = torch.arange(first_len, last_len + 1, dtype=torch.float64)
    return float((coef[0] + coef[1] * x + coef[2] * x * x).sum())


def int8_rows(model: MultiCodebookLM, results: dict, frames: int, batches: list[int]) -> None:
    """Cached generation of `model` in int8 at each batch size, against the float32 rows in `results`."""
    from lm.int8 import to_int8

    from rvqlm_core.int8_linear import Int8Linear

    to_int8(model)  # int8 values, scales and biases of every linear layer and the heads, plus the norm gains
    weight_bytes = sum(t.numel() * t.element_size() for m in model.modules() if isinstance(m, Int8Linear)
                       for t in m.buffers())
    weight_bytes += sum(p.numel() * p.element_size() for p in [*model.blocks.parameters(), *model.final_norm.parameters()])
    steps = results["steps"]
    print(f"\nint8 (lm.int8: {weight_bytes / 2**20:.1f} MiB read per step, bandwidth bound for the weights "
          f"{weight_bytes / results['bandwidth_bytes_per_s'] * 1e3:.2f} ms)")
    print(f"{'batch':>5} {'float32 frames/s':>17} {'int8 frames/s':>14} {'ratio':>6} {'int8 ms/frame':>14} "
          f"{'ratio in CPU time':>18}")
    out = {"weight_bytes": weight_bytes, "batches": {}}
    for batch in batches:
        seconds, cpu = time_cached(model, batch, frames)
        base, base_cpu = results["batches"][str(batch)]["cache_s"], results["batches"][str(batch)]["cache_cpu_s"]
        print(f"{batch:>5} {frames / base:>17.1f} {frames / seconds:>14.1f} {base / seconds:>5.2f}x "
              f"{seconds / steps * 1e3:>14.2f} {base_cpu / cpu:>17.2f}x")
        out["batches"][str(batch)] = {"cache_s": seconds, "cache_cpu_s": cpu, "speedup": base / seconds,
                                      "speedup_cpu": base_cpu / cpu}
    results["int8"] = out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", action="store_true", help="time the model this script builds (the benchmark "
                    "before issue 40) instead of saved LMs")
    ap.add_argument("--lm", default=str(REPO / "models" / "lm-speech-16k"), help="a saved AR LM")
    ap.add_argument("--cond-lm", default=str(REPO / "models" / "lm-speech-conditioned-16k"),
                    help="a saved conditioned AR LM, timed at --cfg ('' to skip)")
    ap.add_argument("--masked-lm", default=str(REPO / "models" / "lm-masked-speech-16k"),
                    help="a saved masked LM ('' to skip)")
    ap.add_argument("--cfg", type=float, default=3.0, help="the conditioned LM's guidance scale")
    ap.add_argument("--repeats", type=int, default=5, help="alternated runs of each variant (medians)")
    ap.add_argument("--frames", type=int, default=None, help="frames per generation (default 250; --synthetic 1500)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--grid", type=int, nargs="+", default=[32, 256, 512, 1024, 1507],
                    help="prefix lengths at which a recompute step is measured")
    ap.add_argument("--check-frames", type=int, default=8,
                    help="real no-cache frames generated after a long prompt to check the fit (batch 1)")
    ap.add_argument("--exact-recompute", action="store_true", help="run every recompute step for real")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--dtype", choices=("float32", "int8", "both"), default=None,
                    help="saved LMs: float32, its int8 form, or both (default); --synthetic: int8 also times the "
                    "model in int8 after the float32 rows")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    args.frames = args.frames or (1500 if args.synthetic else 250)
    args.dtype = args.dtype or ("float32" if args.synthetic else "both")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = synthetic_main(args) if args.synthetic else shipped_main(args)
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(Path(args.json), results)
    return 0


def synthetic_main(args: argparse.Namespace) -> dict:
    """The benchmark of a model built here (see the module docstring): cache against recompute, the bound, int8."""

    torch.manual_seed(0)
    n_c = 8
    steps = args.frames + n_c - 1  # delay pattern
    model = MultiCodebookLM(bench_config(max_seq_len=max(2048, steps))).eval()
    params = model.num_parameters()
    weight_bytes = step_weight_bytes(model)
    audio_s = args.frames / FRAME_RATE
    print(f"model: {params / 1e6:.1f}M parameters (d=512, 4 layers, N_c=8, |V|=1024, RoPE, delay), "
          f"{weight_bytes / 2**20:.1f} MiB read per step; {args.frames} frames = {audio_s:.0f} s of audio at "
          f"{FRAME_RATE} Hz = {steps} steps")
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads "
          f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    bandwidth = copy_bandwidth()
    print(f"memory bandwidth (tensor copy, read + write): {bandwidth / 1e9:.1f} GB/s")

    results = {"params": params, "weight_bytes": weight_bytes, "frames": args.frames, "steps": steps,
               "bandwidth_bytes_per_s": bandwidth, "threads": torch.get_num_threads(), "batches": {}}
    print()
    print(f"{'batch':>5} {'mode':<22} {'time s':>9} {'frames/s':>9} {'(all)':>8} {'RTF':>7}")
    for batch in args.batches:
        cached, cached_cpu = time_cached(model, batch, args.frames)
        if args.exact_recompute:
            t = time.perf_counter()
            generate(model, None, args.frames, sampling=SamplingOptions(top_k=250, seed=0),
                     options=ARDecoding(use_cache=False), batch_size=batch)
            recompute, how = time.perf_counter() - t, "recompute (measured)"
            coef = None
        else:
            grid = [min(length, steps) for length in args.grid]
            measured = [recompute_step_time(model, batch, length) for length in grid]
            coef = fit_quadratic(grid, measured)
            recompute, how = predicted_recompute(coef, 1, steps), "recompute (fit, summed)"
        row = {"cache_s": cached, "cache_cpu_s": cached_cpu, "recompute_s": recompute, "recompute_extrapolated": not args.exact_recompute,
               "ratio": recompute / cached}
        for mode, seconds in (("KV cache (measured)", cached), (how, recompute)):
            fps = args.frames / seconds
            print(f"{batch:>5} {mode:<22} {seconds:>9.2f} {fps:>9.1f} {fps * batch:>8.1f} {seconds / audio_s:>7.3f}")
        print(f"{batch:>5} recompute / cache = {recompute / cached:.1f}x; the cached run used {cached_cpu:.2f} s of "
              f"CPU (RTF {cached_cpu / audio_s:.3f} in CPU time: what an unshared machine would give)")
        if coef is not None:
            row["recompute_fit"] = {"grid": grid, "step_s": measured, "coef_a_b_c": coef}
            print(f"      recompute step fit t(L) = {coef[0] * 1e3:.2f} ms + {coef[1] * 1e6:.2f} us L + "
                  f"{coef[2] * 1e9:.3f} ns L^2 over L in {grid}")
        results["batches"][str(batch)] = row

    if not args.exact_recompute and args.check_frames > 0 and 1 in args.batches:
        # Check the fit where it matters most (long prefixes): real no-cache steps after a long prompt.
        t0 = steps - args.check_frames - n_c + 1
        prompt = torch.randint(0, 1024, (1, n_c, t0))
        t = time.perf_counter()
        generate(model, prompt, args.check_frames, sampling=SamplingOptions(top_k=250, seed=0),
                 options=ARDecoding(use_cache=False))
        real = time.perf_counter() - t
        coef = results["batches"]["1"]["recompute_fit"]["coef_a_b_c"]
        fit = predicted_recompute(coef, t0 + 1, steps)
        print(f"fit check (batch 1): {args.check_frames + n_c - 1} real no-cache steps at prefix "
              f"{t0 + 1}..{steps} took {real:.2f} s, the fit says {fit:.2f} s ({real / fit:.2f}x)")
        results["fit_check"] = {"real_s": real, "fit_s": fit}

    # Per-frame latency at batch 1 against the memory-bandwidth bound (steady state: 1 frame = 1 step).
    if "1" in results["batches"]:
        cfg = model.config
        mean_context = (steps + 1) / 2
        kv_bytes = 2 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * 4 * mean_context  # K and V, fp32
        step = results["batches"]["1"]["cache_s"] / steps
        step_cpu = results["batches"]["1"]["cache_cpu_s"] / steps
        bound_w = weight_bytes / bandwidth
        bound = (weight_bytes + kv_bytes) / bandwidth
        print(f"\nbatch 1 latency per frame: {step * 1e3:.2f} ms; bandwidth bound {bound * 1e3:.2f} ms "
              f"(weights {weight_bytes / 2**20:.1f} MiB + mean KV cache {kv_bytes / 2**20:.1f} MiB at "
              f"{bandwidth / 1e9:.1f} GB/s; weights alone {bound_w * 1e3:.2f} ms): {step / bound:.1f}x the bound "
              f"(CPU time per frame {step_cpu * 1e3:.2f} ms, {step_cpu / bound:.1f}x)")
        results["latency"] = {"step_s": step, "step_cpu_s": step_cpu, "bound_s": bound, "bound_weights_only_s": bound_w,
                              "kv_bytes_mean": kv_bytes}
    if args.dtype == "int8":
        int8_rows(model, results, args.frames, args.batches)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
