"""What a cached AR generation step costs, part by part, against its memory-bandwidth bound (issue 40).

Used by benchmarks/generate_speed.py on a saved LM (the shipped one by default):

* `read_bytes(model, rows, context)`: the bytes a batch-`rows` step must read: every weight of a matrix
  product (blocks and heads, int8 values and scales for an int8 LM; not the embedding tables, of which a
  step gathers N_c rows, nor a conditioned LM's cross-attention K/V projection, run once per sequence),
  the norm gains, and the keys and values the step attends over (self-attention at `context` positions,
  a conditioned LM's cached cross-attention keys and values).
* `matvec_bandwidth(model)`: the rate torch's float32 matrix-vector kernel streams a step's weights at,
  in one call over all of them stacked: the floor under a float32 step's matrix products here.
* `part_profile`: each part of a real generation timed where it runs (lm.decode_step's parts wrapped in
  timers), per frame. Parts timed alone in a loop would read their weights from the CPU's caches and
  look several times cheaper than inside a step, which reads every weight once.
"""

from __future__ import annotations

import time
from typing import Callable

import torch



def copy_bandwidth(mbytes: int = 256, repeats: int = 5) -> float:
    """Best-of-`repeats` bytes/s of a large tensor copy, counting read + write."""
    src = torch.ones(mbytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best


def cpu_description() -> str:
    """The CPU's model name and the vector extensions int8 and float32 kernels pick their paths by
    (rvqlm_core.int8_linear.cpu_info; the machine's name where /proc/cpuinfo cannot be read). Int8 speed
    differs several-fold between CPUs with and without VNNI, so every speed figure should say which it came from."""
    import platform

    from rvqlm_core.int8_linear import cpu_info

    fields = cpu_info()
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    found = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{name} ({', '.join(found) or 'no AVX2'})"


def matvec_bandwidth(model, repeats: int = 50) -> float:
    """Best-of-`repeats` bytes/s of float32 matrix-vector work as a step does it at batch 1, but in one call:
    F.linear of one input row with every d-wide matrix of the step (blocks and heads) stacked into one
    weight of the step's own size, so no per-call cost and no cache reuse between calls. The most a float32
    step's matrix products can stream on this machine with torch's kernel, whatever is done around them."""
    import torch.nn.functional as F

    d = model.config.d_model
    rows = [m.weight.detach().float().reshape(-1, d) for m in model.blocks.modules()
            if isinstance(m, torch.nn.Linear) and m.in_features == d]
    stacked = torch.cat([*rows, model.head_weights().detach().float().reshape(-1, d)])
    x = torch.randn(1, d)
    F.linear(x, stacked)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        F.linear(x, stacked)
        best = min(best, time.perf_counter() - t)
    return stacked.numel() * 4 / best


def weight_bytes(model) -> int:
    """Bytes of the weights one step reads in full: blocks (less the cross-attention K/V projection), final
    norm, heads; parameters and buffers (an int8 LM's int8 weights and scales)."""
    def size(module, skip: str = "\0") -> int:
        tensors = [*module.named_parameters(), *module.named_buffers()]
        return sum(t.numel() * t.element_size() for name, t in tensors if skip not in name)

    n = size(model.blocks, "cross_attn.kv.") + size(model.final_norm)
    if model.int8_head is not None:
        return n + size(model.int8_head)
    heads = model.head_weights()
    return n + heads.numel() * heads.element_size()


def kv_bytes(model, rows: int, context: float, source_len: int = 0) -> float:
    """Bytes of cached keys and values a step of `rows` rows reads at `context` positions (float32), plus a
    conditioned LM's cross-attention keys and values over `source_len` source positions."""
    cfg = model.config
    return 2 * cfg.n_layers * rows * cfg.kv_heads * cfg.head_dim * 4 * (min(context, cfg.max_seq_len) + source_len)


class SectionTimers:
    """Wall time spent inside wrapped functions, each call's own time less that of the wrapped calls inside it
    (so the sections add up), named by `name(parents)` from the names of the wrapped calls it is inside."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._names: list[str] = []
        self._inner: list[float] = []

    def wrap(self, fn: Callable, name: str | Callable[[list[str]], str]) -> Callable:
        def timed(*args, **kwargs):
            label = name(self._names) if callable(name) else name
            self._names.append(label)
            self._inner.append(0.0)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t
                self._names.pop()
                inner = self._inner.pop()
                self.seconds[label] = self.seconds.get(label, 0.0) + dt - inner
                if self._inner:
                    self._inner[-1] += dt
        return timed


def _linear_name(parents: list[str]) -> str:
    inside = parents[-1] if parents else ""
    return "matrices: feed-forward" if inside.startswith("feed-forward") else "matrices: attention qkv, out"


def part_profile(model, generate_once: Callable[[], object], frames: int) -> dict[str, float]:
    """Seconds per frame of each part of a real generation (`generate_once()` making `frames` frames with
    `model`), timed where it runs: lm.decode_step's parts, the heads, sampling, and the decoding loop around
    them, each less the parts inside it. Timing costs a few microseconds per wrapped call (a few % here)."""
    import lm.decode_step as ds
    import lm.model as lm_model
    from lm.sampling import SamplingOptions

    timers = SectionTimers()
    saved = {name: getattr(ds, name) for name in ("_norm", "_linear", "_self_attention", "_ffn")}
    saved_step, saved_sample = lm_model.decode_step, SamplingOptions.sample
    ds._norm = timers.wrap(saved["_norm"], "norms")
    ds._linear = timers.wrap(saved["_linear"], _linear_name)
    ds._self_attention = timers.wrap(saved["_self_attention"], "attention: RoPE, cache write, SDPA")
    ds._ffn = timers.wrap(saved["_ffn"], "feed-forward: SiLU, product")
    lm_model.decode_step = timers.wrap(saved_step, "step: residual adds, Python")
    SamplingOptions.sample = timers.wrap(saved_sample, "sampling (filter, softmax, multinomial)")
    model.embed = timers.wrap(model.embed, "embedding sum (N_c gathers)")
    model.logits = timers.wrap(model.logits, "matrices: heads")
    crosses = [b.cross_attn for b in model.blocks if b.cross_attn is not None]
    for attn in crosses:
        attn.forward = timers.wrap(attn.forward, "cross-attention (all of it)")
    try:
        total = timed_call(timers.wrap(generate_once, "decoding loop: pattern, guidance, prefill, Python"))
    finally:
        for name, fn in saved.items():
            setattr(ds, name, fn)
        lm_model.decode_step, SamplingOptions.sample = saved_step, saved_sample
        for obj in (model, *crosses):
            obj.__dict__.pop("embed", None), obj.__dict__.pop("logits", None), obj.__dict__.pop("forward", None)
    parts = {name: seconds / frames for name, seconds in sorted(timers.seconds.items())}
    parts["all (timed)"] = total / frames
    return parts


def timed_call(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
