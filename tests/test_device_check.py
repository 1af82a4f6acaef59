"""scripts/device_check.sh --tiny: every section runs on the CPU without the soundfile and pytest
packages (as on a stock CUDA PyTorch image), and the JSON holds every figure as a positive number
(issue 22); the pytest runner of the CUDA tests on its own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FIGURES = ["lm_bf16_eager_tokens_per_s", "lm_bf16_eager_mfu", "lm_bf16_eager_peak_bf16_tflops",
           "lm_bf16_compile_tokens_per_s", "lm_bf16_compile_mfu", "lm_bf16_compile_peak_bf16_tflops",
           "codec_train_steps_per_s", "codec_train_audio_s_per_s",
           "tokenize_files_per_s", "tokenize_x_real_time", "tokenize_audio_s_per_cpu_s",
           "generate_b1_frames_per_s", "generate_b1_frames_per_s_all_rows",
           "generate_b64_frames_per_s", "generate_b64_frames_per_s_all_rows", "cuda_tests_collected"]

# Put first on sys.path of every process of the run: makes importing (and find_spec of) them fail.
BLOCK = '''import sys
class _Missing:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in ("soundfile", "pytest"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Missing)
'''


def test_tiny_device_check_writes_every_figure_without_soundfile_or_pytest(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK)
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "device_check.sh"), "--tiny", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    report = json.loads(out.read_text())
    failed = {name: s.get("error") for name, s in report["sections"].items() if s["status"] != "ok"}
    assert proc.returncode == 0 and not failed and not report["failed"], (failed, proc.stderr[-3000:])
    assert report["tiny"] and report["device"] == "cpu"
    packages = report["environment"]["packages"]
    assert packages["soundfile"] is False and packages["pytest"] is False  # the run really went without them
    for name in FIGURES:
        value = report["figures"].get(name)
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (name, value)
    assert set(report["figures"]) == set(FIGURES)
    assert 0 < report["figures"]["lm_bf16_eager_mfu"] < 1
    assert report["sections"]["tokenize"]["result"]["source"] == "synthetic"
    tests = report["sections"]["cuda_tests"]["result"]
    assert tests["runner"] == "plain (no pytest)"
    assert tests["skipped"] == tests["tests"] > 0 and tests["failures"] == tests["errors"] == 0  # no CUDA here


def test_the_cuda_tests_run_under_pytest_and_skip_without_cuda():
    from benchmarks.device_check import run_cuda_tests

    entry = run_cuda_tests(120, tiny=True, device="cpu")
    assert entry["status"] == "ok", entry
    result = entry["result"]
    assert result["runner"] == "pytest"
    assert result["tests"] == result["skipped"] == entry["figures"]["cuda_tests_collected"]
    assert result["tests"] >= 5 and result["failures"] == result["errors"] == 0


def test_a_failed_or_timed_out_section_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    import benchmarks.device_check as dc

    stopped = dc.run_section("lm_bf16_eager", 1.0, True, "cpu")  # killed while importing torch
    assert stopped["status"] == "timeout" and "limit of 1 s" in stopped["error"]
    monkeypatch.setattr(dc, "ORDER", ["no_such_section", "generate"])
    monkeypatch.setattr(dc, "LIMITS", {"no_such_section": (60, 60), "generate": (60, 300)})
    report = dc.check(True, "cpu", tmp_path / "check.json", budget=600)
    assert report == json.loads((tmp_path / "check.json").read_text())  # written after the last section
    assert report["failed"] == ["no_such_section"]
    assert report["sections"]["no_such_section"]["status"] == "failed"
    assert "invalid choice" in report["sections"]["no_such_section"]["error"]
    assert report["sections"]["generate"]["status"] == "ok" and report["figures"]["generate_b1_frames_per_s"] > 0
