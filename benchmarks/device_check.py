"""One-go device check: what a GPU at hand for ten minutes should measure, into one JSON.

    bash scripts/device_check.sh --out device_check.json      # on a GPU: a 450 s budget in all
    bash scripts/device_check.sh --tiny --out /tmp/dc.json     # on the CPU, tiny models, ~30 s of CPU

Sections: LM training speed in bf16, eager and under torch.compile (tokens/s, MFU against the
bf16 matmul peak measured in the same process: benchmarks/lm_train_speed.py), the codec's
training steps/s (codec_train_speed.py), tokenizing throughput (tokenize_speed.py, synthetic or
corpus audio), generation frames/s at batch 1 and 64 (generate_speed.py) and the tests marked
`cuda` (tests/test_cuda.py). Each section runs in its own process group under a time limit drawn
from one overall budget, so a hang, a crash or a CUDA error stops that section only; it is
recorded with its error. The JSON is rewritten (atomically) after every section. Needs only a
stock CUDA PyTorch image's packages: without soundfile 16-bit WAV is read by Python's `wave`, and
without pytest the same checks run from tests/cuda_checks.py directly.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script without the package installed
    sys.path.insert(0, str(REPO))

from rvqlm_core.atomic import atomic_write_json  # noqa: E402

TINY_LM = dict(n_codebooks=4, codebook_size=64, d_model=32, n_layers=2, n_heads=2, max_seq_len=64)
#: Per section: (GPU limit s, --tiny limit s); the overall budget caps them in order. --tiny's are
#: wide: it checks that everything runs (seconds of CPU), on machines that may be busy.
LIMITS = {"lm_bf16_eager": (90, 300), "codec_train": (90, 300), "generate": (90, 300), "tokenize": (120, 300),
          "cuda_tests": (150, 300), "lm_bf16_compile": (240, 300)}
GPU_BUDGET_S, TINY_BUDGET_S = 450, 1200


def _has(module: str) -> bool:
    """Whether `module` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _peak_memory(device: str) -> dict:
    """{"peak_memory_gib": the most this process had allocated on a CUDA device}, {} elsewhere."""
    import torch

    if not device.startswith("cuda"):
        return {}
    return {"peak_memory_gib": torch.cuda.max_memory_allocated(torch.device(device)) / 2**30}


# ---- sections: each runs in a fresh process and returns {"result": ..., "figures": {name: number}} ----

def _lm(tiny: bool, device: str, compiled: bool) -> dict:
    import torch

    from benchmarks.lm_train_speed import time_steps

    size = (dict(frames=16, batch=2, warmup=1, steps=2, model=TINY_LM, peak_n=256) if tiny else
            dict(frames=1500, batch=32, warmup=3, steps=10, model=None, peak_n=8192))
    r = time_steps(size["frames"], size["batch"], torch.get_num_threads(), "bf16", compiled, size["warmup"],
                   size["steps"], device=device, model=size["model"], peak_dtype=torch.bfloat16,
                   peak_n=size["peak_n"], compile_backend="eager" if tiny else "inductor")
    r.update(frames=size["frames"], batch=size["batch"], device=device, **_peak_memory(device))
    tag = "lm_bf16_compile" if compiled else "lm_bf16_eager"
    figures = {f"{tag}_tokens_per_s": r["tokens_per_s"], f"{tag}_mfu": r["mfu"],
               f"{tag}_peak_bf16_tflops": r["peak_gflops"] / 1e3}
    return {"result": r, "figures": figures}


def section_lm_bf16_eager(tiny: bool, device: str) -> dict:
    return _lm(tiny, device, compiled=False)


def section_lm_bf16_compile(tiny: bool, device: str) -> dict:
    return _lm(tiny, device, compiled=True)


def section_codec_train(tiny: bool, device: str) -> dict:
    import statistics

    import torch

    from benchmarks.codec_train_speed import CONFIGS, time_codec_steps
    from codec import CodecConfig

    batch, seconds, steps = (1, 0.25, 2) if tiny else (8, 1.0, 20)  # the recipe's batch: 8 x 1 s crops
    name = "istft dim 384 x 8 (stage 8)"
    wav = torch.randn(batch, 1, int(16000 * seconds)) * 0.1
    step_s = statistics.median(time_codec_steps(CodecConfig(**CONFIGS[name]), wav, steps, device=device))
    result = {"config": name, "batch": batch, "crop_seconds": seconds, "steps": steps, "step_s": step_s,
              "precision": "fp32", **_peak_memory(device)}
    return {"result": result, "figures": {"codec_train_steps_per_s": 1 / step_s,
                                          "codec_train_audio_s_per_s": batch * seconds / step_s}}


def section_generate(tiny: bool, device: str) -> dict:
    import dataclasses

    import torch

    from benchmarks.generate_speed import bench_config, time_cached
    from lm import MultiCodebookLM

    frames = 8 if tiny else 1500
    cfg = bench_config(max_seq_len=2048)
    if tiny:
        cfg = dataclasses.replace(cfg, **TINY_LM)
    torch.manual_seed(0)
    model = MultiCodebookLM(cfg).to(device).eval()
    result, figures = {"frames": frames, "params": model.num_parameters()}, {}
    for batch in (1, 64):
        wall, cpu = time_cached(model, batch, frames)
        result[f"batch_{batch}"] = {"wall_s": wall, "cpu_s": cpu, "frames_per_s": frames / wall}
        figures[f"generate_b{batch}_frames_per_s"] = frames / wall
        figures[f"generate_b{batch}_frames_per_s_all_rows"] = batch * frames / wall
    result.update(_peak_memory(device))
    return {"result": result, "figures": figures}


def _write_wav(path: Path, samples, rate: int = 16000) -> None:
    """16-bit PCM mono with the stdlib (no soundfile needed)."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def _synthetic_audio(folder: Path, files: int, seconds: tuple[float, float]) -> None:
    """Noisy tones of random lengths: the codec's speed does not depend on what it hears."""
    import numpy as np

    rng = np.random.default_rng(0)
    for i in range(files):
        n = int(16000 * rng.uniform(*seconds))
        t = np.arange(n) / 16000
        tone = 0.3 * np.sin(2 * np.pi * rng.uniform(80, 400) * t) + rng.normal(0, 0.05, n)
        _write_wav(folder / f"{i // 100:02d}" / f"{i:04d}.wav", tone)


def section_tokenize(tiny: bool, device: str) -> dict:
    from benchmarks.tokenize_speed import _make_short, _run_case
    from codec import Codec, CodecConfig

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        codec_dir = REPO / "models" / "codec-speech-16k"
        if tiny or not (codec_dir / "config.json").is_file():
            codec_dir = Codec(CodecConfig()).save_pretrained(tmp / "codec")
        corpus = REPO / "data" / "fillets-cs-16k"  # the prepared built-in corpus, where it is
        if not tiny and (corpus / "corpus.json").is_file() and _has("soundfile"):
            from rvqlm.corpora.folder import corpus_files

            source, files = "corpus", min(400, len(corpus_files(corpus, "train")))
            _make_short(tmp / "audio", corpus, files)
        else:
            source, files = "synthetic", 3 if tiny else 240
            _synthetic_audio(tmp / "audio", files, (0.3, 0.6) if tiny else (4.0, 16.0))
        workers = 0 if tiny else min(4, max(1, (os.cpu_count() or 2) - 2))
        r = _run_case(tmp / "audio", tmp / "tokens", codec_dir, workers, None, 20.0, device=device,
                      timeout=LIMITS["tokenize"][tiny] - 10)[0]
    r.update(source=source, codec=str(codec_dir.name), workers=workers, batch_seconds=20.0, device=device)
    return {"result": r, "figures": {"tokenize_files_per_s": r["files"] / r["wall_s"],
                                     "tokenize_x_real_time": r["audio_s"] / r["wall_s"],
                                     "tokenize_audio_s_per_cpu_s": r["audio_s"] / r["cpu_s"]}}


def section_cuda_checks(tiny: bool, device: str) -> dict:
    """tests/cuda_checks.py without pytest: each check on `device`, skipped (as under pytest) without CUDA."""
    import traceback

    import torch

    sys.path.insert(0, str(REPO / "tests"))
    import cuda_checks

    counts, errors = {"tests": len(cuda_checks.CHECKS), "failures": 0, "errors": 0, "skipped": 0}, {}
    for check in cuda_checks.CHECKS:
        if not (device.startswith("cuda") and torch.cuda.is_available()):
            counts["skipped"] += 1
            continue
        try:
            with tempfile.TemporaryDirectory() as tmp, cuda_checks.full_fp32():
                check(device, Path(tmp))
        except Exception:  # noqa: BLE001 - recorded, and the next check runs
            counts["failures"] += 1
            errors[check.__name__] = traceback.format_exc(limit=-3)
    counts["passed"] = counts["tests"] - counts["failures"] - counts["skipped"]
    return {"result": {**counts, "runner": "plain (no pytest)", "failed_checks": errors},
            "figures": {"cuda_tests_collected": counts["tests"]}}


SECTIONS = {"lm_bf16_eager": section_lm_bf16_eager, "codec_train": section_codec_train,
            "generate": section_generate, "tokenize": section_tokenize, "lm_bf16_compile": section_lm_bf16_compile,
            "cuda_checks": section_cuda_checks}
ORDER = ["lm_bf16_eager", "codec_train", "generate", "tokenize", "cuda_tests", "lm_bf16_compile"]


# ---- the parent: runs each section in a process group under its limit ----------------------------------

def _run_limited(cmd: list[str], limit: float) -> tuple[int | None, str, str]:
    """(returncode or None on timeout, stdout, stderr) of CMD, its whole process group killed at LIMIT s."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def _failure(status: str, error: str, stderr: str) -> dict:
    return {"status": status, "error": error, "stderr_tail": stderr[-3000:]}


def run_section(name: str, limit: float, tiny: bool, device: str) -> dict:
    """One section in a fresh process: its {"status": "ok", "result", "figures"} or why it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "section.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--section-out", str(out),
               "--device", device] + (["--tiny"] if tiny else [])
        code, _, err = _run_limited(cmd, limit)
        if code is None:
            return _failure("timeout", f"stopped after its limit of {limit:.0f} s", err)
        if code != 0 or not out.is_file():
            lines = [line for line in err.strip().splitlines() if line.strip()]
            return _failure("failed", lines[-1] if lines else f"exit status {code}", err)
        return {"status": "ok", **json.loads(out.read_text())}


def run_cuda_tests(limit: float, tiny: bool, device: str) -> dict:
    """pytest -m cuda tests/test_cuda.py, counts from its JUnit XML; without pytest, the same checks
    by `section_cuda_checks`. Without CUDA every test is skipped."""
    if not _has("pytest"):
        entry = run_section("cuda_checks", limit, tiny, device)
        failed = entry.get("result", {}).get("failures", 0)
        if entry["status"] == "ok" and failed:
            entry.update(status="failed", error=f"{failed} of {entry['result']['tests']} checks failed")
        return entry
    import xml.etree.ElementTree as ET

    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", f"--junitxml={xml}",
               "tests/test_cuda.py"]
        code, out, err = _run_limited(cmd, limit)
        if code is None or not xml.is_file():
            return _failure("timeout" if code is None else "failed", f"pytest: exit {code}", out + err)
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    result = {"status": "ok" if code == 0 else "failed", "result": {**counts, "runner": "pytest"},
              "figures": {"cuda_tests_collected": counts["tests"]}}
    if code != 0:
        result.update(error=f"{counts['failures'] + counts['errors']} of {counts['tests']} tests failed",
                      stdout_tail=out[-3000:])
    return result


def environment(device: str) -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cpus": os.cpu_count(), "host": platform.node(), "device": device,
           "packages": {m: _has(m)
                        for m in ("lightning", "einops", "safetensors", "torchaudio", "numpy", "soundfile", "pytest")}}
    try:
        if device.startswith("cuda"):
            props = torch.cuda.get_device_properties(torch.device(device))
            env.update(gpu=props.name, gpu_memory_gib=props.total_memory / 2**30,
                       capability=f"{props.major}.{props.minor}", gpus=torch.cuda.device_count(),
                       tf32_matmul=torch.backends.cuda.matmul.allow_tf32, tf32_cudnn=torch.backends.cudnn.allow_tf32)
        git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        env["commit"] = git.stdout.strip() if git.returncode == 0 else None
    except Exception as e:  # noqa: BLE001 - a broken driver or no git: the sections still run and say more
        env["error"] = f"{type(e).__name__}: {e}"
    return env


def check(tiny: bool, device: str, out: Path, budget: float) -> dict:
    """Every section in ORDER within BUDGET seconds; the report is written to OUT after each."""
    now = lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    report = {"schema": 1, "started": now(), "tiny": tiny, "device": device, "budget_s": budget,
              "environment": environment(device), "sections": {}, "figures": {}, "failed": []}
    deadline = time.monotonic() + budget
    for name in ORDER:
        limit = min(LIMITS[name][tiny], deadline - time.monotonic())
        t0 = time.monotonic()
        if limit < 5:
            entry = {"status": "not_run", "error": "no time left in the overall budget"}
        elif name == "cuda_tests":
            entry = run_cuda_tests(limit, tiny, device)
        else:
            entry = run_section(name, limit, tiny, device)
        entry["seconds"] = round(time.monotonic() - t0, 1)
        report["sections"][name] = entry
        report["figures"].update(entry.get("figures", {}))
        if entry["status"] != "ok":
            report["failed"].append(name)
        print(f"{name:<16} {entry['status']:<8} {entry['seconds']:6.1f} s  "
              + ("  ".join(f"{k}={v:.4g}" for k, v in entry.get("figures", {}).items()) or entry.get("error", "")),
              flush=True)
        report["finished"] = now()
        atomic_write_json(out, report)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("device_check.json"),
                   help="the JSON report (default ./device_check.json)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny models and data on the CPU, in seconds (the test suite's run)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when there, else cpu; --tiny: cpu)")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"overall time limit in seconds (default {GPU_BUDGET_S}; --tiny {TINY_BUDGET_S})")
    p.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)  # internal: one section
    p.add_argument("--section-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if args.section:
        atomic_write_json(args.section_out, SECTIONS[args.section](args.tiny, device))
        return 0
    budget = args.budget_s or (TINY_BUDGET_S if args.tiny else GPU_BUDGET_S)
    report = check(args.tiny, device, args.out, budget)
    print(f"wrote {args.out}: {len(report['figures'])} figures, failed sections: {report['failed'] or 'none'}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
