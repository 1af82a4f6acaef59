"""The masked LM against the AR LM (issue 21): speed and quality of held-out prompts continued by both,
in one run on this machine.

    .venv/bin/python benchmarks/masked_vs_ar.py --masked DIR [--ar models/lm-speech-16k] \\
        [--codec models/codec-speech-16k] --tokens DIR [--split test] [--prompts 8] [--prompt-seconds 3] \\
        [--seconds 10] [--batch-sizes 1,8] [--steps 16,4,2,1] [--sweep 4,8,16,32] [--step-lists "8,2;6,2,1"] \\
        [--choice-temperature 0] [--choice-sweep 0,2,4.5] [--one-pass [--no-chunked]] [--ratios 0.5] [--json out.json]

Speed, per batch size B (the first B prompts; B = 1 repeats over `--timing-prompts` prompts, median):
sequential model calls per second of audio (the latency parallel hardware sees: one AR call per
pattern step, with its KV cache; masked: chunks x sum of steps), wall time and frames/s on this CPU,
and which bound each run sits against: its FLOPs at the measured fp32 matmul peak, or its weight
reads (every parameter once per call) at the measured memory bandwidth, whichever is longer.

Quality, on the batch of all prompts (both at --temperature / --top-k; default plain sampling), next to the real audio that
follows the prompts in their files: NLL of the continuation under the AR LM, repetition share and
silence share (benchmarks/continuation_quality.py) and DNSMOS OVRL (speechmos, offline) of the
decoded continuation. --sweep varies level 0's steps (the other levels as --steps), --step-lists adds whole
step lists and --choice-sweep other choice temperatures (MaskGIT's Gumbel noise on the keep ranking), all
crossed, for time and quality. --one-pass adds the masked LM run over prompt + continuation as one window
(`window=`, a RoPE model stretched past the windows it was trained on: one chunk, so sum(steps) calls in
all); --no-chunked leaves out the runs in the model's own windows. Each masked row is also compared with
the AR LM and with the first masked row prompt by prompt: mean difference and its standard error.

Masked NLL per level on the split at each of --ratios (lm.masked_training.masked_held_out_report:
level q hidden at the ratio, finer levels hidden, coarser visible; `--score-windows` evenly spaced windows).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks/ is a package of the repository
    sys.path.insert(0, str(REPO))

from benchmarks.continuation_quality import held_out_prompts, measure  # noqa: E402
from rvqlm.cli import run_script  # noqa: E402
from lm.generate import generate
from lm.masked_generate import MaskedDecoding
from lm.sampling import SamplingOptions


# ---- machine bounds ---------------------------------------------------------------------------------

def memory_bandwidth(n_bytes: int = 1 << 27, repeats: int = 3) -> float:
    """Bytes/s of a large tensor copy (read + write), best of `repeats`."""
    a = torch.empty(n_bytes // 4, dtype=torch.float32).fill_(1.0)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * n_bytes / best


def matmul_params(model) -> int:
    """Parameters used in matrix products per frame: the blocks' matrices and every head."""
    cfg = model.config
    blocks = sum(p.numel() for p in model.blocks.parameters() if p.dim() == 2)
    return blocks + cfg.n_codebooks * cfg.n_outputs * cfg.d_model


def bound(model, calls: int, frames_per_call: float, batch: int, peak: float, bandwidth: float) -> dict:
    """Lower bounds on the time of `calls` sequential calls of `frames_per_call` frames per row: arithmetic
    (2 x matmul params x frames x batch FLOPs at `peak`) and weight reads (4 bytes a parameter a call)."""
    flops = 2.0 * matmul_params(model) * frames_per_call * batch * calls
    weight_bytes = 4.0 * sum(p.numel() for p in model.parameters()) * calls
    t_flops, t_bytes = flops / peak, weight_bytes / bandwidth
    return {"flops_s": t_flops, "weights_s": t_bytes, "bound": "arithmetic" if t_flops > t_bytes else "weight reads"}


# ---- the two generators ---------------------------------------------------------------------------------

def ar_calls(ar, prompt_frames: int, new_frames: int) -> int:
    """Sequential AR model calls: one per pattern step after the prompt (the prefill is the first)."""
    from lm.ar_decode import plan_generation

    plan = plan_generation(ar, torch.zeros(1, ar.config.n_codebooks, prompt_frames, dtype=torch.long), new_frames)
    return plan.n_steps - plan.first_step


def run_ar(ar, prompts: torch.Tensor, new_frames: int, args, seed: int) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    codes = generate(ar, prompts, new_frames, sampling=SamplingOptions(args.temperature, args.top_k, seed=seed))
    return codes, time.perf_counter() - t0


def run_masked(masked, prompts: torch.Tensor, new_frames: int, args, seed: int, steps,
               window: int | None = None, tau: float | None = None) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    tau = args.choice_temperature if tau is None else tau
    codes = generate(masked, prompts, new_frames, sampling=SamplingOptions(args.temperature, args.top_k, seed=seed),
                     options=MaskedDecoding(steps=steps, window=window, choice_temperature=tau))
    return codes, time.perf_counter() - t0


# ---- measurements ---------------------------------------------------------------------------------------

def masked_variants(masked, total_frames: int, args) -> list[tuple[str, int]]:
    """("masked", its window) unless --no-chunked and, with --one-pass, ("masked 1 pass", the whole clip as one
    window)."""
    return ([] if args.no_chunked else [("masked", masked.config.max_frames)]) + (
        [("masked 1 pass", max(total_frames, masked.config.max_frames))] if args.one_pass else [])


def masked_settings(masked, total_frames: int, args) -> list[tuple[str, list[int], int, float]]:
    """(row name, steps, window, choice temperature) of every masked quality row: each variant x step list
    (--steps, its --sweep of level 0, --step-lists) x choice temperature (--choice-temperature, --choice-sweep)."""
    from lm.masked_generate import check_choice_temperature, steps_per_level

    n_c = masked.config.n_codebooks
    base = steps_per_level(args.steps, n_c)
    lists = [base] + [[first, *base[1:]] for first in args.sweep if first != base[0]]
    lists += [s for s in (steps_per_level(x, n_c) for x in args.step_lists) if s not in lists]
    tau0 = check_choice_temperature(args.choice_temperature)
    taus = [tau0] + [t for t in args.choice_sweep if t != tau0]
    return [(f"{name} {','.join(map(str, steps))} tau {tau:g}", steps, window, tau)
            for name, window in masked_variants(masked, total_frames, args) for steps in lists for tau in taus]


def speed(ar, masked, prompts: torch.Tensor, new_frames: int, args, frame_rate: float, machine: dict) -> list[dict]:
    """One row per (family, batch size): calls per audio second, wall time, frames/s and the bound."""
    from lm.masked_generate import model_calls, steps_per_level

    t0, seconds = prompts.shape[-1], new_frames / frame_rate
    steps = steps_per_level(args.steps, masked.config.n_codebooks)
    runs = [("AR (KV cache)", ar, ar_calls(ar, t0, new_frames), 1,
             lambda p: run_ar(ar, p, new_frames, args, args.seed))]
    for name, window in masked_variants(masked, t0 + new_frames, args):
        runs.append((name, masked, model_calls(t0, new_frames, window, steps), window,
                     lambda p, w=window: run_masked(masked, p, new_frames, args, args.seed, steps, w)))
    rows = []
    for b in args.batch_sizes:
        groups = ([prompts[i:i + 1] for i in range(min(args.timing_prompts, len(prompts)))] if b == 1
                  else [prompts[:b]])
        walls = [[run(p)[1] for *_, run in runs] for p in groups]  # interleaved: each prompt by every run in turn
        for j, (name, model, calls, frames_per_call, run) in enumerate(runs):
            wall = statistics.median(w[j] for w in walls)
            rows.append({"family": name, "batch": int(groups[0].shape[0]), "calls_per_audio_s": calls / seconds,
                         "wall_s": wall, "frames_per_s": groups[0].shape[0] * new_frames / wall,
                         "vs_ar": statistics.median(w[j] / w[0] for w in walls),
                         **bound(model, calls, min(frames_per_call, t0 + new_frames), groups[0].shape[0],
                                 machine["matmul_flops"], machine["bandwidth"])})
    return rows


def quality(ar, codec, codes: torch.Tensor, start: int, args) -> dict:
    """NLL under the AR LM, repetition and silence shares, DNSMOS OVRL of rows [B, N_c, T] after `start`."""
    from rvqlm.quality.metrics import dnsmos

    rows = list(codes)
    measured = measure(ar, codec, rows, start, args.ngram, args.silence_dbfs)
    out = measured.means()
    scores = []
    for row in rows:
        wav = codec.decode(row[None])[0, 0, start * codec.hop_length:].float().cpu().numpy()
        scores.append(dnsmos(wav, codec.sample_rate)["dnsmos_ovrl"] if wav.size else float("nan"))
    out["dnsmos_ovrl"] = float(np.nanmean(scores)) if not all(np.isnan(scores)) else float("nan")
    out["per_prompt"] = {"nll": measured.nll, "rep_share": measured.rep_share, "silence": measured.silence,
                         "dnsmos_ovrl": [float(x) for x in scores]}
    return out


PAIRED = ("dnsmos_ovrl", "silence", "rep_share", "nll")


def paired(rows: dict, reference: str) -> dict:
    """Per masked row: {measure: (mean of row - reference over the prompts both scored, its standard error, n)}."""
    ref = rows[reference]["per_prompt"]
    out = {}
    for name, q in rows.items():
        if name == reference or not name.startswith("masked"):
            continue
        out[name] = {}
        for k in PAIRED:
            d = np.array(q["per_prompt"][k], dtype=float) - np.array(ref[k], dtype=float)
            d = d[~np.isnan(d)]
            se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
            out[name][k] = (float(d.mean()) if len(d) else float("nan"), se, int(len(d)))
    return out


def compare_quality(ar, masked, codec, prompts, new_frames: int, args) -> dict:
    """Both families' continuations of every prompt (one batch each) and the real audio after the prompts."""
    start = prompts.codes.shape[-1]
    ar_codes, ar_s = run_ar(ar, prompts.codes, new_frames, args, args.seed)
    out = {"AR (KV cache)": {**quality(ar, codec, ar_codes, start, args), "wall_s": ar_s}}
    for name, steps, window, tau in masked_settings(masked, start + new_frames, args):
        codes, wall = run_masked(masked, prompts.codes, new_frames, args, args.seed, steps, window, tau)
        out[name] = {**quality(ar, codec, codes, start, args), "wall_s": wall}
    real = [r for r in prompts.real if r.shape[-1] > start]
    if real:
        out["real audio"] = {**_real_quality(ar, codec, real, start, args), "wall_s": float("nan")}
    return out


def _real_quality(ar, codec, real: list[torch.Tensor], start: int, args) -> dict:
    """quality() of rows of different lengths, one at a time, averaged."""
    parts = [quality(ar, codec, r[None], start, args) for r in real]
    return {k: float(np.nanmean([p[k] for p in parts])) for k in parts[0] if k != "per_prompt"}


def masked_nll_table(masked, tokens: str, split: str, ratios: list[float], windows: int | None) -> dict:
    from lm.masked_training import masked_held_out_report

    return {str(r): masked_held_out_report(masked, tokens, split, ratio=r, max_windows=windows)["nll_per_codebook"]
            for r in ratios}


# ---- the script -------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--masked", required=True, help="a saved masked LM folder (rvqlm train-lm with a masked recipe)")
    p.add_argument("--ar", default="models/lm-speech-16k", help="the AR LM to compare with and score by")
    p.add_argument("--codec", default="models/codec-speech-16k")
    p.add_argument("--tokens", required=True, help="a token folder of the corpus made with that codec")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--timing-prompts", type=int, default=3, help="prompts timed one by one at batch 1")
    p.add_argument("--prompt-seconds", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--steps", default=None, help="masked steps per level (default lm.masked_generate's, 8,2,1,1,1,1,1,1)")
    p.add_argument("--sweep", default="4,8,16,32", help="level-0 step counts to compare ('' for none)")
    p.add_argument("--step-lists", default="", help="whole step lists to compare, ';'-separated: '8,2;6,2,1'")
    p.add_argument("--choice-temperature", type=float, default=None,
                   help="MaskGIT's choice temperature of every masked run (default: lm.masked_generate's)")
    p.add_argument("--choice-sweep", default="", help="other choice temperatures to compare, e.g. 0,2,4.5")
    p.add_argument("--one-pass", action="store_true",
                   help="also run the masked LM over the whole clip in one window (RoPE past its training context)")
    p.add_argument("--no-chunked", action="store_true",
                   help="with --one-pass: leave out the masked runs in the model's own windows")
    p.add_argument("--ratios", default="0.5", help="mask ratios of the per-level masked NLL ('' for none)")
    p.add_argument("--score-windows", type=int, default=64, help="windows of the split the masked NLL scores")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None, help="default: none (plain sampling, the AR LM's best)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ngram", type=int, default=8)
    p.add_argument("--silence-dbfs", type=float, default=-40.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    try:
        args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
        args.sweep = [int(x) for x in args.sweep.split(",")] if args.sweep.strip() else []
        args.ratios = [float(x) for x in args.ratios.split(",")] if args.ratios.strip() else []
        args.choice_sweep = [float(x) for x in args.choice_sweep.split(",")] if args.choice_sweep.strip() else []
        args.step_lists = [x for x in args.step_lists.split(";") if x.strip()]
    except ValueError:
        p.error("--batch-sizes, --sweep, --choice-sweep and --ratios are comma-separated numbers")
    if args.no_chunked and not args.one_pass:
        p.error("--no-chunked needs --one-pass (else no masked run is left)")
    if not all(0 <= t < float("inf") for t in args.choice_sweep + [args.choice_temperature or 0.0]):
        p.error("choice temperatures must be finite numbers >= 0")
    if min(args.batch_sizes + [args.prompts, args.timing_prompts, args.threads]) < 1:
        p.error("batch sizes, --prompts, --timing-prompts and --threads must be >= 1")
    if not all(0 < r <= 1 for r in args.ratios) or min(args.sweep, default=1) < 1:
        p.error("--ratios must be in (0, 1] and --sweep step counts >= 1")
    return args


def load(args):
    from benchmarks.continuation_quality import check_pairing
    from codec import Codec
    from lm import MaskedLM, MultiCodebookLM
    from lm.trunk import load_lm

    ar, masked = load_lm(args.ar).eval(), load_lm(args.masked).eval()
    if not (isinstance(ar, MultiCodebookLM) and isinstance(masked, MaskedLM)):
        raise ValueError(f"--ar must be an AR LM and --masked a masked LM; got {ar.config.family} and "
                         f"{masked.config.family}")
    codec = Codec.from_pretrained(args.codec).eval()
    check_pairing(ar, codec, args.tokens)
    check_pairing(masked, codec, args.tokens)
    return ar, masked, codec


def run(args) -> dict:
    ar, masked, codec = load(args)
    prompt_frames = max(1, round(args.prompt_seconds * codec.frame_rate))
    new_frames = max(1, round(args.seconds * codec.frame_rate))
    prompts = held_out_prompts(args.tokens, args.split, args.prompts, prompt_frames, new_frames)
    from lm.training import measure_matmul_peak

    machine = {"matmul_flops": measure_matmul_peak(), "bandwidth": memory_bandwidth(), "threads": args.threads}
    with torch.inference_mode():
        speed_rows = speed(ar, masked, prompts.codes, new_frames, args, codec.frame_rate, machine)
        qual = compare_quality(ar, masked, codec, prompts, new_frames, args)
    first = next(name for name in qual if name.startswith("masked"))
    pairs = {ref: table for ref in ("AR (KV cache)", first) if (table := paired(qual, ref))}
    nll = masked_nll_table(masked, args.tokens, args.split, args.ratios, args.score_windows)
    return {"machine": machine, "prompts": prompts.paths, "prompt_frames": prompt_frames, "new_frames": new_frames,
            "speed": speed_rows, "quality": qual, "paired": pairs, "masked_nll": nll}


def report_lines(result: dict) -> list[str]:
    m = result["machine"]
    lines = [f"machine: fp32 matmul {m['matmul_flops'] / 1e9:.1f} GFLOP/s, copy {m['bandwidth'] / 1e9:.1f} GB/s, "
             f"{m['threads']} thread(s); {len(result['prompts'])} prompts of {result['prompt_frames']} frames "
             f"+ {result['new_frames']} new",
             f"{'family':<14} {'batch':>5} {'calls/audio s':>13} {'wall s':>8} {'x AR':>6} {'frames/s':>9} "
             f"{'FLOP-bound s':>12} {'read-bound s':>12}  bound"]
    for r in result["speed"]:
        lines.append(f"{r['family']:<14} {r['batch']:>5d} {r['calls_per_audio_s']:>13.2f} {r['wall_s']:>8.2f} "
                     f"{r['vs_ar']:>6.2f} {r['frames_per_s']:>9.1f} {r['flops_s']:>12.2f} {r['weights_s']:>12.2f}  "
                     f"{r['bound']}")
    width = max(30, *(len(n) for n in result["quality"]))
    lines.append(f"{'continuation':<{width}} {'AR NLL':>7} {'rep share':>9} {'silence':>8} {'DNSMOS':>7} {'wall s':>7}")
    for name, q in result["quality"].items():
        lines.append(f"{name:<{width}} {q['nll']:>7.3f} {q['rep_share']:>9.3f} {q['silence']:>8.3f} "
                     f"{q['dnsmos_ovrl']:>7.2f} {q['wall_s']:>7.2f}")
    for reference, table in result["paired"].items():
        lines.append(f"paired, row - {reference} (mean +- s.e. over prompts): " + ", ".join(PAIRED))
        for name, d in table.items():
            lines.append(f"  {name:<{width}} " + "  ".join(f"{m:+.3f} +- {se:.3f}" for m, se, _ in d.values()))
    for ratio, per_level in result["masked_nll"].items():
        lines.append(f"masked NLL at ratio {ratio}: " + " ".join(f"{x:.3f}" for x in per_level))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run(args)
    print("\n".join(report_lines(result)))
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(args.json, {**result, "args": {k: v for k, v in vars(args).items()}})
    return 0


if __name__ == "__main__":
    run_script(main, "masked_vs_ar.py")
