"""What only a GPU can check (tests/cuda_checks.py): device moves of the codec and the LM, bf16
autocast, tokenizing on CUDA, and Lightning DDP on one GPU. Marked `cuda` (scripts/device_check.sh
runs `-m cuda`); every test skips without CUDA. The same checks on the CPU device keep their logic
honest without a GPU (test_the_checks_hold_on_the_cpu_device)."""

from __future__ import annotations

import pytest
import torch

import cuda_checks


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("check", cuda_checks.CHECKS, ids=lambda c: c.__name__)
def test_on_cuda(check, tmp_path):
    with cuda_checks.full_fp32():
        check("cuda", tmp_path)


@pytest.mark.parametrize("check", cuda_checks.CHECKS, ids=lambda c: c.__name__)
def test_the_checks_hold_on_the_cpu_device(check, tmp_path):
    check("cpu", tmp_path)
