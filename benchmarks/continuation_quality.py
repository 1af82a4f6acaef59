"""LM continuation quality: how the LM scores held-out speech, and what it makes of held-out prompts
under a few sampling settings.

    .venv/bin/python benchmarks/continuation_quality.py --lm DIR --codec DIR --tokens DIR [--split test]
        [--prompts 8] [--prompt-seconds 3] [--seconds 6] [--seed 0] [--json out.json]

--tokens is a token folder of the corpus made with this codec (`rvqlm tokenize`, or the demo's),
whose files keep the corpus's `train/ valid/ test/` prefixes.

Held-out NLL (printed once, it does not depend on sampling): `lm.training.held_out_report` on the
split's token files, in nats per token (all codebooks), next to the unigram baseline of the train
split on the same targets when the folder has one.

Prompts: the first `--prompt-seconds` of up to `--prompts` files of the split that are at least
that long, evenly spread over the split's files. Each sampling setting continues all of them by
`--seconds` in one batched `lm.generate.generate` call (seeded):

    greedy | temperature 1.0 | temperature 0.8, top-k 250 | temperature 0.9, top-p 0.95

and a last row, "held-out audio", measures the real tokens that follow each prompt in its file
(up to `--seconds`; files with no frames after the prompt are left out of that row): what the
model's continuations should look like.

Columns (means over prompts):
* NLL (nats/token): what the LM assigns to the continuation's tokens (all codebooks) given the
  prompt, `model.log_likelihood`'s per-token terms on the continuation frames only (within the
  last context-length window of frames when prompt + continuation is longer). Its own
  samples at temperature 1 should score about the held-out NLL; far lower means it settled into
  something very predictable (silence, loops).
* rep share: `rvqlm.quality.metrics.repetition(...).share` on codebook 0 with n-grams of `--ngram` frames
  (default 8 = 160 ms at 50 Hz): the share of the continuation's n-grams that copy an earlier one
  (prompt included). 0 for fresh material, 1 for a pure loop.
* longest rep (s): the longest span of the continuation (codebook 0) that copies an earlier span.
* silence: share of 20 ms frames of the decoded continuation below `--silence-dbfs` (-40 dBFS).
  The continuation is decoded together with its prompt (so the decoder sees
  the prompt's frames) and cut at the prompt's end.
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from dataclasses import dataclass

import numpy as np
import torch

from lm.sampling import SamplingOptions
from rvqlm.cli import run_script
from rvqlm.quality.metrics import repetition, silence_share


@dataclass(frozen=True)
class Setting:
    name: str
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    greedy: bool = False


SETTINGS = (Setting("greedy", greedy=True), Setting("T=1.0", 1.0), Setting("T=0.8 top-k 250", 0.8, top_k=250),
            Setting("T=0.9 top-p 0.95", 0.9, top_p=0.95))
REAL = "held-out audio"


# ---- measures -------------------------------------------------------------------------------------

@torch.inference_mode()
def continuation_nll(model, codes: torch.Tensor, start: int) -> torch.Tensor:
    """Mean NLL (nats/token) the LM gives frames `start:` of codes [B, N_c, T], all codebooks -> [B].

    The model's per-position terms (those `log_likelihood` sums) are put back in frame order with
    the pattern's `revert` and averaged over the continuation frames: with the delay pattern a
    frame's codebooks sit at different steps, so this is not a difference of two log_likelihood
    calls. Longer than the LM's context, only the last `max_frames` frames are scored (the
    earlier ones are their context).
    """
    cfg = model.config
    t = codes.shape[-1]
    if not 0 <= start < t:
        raise ValueError(f"start must be in 0..{t - 1}, got {start}")
    if t > cfg.max_frames:
        codes, start = codes[..., t - cfg.max_frames:], max(start - (t - cfg.max_frames), 0)
    nll, _ = model.token_nll(codes)  # [B, N_c, S]
    return model.pattern.revert(nll)[..., start:].mean(dim=(1, 2))  # [B, N_c, T] -> [B]


@dataclass
class Measured:
    """Per-prompt measures of one row."""

    nll: list[float]
    rep_share: list[float]
    longest_s: list[float]
    silence: list[float]

    def means(self) -> dict[str, float]:
        def mean(xs):
            xs = [x for x in xs if not math.isnan(x)]
            return float(np.mean(xs)) if xs else float("nan")

        return {"nll": mean(self.nll), "rep_share": mean(self.rep_share), "longest_rep_s": mean(self.longest_s),
                "silence": mean(self.silence), "prompts": len(self.nll)}


def measure(model, codec, rows: list[torch.Tensor], start: int, ngram: int, silence_dbfs: float) -> Measured:
    """rows: codes [N_c, T_i] each, frames :start the prompt, start: the continuation."""
    out = Measured([], [], [], [])
    same_length = len({r.shape[-1] for r in rows}) == 1
    batches = [torch.stack(rows)] if same_length else [r[None] for r in rows]
    for codes in batches:  # [B, N_c, T]
        out.nll += continuation_nll(model, codes, start).tolist()
        audio = codec.decode(codes)[:, 0, start * codec.hop_length:].float().cpu().numpy()  # [B, S]
        for row, wav in zip(codes, audio):
            rep = repetition(row[0].cpu().numpy(), start, n=ngram)
            out.rep_share.append(rep.share)
            out.longest_s.append(rep.longest / codec.frame_rate)
            out.silence.append(silence_share(wav, codec.sample_rate, threshold_dbfs=silence_dbfs))
    return out


# ---- prompts --------------------------------------------------------------------------------------

@dataclass
class Prompts:
    codes: torch.Tensor  # [B, N_c, T0]
    real: list[torch.Tensor]  # the real continuation of each file [N_c, T_i] (T_i may be 0)
    paths: list[str]


def held_out_prompts(tokens_dir: str, split: str, count: int, prompt_frames: int, new_frames: int) -> Prompts:
    """The first prompt_frames of up to `count` files of the split (those long enough), evenly spread."""
    from lm.data import TokenFiles
    from rvqlm_core.token_shards import TokenShards

    shards = TokenShards.open(tokens_dir)
    files = TokenFiles.of_split(tokens_dir, split, shards=shards)
    entries = [shards.entries[i] for i in files.entry_indices if shards.entries[i].n_frames >= prompt_frames]
    if not entries:
        raise ValueError(f"no file of the '{split}' split of {tokens_dir} holds {prompt_frames} frames "
                         f"(--prompt-seconds); the longest has {max(files.n_frames)}")
    if len(entries) > count:
        entries = [entries[i * len(entries) // count] for i in range(count)]
    prompts, real = [], []
    for e in entries:
        frames = torch.from_numpy(np.asarray(shards.read(e, 0, min(e.n_frames, prompt_frames + new_frames)),
                                             dtype=np.int64)).T  # [N_c, T]
        prompts.append(frames[:, :prompt_frames])
        real.append(frames)
    return Prompts(torch.stack(prompts), real, [e.path for e in entries])


# ---- the benchmark --------------------------------------------------------------------------------

def check_pairing(model, codec, tokens_dir: str) -> None:
    from rvqlm_core.token_shards import TokenShards

    fp = codec.token_fingerprint()
    if model.config.codec_fingerprint is not None and not codec.accepts_tokens(model.config.codec_fingerprint):
        raise ValueError("codec mismatch: the LM was trained on tokens of codec "
                         f"{model.config.codec_fingerprint[:16]}, "
                         f"the given codec's tokens are {fp[:16]}")
    tokens_fp = TokenShards.open(tokens_dir).fingerprint
    if not codec.accepts_tokens(tokens_fp):
        raise ValueError(f"codec mismatch: {tokens_dir} holds tokens of codec {str(tokens_fp)[:16]}, "
                         f"the given codec is {fp[:16]}")
    if (model.config.n_codebooks, model.config.codebook_size) != (codec.n_codebooks, codec.codebook_size):
        raise ValueError(f"the LM models N_c={model.config.n_codebooks}, |V|={model.config.codebook_size}; "
                         "the codec has "
                         f"N_c={codec.n_codebooks}, |V|={codec.codebook_size}")


def held_out_nll(model, tokens_dir: str, split: str) -> dict:
    """held_out_report, with the unigram baseline when the folder has a train split to fit it on."""
    from lm.training import held_out_report
    from rvqlm_core.token_shards import TokenShards

    has_train = any(e.path.startswith("train/") and e.n_frames for e in TokenShards.open(tokens_dir).entries)
    return held_out_report(model, tokens_dir, split, unigram=has_train)


def run_benchmark(model, codec, prompts: Prompts, new_frames: int, *, seed: int, ngram: int,
                  silence_dbfs: float, settings=SETTINGS, progress: bool = True) -> dict[str, dict]:
    from lm.generate import generate

    start = prompts.codes.shape[-1]
    results = {}
    for s in settings:
        t0 = time.perf_counter()
        codes = generate(model, prompts.codes, new_frames, progress=progress, frame_rate=codec.frame_rate,
                         sampling=SamplingOptions(s.temperature, s.top_k, s.top_p, s.greedy, seed))
        gen_seconds = time.perf_counter() - t0
        results[s.name] = {**measure(model, codec, list(codes), start, ngram, silence_dbfs).means(),
                           "generate_seconds": gen_seconds,
                           "setting": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                                       "greedy": s.greedy}}
    real = [r for r in prompts.real if r.shape[-1] > start]
    if real:
        results[REAL] = measure(model, codec, real, start, ngram, silence_dbfs).means()
        results[REAL]["mean_seconds"] = float(np.mean([r.shape[-1] - start for r in real])) / codec.frame_rate
    return results


def format_table(results: dict[str, dict]) -> str:
    head = f"{'sampling':<20} {'NLL nats/tok':>12} {'rep share':>9} {'longest rep s':>13} {'silence':>8} {'prompts':>7}"
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        lines.append(f"{name:<20} {r['nll']:>12.3f} {r['rep_share']:>9.3f} {r['longest_rep_s']:>13.2f} "
                     f"{r['silence']:>8.3f} {r['prompts']:>7d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lm", required=True, help="a saved LM folder (MultiCodebookLM.save_pretrained)")
    p.add_argument("--codec", required=True, help="the codec folder whose tokens the LM models")
    p.add_argument("--tokens", required=True, help="a token folder of the corpus, made with that codec")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-seconds", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=6.0, help="continuation length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ngram", type=int, default=8, help="n-gram length (frames) of the repetition share")
    p.add_argument("--silence-dbfs", type=float, default=-40.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core machine)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    for name in ("prompts", "threads", "ngram"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if not args.prompt_seconds > 0 or not args.seconds > 0:
        p.error("--prompt-seconds and --seconds must be > 0")
    torch.set_num_threads(args.threads)

    from codec import Codec
    from lm import MultiCodebookLM

    t0 = time.perf_counter()
    model = MultiCodebookLM.from_pretrained(args.lm).eval()
    codec = Codec.from_pretrained(args.codec).eval()
    check_pairing(model, codec, args.tokens)
    prompt_frames = max(1, round(args.prompt_seconds * codec.frame_rate))
    new_frames = max(1, round(args.seconds * codec.frame_rate))
    report = held_out_nll(model, args.tokens, args.split)
    prompts = held_out_prompts(args.tokens, args.split, args.prompts, prompt_frames, new_frames)
    results = run_benchmark(model, codec, prompts, new_frames, seed=args.seed, ngram=args.ngram,
                            silence_dbfs=args.silence_dbfs, progress=not args.no_progress)
    wall = time.perf_counter() - t0

    baseline = f" (unigram baseline {report['unigram_nll']:.3f})" if "unigram_nll" in report else ""
    print(f"LM {args.lm}, codec {args.codec} ({codec.fingerprint()[:12]}), tokens {args.tokens}/{args.split}")
    print(f"held-out NLL: {report['nll']:.3f} nats/token{baseline} over {report['files']} files, "
          f"{sum(report['tokens_per_codebook'])} tokens")
    print(f"{len(prompts.paths)} prompts of {prompt_frames / codec.frame_rate:g} s continued by "
          f"{new_frames / codec.frame_rate:g} s (seed {args.seed}); repetition on codebook 0, {args.ngram}-grams; "
          f"silence below {args.silence_dbfs:g} dBFS in 20 ms frames")
    print(format_table(results))
    if REAL in results:
        print(f"{REAL}: the real tokens after each prompt, {results[REAL]['mean_seconds']:.2f} s on average "
              f"(files end sooner than prompt + --seconds)")
    print(f"wall time {wall:.0f} s")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(args.json, {
            "lm": str(args.lm), "codec": str(args.codec), "codec_fingerprint": codec.fingerprint(),
            "tokens": str(args.tokens), "split": args.split, "held_out": report, "prompts": prompts.paths,
            "prompt_seconds": prompt_frames / codec.frame_rate, "seconds": new_frames / codec.frame_rate,
            "seed": args.seed, "ngram": args.ngram, "silence_dbfs": args.silence_dbfs, "rows": results,
            "wall_seconds": wall, "torch_threads": torch.get_num_threads(), "machine": platform.platform()})
    return 0


if __name__ == "__main__":
    run_script(main, "continuation_quality")
