"""Is there a quality cliff when cached generation passes the LM's trained context?

    .venv/bin/python benchmarks/context_boundary.py --lm LM_DIR --tokens TOKENS_DIR \
        [--split valid] [--files 4] [--after W] [--threads T] [--json out.json]

Held-out token files are teacher-forced through the LM one pattern step at a time, for W + after
steps (W = the LM's max_seq_len), and scored (next-token NLL, nats/token, over the pattern's valid
targets of every codebook) three ways:

* recompute: each step past the boundary recomputes a fresh window, [bos] + the last W-1 inputs
  at positions 0..W-1: exactly what a training window looks like (the in-distribution reference,
  and the most expensive: one W-position forward per step).
* ring + sink: the default cached decoder (`new_cache(ring=True, sink=True)`): bos kept in a sink
  slot, shown to each query at distance W-1, plus a ring of the last W-1 positions.
* plain ring: `sink=False`, the last W positions; bos falls out of view at step W.

Inside the context (steps 0..W-1) all three are the same causal computation. The table gives
the mean NLL per position bucket: all steps before the boundary, the last W/4 before it (contexts
of 3W/4..W, the fair baseline), the first W/4 after it, and later. A cliff shows as a jump of the
"first W/4 after" column over "last W/4 before". It also gives the mean KL divergence of each
cached decoder's next-token distribution from the recompute's (nats/token): how far each drifts
from the training distribution's answer (with one layer, ring + sink gives exactly 0).

Sequences: the first `--files` files of the split whose pattern sequence holds W + after steps,
cut to that length. If fewer are that long, the split's files are concatenated in order and cut
into `--files` sequences, and the output says so (the jumps at file joins are then in the data).

Cost: the recompute does `after` forwards of W positions per sequence; the two caches one
position each. Needs a RoPE LM (the ring caches need RoPE).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

from lm import MultiCodebookLM
from lm.data import TokenFiles
from lm.generate import fresh_window
from lm.training import check_fingerprint
from rvqlm_core.token_shards import TokenShards

MODES = ("recompute", "ring + sink", "plain ring")


def load_sequences(lm: MultiCodebookLM, tokens_dir: str, split: str, split_by: str, n_files: int,
                   n_steps: int) -> tuple[torch.Tensor, str]:
    """-> codes [N, N_c, T] of N <= n_files sequences whose pattern sequence is n_steps long, and a note
    on where they came from."""
    cfg, pattern = lm.config, lm.pattern
    shards = TokenShards.open(tokens_dir)
    check_fingerprint(cfg.codec_fingerprint, shards.fingerprint, tokens_dir)
    if (shards.n_codebooks, shards.codebook_size) != (cfg.n_codebooks, cfg.codebook_size):
        raise ValueError(f"{tokens_dir} holds {shards.n_codebooks} codebooks of {shards.codebook_size} codes, "
                         f"the LM models {cfg.n_codebooks} of {cfg.codebook_size}")
    files = TokenFiles.of_split(tokens_dir, split, split_by, shards=shards)
    n_frames = n_steps - (pattern.sequence_length(n_steps) - n_steps)  # the pattern adds a fixed number of steps
    entries = [shards.entries[i] for i in files.entry_indices]
    long_enough = [e for e in entries if e.n_frames >= n_frames][:n_files]
    if long_enough:
        rows = [shards.read(e, 0, n_frames) for e in long_enough]
        note = (f"{len(rows)} {split} file(s) of >= {n_frames} frames, each cut to {n_frames} frames "
                f"({sum(e.n_frames >= n_frames for e in entries)} of {len(entries)} are that long)")
    else:
        stream = np.concatenate([shards.read(e) for e in entries])
        n_rows = min(n_files, len(stream) // n_frames)
        if n_rows == 0:
            raise ValueError(f"the {split} split of {tokens_dir} holds {len(stream)} frames in all, fewer than the "
                             f"{n_frames} one sequence of {n_steps} steps needs; lower --after")
        rows = [stream[i * n_frames:(i + 1) * n_frames] for i in range(n_rows)]
        note = (f"no {split} file has {n_frames} frames (the longest has {max(e.n_frames for e in entries)}): "
                f"CONCATENATED the {len(entries)} files in order and cut {n_rows} sequence(s) of {n_frames} frames; "
                "file joins are inside them")
    codes = torch.from_numpy(np.stack(rows).astype(np.int64))  # [N, T, N_c]
    return rearrange(codes, "n t c -> n c t").contiguous(), note


class StepScores:
    """Per pattern step, summed over sequences and codebooks: NLL and KL from the reference, and valid targets."""

    def __init__(self, n_steps: int):
        self.nll = {m: np.zeros(n_steps) for m in MODES}
        self.kl = {m: np.zeros(n_steps) for m in MODES}
        self.count = np.zeros(n_steps)

    def add(self, step: int, logits: dict[str, torch.Tensor], targets: torch.Tensor, valid: torch.Tensor) -> None:
        """logits: mode -> [N, N_c, V]; targets, valid [N, N_c] for this step."""
        ref = F.log_softmax(logits["recompute"].float(), dim=-1)
        for mode, lg in logits.items():
            logp = F.log_softmax(lg.float(), dim=-1)
            nll = -logp.gather(-1, targets.clamp(min=0, max=lg.shape[-1] - 1)[..., None])[..., 0]
            kl = (ref.exp() * (ref - logp)).sum(-1).clamp(min=0)  # >= 0; float rounding can dip below
            self.nll[mode][step] += float(nll[valid].sum())
            self.kl[mode][step] += float(kl[valid].sum())
        self.count[step] += float(valid.sum())

    def bucket(self, table: dict[str, np.ndarray], mode: str, lo: int, hi: int) -> float:
        n = self.count[lo:hi].sum()
        return float(table[mode][lo:hi].sum() / n) if n else float("nan")


def score(lm: MultiCodebookLM, codes: torch.Tensor, chunk: int) -> StepScores:
    """Teacher-force codes [N, N_c, T] through the three decoders and score every step."""
    cfg, w = lm.config, lm.config.max_seq_len
    seq, valid = lm.pattern.build(codes, None, cfg.pad_id)  # [N, N_c, S]
    inputs = torch.cat([torch.full_like(seq[..., :1], cfg.bos_id), seq[..., :-1]], dim=-1)
    n, _, n_steps = seq.shape
    scores = StepScores(n_steps)
    caches = {"ring + sink": lm.new_cache(n, w, ring=True, sink=True), "plain ring": lm.new_cache(n, w, ring=True)}
    # Inside the context: one causal forward each (the caches are filled by it).
    inside = {"recompute": lm(inputs[..., :w])}
    inside.update({mode: lm(inputs[..., :w], cache=cache) for mode, cache in caches.items()})
    for s in range(w):
        scores.add(s, {m: lg[:, :, s] for m, lg in inside.items()}, seq[..., s], valid[..., s])
    # Past it: the caches step one position at a time; the recompute runs `chunk` fresh windows per forward.
    for s0 in range(w, n_steps, chunk):
        steps = range(s0, min(s0 + chunk, n_steps))
        windows = torch.cat([fresh_window(inputs, s, w) for s in steps])  # [len(steps) * N, N_c, W]
        fresh = rearrange(lm(windows)[:, :, -1], "(k n) c v -> k n c v", n=n)
        for i, s in enumerate(steps):
            step_logits = {"recompute": fresh[i]}
            step_logits.update({m: lm(inputs[..., s:s + 1], cache=c)[:, :, -1] for m, c in caches.items()})
            scores.add(s, step_logits, seq[..., s], valid[..., s])
    return scores


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm", required=True, help="a saved LM folder (save_pretrained)")
    ap.add_argument("--tokens", required=True, help="token folder of `rvqlm tokenize` (the LM's codec)")
    ap.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    ap.add_argument("--split-by", default="prefix", choices=["prefix", "hash"])
    ap.add_argument("--files", type=int, default=4, help="sequences to score (default 4)")
    ap.add_argument("--after", type=int, default=None, help="steps past the boundary (default W = max_seq_len)")
    ap.add_argument("--chunk", type=int, default=16, help="fresh windows per recompute forward (default 16)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(max(args.threads, 1))

    try:
        lm = MultiCodebookLM.from_pretrained(args.lm).eval()
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    cfg, w = lm.config, lm.config.max_seq_len
    if lm.rope is None:
        raise SystemExit(f"error: the ring caches need a RoPE LM; {args.lm} uses {cfg.pos} positions")
    after = w if args.after is None else args.after
    if after < 4 or args.files < 1 or args.chunk < 1:
        raise SystemExit("error: --after must be >= 4, --files and --chunk >= 1")
    try:
        codes, note = load_sequences(lm, args.tokens, args.split, args.split_by, args.files, w + after)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    quarter = max(w // 4, 1)
    print(f"LM {args.lm}: {lm.num_parameters() / 1e6:.2f}M parameters, {cfg.n_layers} layers, N_c={cfg.n_codebooks}, "
          f"|V|={cfg.codebook_size}, {cfg.pattern} pattern, window W=max_seq_len={w} steps")
    print(f"data: {note}; {w + after} steps each (boundary at step {w}), torch threads {torch.get_num_threads()}")

    t0 = time.perf_counter()
    with torch.inference_mode():
        scores = score(lm, codes, args.chunk)
    elapsed = time.perf_counter() - t0

    buckets = {"all before": (0, w), "last W/4 before": (w - quarter, w),
               "first W/4 after": (w, w + quarter), "later": (w + quarter, w + after)}
    result = {"lm": str(args.lm), "tokens": str(args.tokens), "data": note, "window": w, "steps": w + after,
              "sequences": int(codes.shape[0]), "buckets": {k: list(v) for k, v in buckets.items()},
              "nll": {}, "kl_from_recompute": {}, "seconds": round(elapsed, 1)}
    head = f"{'':24}" + "".join(f"{name:>17}" for name in buckets) + f"{'jump':>9}"
    print(f"\nmean NLL, nats/token (steps: {', '.join(f'{k} {lo}..{hi - 1}' for k, (lo, hi) in buckets.items())})")
    print(head + "\n" + "-" * len(head))
    for mode in MODES:
        row = {k: scores.bucket(scores.nll, mode, lo, hi) for k, (lo, hi) in buckets.items()}
        result["nll"][mode] = row
        jump = row["first W/4 after"] - row["last W/4 before"]
        print(f"{mode:24}" + "".join(f"{v:17.4f}" for v in row.values()) + f"{jump:+9.4f}")
    print("\nmean KL(recompute || cached), nats/token (0 inside the context: the same computation)")
    print(head[:-9] + "\n" + "-" * (len(head) - 9))
    for mode in MODES[1:]:
        row = {k: scores.bucket(scores.kl, mode, lo, hi) for k, (lo, hi) in buckets.items()}
        result["kl_from_recompute"][mode] = row
        print(f"{mode:24}" + "".join(f"{v:17.5f}" for v in row.values()))
    print(f"\njump = first W/4 after - last W/4 before. The recompute row is the reference: its jump is the data's "
          f"own (what those positions hold); a cliff is a cached row jumping more. {elapsed:.1f} s")
    if args.json is not None:
        from rvqlm_core.atomic import atomic_write_text

        atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
