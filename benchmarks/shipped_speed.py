"""benchmarks/generate_speed.py on saved LMs (the default since issue 40): see that script's docstring."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.step_profile import (copy_bandwidth, cpu_description, kv_bytes, matvec_bandwidth, part_profile,
                                    weight_bytes)
from lm import load_lm
from lm.ar_decode import ARDecoding
from lm.conditioning import Condition
from lm.generate import generate
from lm.int8 import to_int8
from lm.sampling import SamplingOptions

FRAME_RATE = 50
TEXT, SPEAKER = "Co je to za divnou loď?", "font_small"  # a test line of the shipped conditioned LM's corpus


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def alternate(runs: dict[str, object], repeats: int) -> dict[str, float]:
    """Each of `runs` (name -> callable) once per round, `repeats` rounds after a warm-up round -> median seconds."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def print_parts(title: str, parts: dict[str, float], bandwidth: float, model, rows: int, context: float,
                source_len: int = 0) -> None:
    """One column of per-frame costs with the weight and KV bytes a step reads at the bandwidth."""
    w, kv = weight_bytes(model), kv_bytes(model, rows, context, source_len)
    print(f"\n{title}: ms per frame, each part timed where it runs (weights {w / 2**20:.1f} MiB = "
          f"{w / bandwidth * 1e3:.3f} ms, mean KV {kv / 2**20:.2f} MiB = {kv / bandwidth * 1e3:.3f} ms at the copy "
          "bandwidth)")
    for name, seconds in parts.items():
        print(f"  {name:<52} {seconds * 1e3:7.3f}")


def ar_rows(args, bandwidth: float, results: dict) -> None:
    """The AR LM, float32 and int8, fast and reference steps, alternated; bounds and part profiles."""
    models = {}
    if args.dtype in ("float32", "both"):
        models["float32"] = load_lm(args.lm).eval()
    if args.dtype in ("int8", "both"):
        models["int8"] = to_int8(load_lm(args.lm))
    sampling = SamplingOptions(top_k=250, seed=0)
    runs = {f"{dtype} {path}": (lambda m=m, fast=fast: generate(m, None, args.frames, sampling=sampling,
                                                                 options=ARDecoding(fast=fast)))
            for dtype, m in models.items() for path, fast in (("fast", True), ("reference", False))}
    medians = alternate(runs, args.repeats)
    steps = args.frames + next(iter(models.values())).config.n_codebooks - 1
    context = (steps + 1) / 2
    print(f"\nAR LM {args.lm}: {args.frames} frames from bos ({steps} steps), batch 1, top-k 250, medians of "
          f"{args.repeats} alternated runs")
    print(f"{'variant':<18} {'ms/frame':>9} {'frames/s':>9} {'bound ms':>9} {'x bound':>8} {'x reference':>12}")
    out = {}
    for name, seconds in medians.items():
        dtype, path = name.split()
        bound = (weight_bytes(models[dtype]) + kv_bytes(models[dtype], 1, context)) / bandwidth
        per_frame = seconds / args.frames
        gain = medians[f"{dtype} reference"] / seconds
        print(f"{name:<18} {per_frame * 1e3:>9.3f} {1 / per_frame:>9.1f} {bound * 1e3:>9.3f} "
              f"{per_frame / bound:>7.2f}x {gain:>11.2f}x")
        out[name] = {"seconds": seconds, "frames_per_s": 1 / per_frame, "bound_s": bound, "x_bound": per_frame / bound}
    if len(models) == 2:
        ratio = medians["float32 fast"] / medians["int8 fast"]
        print(f"int8 / float32 frames/s (fast): {ratio:.2f}x; reference step: "
              f"{medians['float32 reference'] / medians['int8 reference']:.2f}x")
        out["int8_over_float32"] = ratio
    if "float32" in models:
        m = models["float32"]
        rate, bound = matvec_bandwidth(m), (weight_bytes(m) + kv_bytes(m, 1, context)) / bandwidth
        floor = weight_bytes(m) / rate
        print(f"float32 matrix-vector kernel (one F.linear over the step's stacked weights): {rate / 1e9:.1f} GB/s, "
              f"{rate / bandwidth:.2f} of the copy bandwidth; the float32 weights alone take {floor * 1e3:.3f} ms "
              f"there = {floor / bound:.2f}x the bound")
        out["float32 matvec"] = {"bytes_per_s": rate, "weights_s": floor, "x_bound": floor / bound}
    for dtype, m in models.items():
        parts = part_profile(m, runs[f"{dtype} fast"], args.frames)
        print_parts(f"AR {dtype}", parts, bandwidth, m, 1, context)
        out[f"{dtype} parts"] = parts
    results["ar"] = out


def conditioned_rows(args, bandwidth: float, results: dict) -> None:
    """The conditioned LM at --cfg (2 rows a step), fast and reference, alternated; bound and part profile."""
    model = load_lm(args.cond_lm).eval()
    sampling = SamplingOptions(seed=0, cfg_scale=args.cfg)
    condition = Condition(TEXT, SPEAKER)
    made = {}

    def run(fast: bool):
        codes, lengths = generate(model, None, args.frames, sampling=sampling, condition=condition,
                                  options=ARDecoding(fast=fast), return_lengths=True)
        made[fast] = int(lengths.max())
    medians = alternate({"fast": lambda: run(True), "reference": lambda: run(False)}, args.repeats)
    frames = made[True]
    memory = model.cross_memory(model.condition_inputs(TEXT, SPEAKER, 1).cat(model.condition_encoder.null_inputs(1)))
    rows, source = 2, memory.mask.shape[-1]
    context = (frames + model.config.n_codebooks) / 2
    bound = (weight_bytes(model) + kv_bytes(model, rows, context, source)) / bandwidth
    print(f"\nconditioned LM {args.cond_lm} at cfg {args.cfg:g} ({rows} rows a step), '{TEXT}' as {SPEAKER}, "
          f"{frames} frames (it stops at its end; the same in both paths: {made[True] == made[False]})")
    out = {}
    for name, seconds in medians.items():
        per_frame = seconds / frames
        print(f"{name:<10} {per_frame * 1e3:7.3f} ms/frame {1 / per_frame:7.1f} frames/s  bound {bound * 1e3:.3f} ms "
              f"({per_frame / bound:.2f}x)  x reference {medians['reference'] / seconds:.2f}")
        out[name] = {"seconds": seconds, "frames": frames, "frames_per_s": 1 / per_frame, "bound_s": bound}
    parts = part_profile(model, lambda: run(True), frames)
    print_parts("conditioned, cfg rows", parts, bandwidth, model, rows, context, source)
    out["parts"] = parts
    results["conditioned"] = out


def masked_rows(args, results: dict) -> None:
    """The masked LM's default decoding of --frames frames from nothing, end to end (medians)."""
    model = load_lm(args.masked_lm).eval()
    sampling = SamplingOptions(seed=0)
    medians = alternate({"masked": lambda: generate(model, None, args.frames, sampling=sampling)}, args.repeats)
    seconds = medians["masked"]
    print(f"\nmasked LM {args.masked_lm}: {args.frames} frames, default steps, {seconds:.3f} s = "
          f"{args.frames / seconds:.1f} frames/s (median of {args.repeats})")
    results["masked"] = {"seconds": seconds, "frames_per_s": args.frames / seconds}


def shipped_main(args: argparse.Namespace) -> dict:
    """Saved LMs (see benchmarks/generate_speed.py's docstring) -> the figures printed, as a dict."""
    cpu = cpu_description()
    print(f"host: {cpu}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load average "
          f"{os.getloadavg()[0]:.1f}")
    bandwidth = copy_bandwidth()
    print(f"memory bandwidth (tensor copy, read + write): {bandwidth / 1e9:.1f} GB/s")
    results = {"cpu": cpu, "bandwidth_bytes_per_s": bandwidth, "threads": torch.get_num_threads(),
               "frames": args.frames, "load_average": os.getloadavg()[0]}
    ar_rows(args, bandwidth, results)
    if args.cond_lm:
        conditioned_rows(args, bandwidth, results)
    if args.masked_lm:
        masked_rows(args, results)
    return results
