"""Does a conditioned LM read its text and speaker? Issue 20's four measurements on a held-out split.

    .venv/bin/python benchmarks/conditioning.py --lm DIR --codec DIR --tokens DIR [--corpus DIR]
        [--split test] [--gain-files 0] [--head-seconds 1] [--max-files 16] [--cfg 1 2 3 5]
        [--voices font_small font_big] [--seed 0] [--max-seconds 12] [--threads 1] [--json FILE]
        [--monotonic | --no-monotonic] [--speaker-cfg S] [--top-k K] [--top-p P] [--temperature T]

--tokens: the corpus tokenized with the codec (`rvqlm tokenize`; its manifest carries each file's
text and speaker); --corpus: the audio folder it came from (the real recordings). Needs librosa
(pYIN) and speechmos (DNSMOS): `make bench-setup`. Standard errors (se) are across files.

1. Conditioning gain. Every file of the split that has a text (or --gain-files, evenly spread), each
   scored (NLL in nats per code token, all codebooks and per codebook; end-of-audio targets left
   out) with its true text and speaker, with the texts shuffled between files (a cyclic shift over
   a random order, so no file keeps its own), with the speakers swapped (the two --voices
   exchanged, any other speaker replaced by a random other one of the model's table), and with
   null conditions. Each file's NLL is its windows' (context-length windows, text on the first as
   in training); the table gives the paired difference to the true condition and its se, over whole
   files and over their first --head-seconds (where the audio has not yet shown who speaks).
2. Voice. Up to --max-files lines spoken by the two --voices (half each, evenly spread), each
   generated from its text alone (no audio prompt, plain sampling or --top-k / --top-p / --temperature,
   seeded) in each voice at every --cfg scale (the speaker's own scale: --speaker-cfg, lm.guidance)
   and decoded by the codec; pYIN median F0 of each clip (rvqlm.quality.metrics.pitch_track) against the
   median over that speaker's real recordings of the chosen lines, in semitones, and the distance
   between the two generated voices against the real one; how many clips are voiced (0.1 s of voiced
   frames: the clips a median is taken over) and their share of voiced frames, beside each speaker's
   share in the real recordings and in their codec reconstructions.
3. Length. Pearson r between each line's real duration and the duration generated for its text in
   the line's own voice (a row that never chose its end stops at --max-seconds: counted), beside
   the r of the real durations against the texts' byte counts alone; with the reading window, how
   many of the bytes it crossed were pushes and how many ends it forced (the rest: the model's).
4. CFG sweep. DNSMOS OVRL of the generated clips at each scale, next to the chosen lines' real
   recordings and their codec reconstructions (decoded from the token folder).
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lm.ar_decode import ARDecoding
from lm.conditioning import Condition
from lm.sampling import SamplingOptions
from rvqlm.cli import run_script

VARIANTS = ("true", "texts shuffled", "speakers swapped", "null")


def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error, n) over the finite values (nan where there are too few)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(x) == 0:
        return float("nan"), float("nan"), 0
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan"), len(x)


def semitones(f0: float, reference: float) -> float:
    return 12.0 * math.log2(f0 / reference) if f0 > 0 and reference > 0 else float("nan")


def pearson(x, y) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def nan_median(values) -> float:
    x = [v for v in values if math.isfinite(v)]
    return float(np.median(x)) if x else float("nan")


def evenly(items: list, n: int) -> list:
    return items if len(items) <= n else [items[i * len(items) // n] for i in range(n)]


# ---- 1. conditioning gain ----------------------------------------------------------------------------

def shuffled(values: list, rng: np.random.Generator) -> list:
    """values moved along a cyclic shift of a random order: no position keeps its own (n >= 2)."""
    order = rng.permutation(len(values))
    out = list(values)
    for i, j in zip(order, np.roll(order, -1)):
        out[i] = values[j]
    return out


def swapped(speakers: list[str], voices: tuple[str, str], table: list[str], rng: np.random.Generator) -> list[str]:
    """The two voices exchanged; any other speaker replaced by a random other one of `table`."""
    a, b = voices
    out = []
    for s in speakers:
        others = [t for t in table if t != s]
        out.append(b if s == a else a if s == b else "" if not s or not others else str(rng.choice(others)))
    return out


@torch.inference_mode()
def nll_by_file(model, shards, entries: list[int], texts: list[str], speakers: list[str], batch_size: int = 8,
                head_frames: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Summed code NLL and target counts per file and codebook ([F, N_c] each) of the files `entries`
    under the given conditions (one text and speaker per file; the text on each file's first window),
    then the same two over each file's first `head_frames` frames only."""
    cfg = model.config
    window = cfg.max_frames
    spans = [(f, start, min(window, shards.entries[e].n_frames - start))
             for f, e in enumerate(entries) for start in range(0, shards.entries[e].n_frames, window)]
    nll, count, head_nll, head_count = (np.zeros((len(entries), cfg.n_codebooks)) for _ in range(4))
    delays = torch.tensor(model.pattern.delays(), device=model.device)[:, None]
    for i in range(0, len(spans), batch_size):
        chunk = spans[i:i + batch_size]
        codes = torch.zeros(len(chunk), cfg.n_codebooks, max(n for _, _, n in chunk), dtype=torch.long)
        mask = torch.zeros(len(chunk), codes.shape[-1], dtype=torch.bool)
        for row, (f, start, n) in enumerate(chunk):
            codes[row, :, :n] = torch.from_numpy(np.asarray(shards.read(shards.entries[entries[f]], start, n),
                                                            dtype=np.int64)).T
            mask[row, :n] = True
        condition = model.condition_inputs([texts[f] if start == 0 and texts[f] else None for f, start, _ in chunk],
                                           [speakers[f] or None for f, _, _ in chunk], len(chunk))
        out, valid = model.token_nll(codes.to(model.device), mask.to(model.device), condition)
        steps = torch.arange(out.shape[-1], device=out.device)[None, :]
        for row, (f, start, _) in enumerate(chunk):
            nll[f] += out[row].sum(dim=-1).double().cpu().numpy()
            count[f] += valid[row].sum(dim=-1).cpu().numpy()
            in_head = steps < max(head_frames - start, 0) + delays  # [N_c, S]: the step of frame t of k is t + delay
            head_nll[f] += (out[row] * in_head).sum(dim=-1).double().cpu().numpy()
            head_count[f] += (valid[row] & in_head).sum(dim=-1).cpu().numpy()
    return nll, count, head_nll, head_count


def conditioning_gain(model, shards, files, voices: tuple[str, str], n: int, seed: int, head_frames: int) -> dict:
    """Measurement 1 over up to n files (0: all) of `files` (a TokenFiles) that have a text, over whole
    files and over their first `head_frames` frames."""
    with_text = [i for i, t in enumerate(files.texts) if t]
    keep = evenly(with_text, n) if n > 0 else with_text
    if len(keep) < 2:
        raise ValueError(f"the split has {len(keep)} file(s) with a text; the conditioning gain needs at least 2")
    rng = np.random.default_rng(seed)
    texts, speakers = [files.texts[i] for i in keep], [files.speakers[i] for i in keep]
    variants = {"true": (texts, speakers), "texts shuffled": (shuffled(texts, rng), speakers),
                "speakers swapped": (texts, swapped(speakers, voices, model.config.condition.speakers, rng)),
                "null": ([""] * len(keep), [""] * len(keep))}
    entries = [files.entry_indices[i] for i in keep]
    per_file = {}
    for name, (t, s) in variants.items():
        nll, count, head_nll, head_count = nll_by_file(model, shards, entries, t, s, head_frames=head_frames)
        per_file[name] = {"all": nll.sum(1) / count.sum(1), "codebook": nll / np.maximum(count, 1),
                          "head": head_nll.sum(1) / head_count.sum(1)}
    rows = {}
    for name in VARIANTS:
        mean, se, _ = mean_se(per_file[name]["all"])
        diff, diff_se, _ = mean_se(per_file[name]["all"] - per_file["true"]["all"])
        head, head_se, _ = mean_se(per_file[name]["head"] - per_file["true"]["head"])
        rows[name] = {"nll": mean, "se": se, "minus_true": diff, "minus_true_se": diff_se,
                      "z": diff / diff_se if diff_se > 0 else float("nan"),
                      "per_codebook": per_file[name]["codebook"].mean(0).tolist(),
                      "head_minus_true": head, "head_minus_true_se": head_se,
                      "head_z": head / head_se if head_se > 0 else float("nan")}
    unchanged = sum(a == b for a, b in zip(texts, variants["texts shuffled"][0]))
    return {"files": len(keep), "head_frames": head_frames, "rows": rows, "shuffled_texts_unchanged": unchanged}


# ---- 2-4. generation -------------------------------------------------------------------------------

@dataclass
class Clip:
    line: int  # index into the chosen lines
    voice: str
    seconds: float
    ended: bool  # chose its end-of-audio token before the length limit
    f0: float  # median F0 over its voiced frames (nan: too few)
    dnsmos: float  # OVRL
    voiced: float = float("nan")  # share of its 10 ms frames that pYIN calls voiced


def clip_scores(wav: np.ndarray, sample_rate: int) -> tuple[float, float, float]:
    """(median F0 in Hz over the voiced 10 ms frames, nan below 10; DNSMOS OVRL; voiced share of the
    frames) of a 16 kHz clip."""
    from rvqlm.quality.metrics import dnsmos, pitch_track

    if len(wav) < sample_rate // 10:
        return float("nan"), float("nan"), 0.0
    f0, voiced = pitch_track(wav, sample_rate)
    median = float(np.median(f0[voiced])) if voiced.sum() >= 10 else float("nan")
    return median, dnsmos(wav, sample_rate)["dnsmos_ovrl"], float(voiced.mean())


@contextmanager
def logged_reading():
    """While open, every lm.alignment.ReadingWindow that AR decoding (lm.ar_decode) makes logs each step's bytes
    crossed, push and forced end ([R] each); yields the list of windows made."""
    import lm.ar_decode as decoding

    made = []

    class Logged(decoding.ReadingWindow):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.log: list[tuple[Tensor, Tensor, Tensor]] = []
            made.append(self)

        def after(self, logits: Tensor) -> Tensor:
            before = self.pos.floor()
            out = super().after(logits)
            self.log.append((self.pos.floor() - before, self.pushed.clone(), self.forced.clone()))
            return out

    plain, decoding.ReadingWindow = decoding.ReadingWindow, Logged
    try:
        yield made
    finally:
        decoding.ReadingWindow = plain


def reading_summary(window, lengths: Tensor, max_frames: int) -> dict:
    """Of each row's steps up to the one that chose its end (step = its length): the bytes the reading
    position crossed and how many of them were pushes, and how the rows ended (forced, chosen, capped)."""
    crossed, pushed, forced = (torch.stack([step[k] for step in window.log], 1)[:len(lengths)] for k in range(3))
    live = torch.arange(crossed.shape[1])[None] <= lengths[:, None]
    ended = lengths < max_frames
    at_end = forced.gather(1, lengths.clamp_max(crossed.shape[1] - 1)[:, None])[:, 0] & ended
    bytes_crossed = float((crossed * live).sum())
    return {"bytes_crossed": bytes_crossed, "pushed_share": float((pushed & live).sum()) / max(bytes_crossed, 1.0),
            "ends_forced": int(at_end.sum()), "ends_chosen": int((ended & ~at_end).sum()),
            "capped": int((~ended).sum())}


def sampling_options(args) -> dict:
    """The sampling filters asked for on the command line, as lm.generate's keywords."""
    return {"top_k": args.top_k, "top_p": args.top_p, "temperature": args.temperature}


def sampling_label(args) -> str:
    """'plain sampling', or the filters and temperature in use."""
    parts = [f"top-k {args.top_k}"] if args.top_k is not None else []
    parts += [f"top-p {args.top_p:g}"] if args.top_p is not None else []
    parts += [f"temperature {args.temperature:g}"] if args.temperature != 1.0 else []
    return ", ".join(parts) or "plain sampling"


def generated_clips(model, codec, texts: list[str], voices: tuple[str, str], scale: float, max_frames: int,
                    seed: int, monotonic: bool | None = None, speaker_scale: float | None = None,
                    sampling: dict | None = None) -> tuple[list[Clip], dict | None]:
    """Every text in every voice, generated at guidance `scale` (the speaker's: `speaker_scale`, None: the
    same) in one batched call and decoded (monotonic: lm.generate's reading window; None: the LM's
    default; sampling: lm.generate's top_k, top_p, temperature) -> clips, the reading summary (None without
    the window)."""
    from lm.generate import generate

    rows = [(i, v) for i in range(len(texts)) for v in voices]
    with logged_reading() as windows:
        codes, lengths = generate(model, None, max_frames, return_lengths=True,
                                  sampling=SamplingOptions(seed=seed, cfg_scale=scale, speaker_cfg_scale=speaker_scale,
                                                           **(sampling or {})),
                                  condition=Condition([texts[i] for i, _ in rows], [v for _, v in rows]),
                                  options=ARDecoding(monotonic=monotonic))
    reading = reading_summary(windows[-1], lengths, max_frames) if windows else None
    clips = []
    for r, (i, v) in enumerate(rows):
        n = int(lengths[r])
        wav = np.zeros(0, np.float32)
        if n > 0:
            with torch.inference_mode():
                wav = codec.decode(codes[r:r + 1, :, :n])[0, 0].float().cpu().numpy()
        f0, ovrl, voiced = clip_scores(wav, codec.sample_rate)
        clips.append(Clip(i, v, n / codec.frame_rate, n < max_frames, f0, ovrl, voiced))
    return clips, reading


def pick_lines(files, voices: tuple[str, str], n: int) -> list[int]:
    """Up to n files with a text spoken by one of the voices, half each, evenly spread."""
    per_voice = [evenly([i for i, (t, s) in enumerate(zip(files.texts, files.speakers)) if t and s == v],
                        -(-n // 2)) for v in voices]
    chosen = sorted(per_voice[0] + per_voice[1])[:n]
    if not chosen:
        raise ValueError(f"no file of the split has a text spoken by {' or '.join(voices)}")
    return chosen


def real_clips(codec, shards, files, lines: list[int], corpus: str) -> dict[str, list]:
    """The chosen lines' recordings (from the corpus) and codec reconstructions (from the tokens):
    per line its speaker, seconds, median F0 and DNSMOS OVRL of each."""
    from pathlib import Path

    from codec.core.audio import load_audio

    out = {"speaker": [], "seconds": [], "f0": [], "dnsmos": [], "voiced": [], "recon_dnsmos": [], "recon_voiced": []}
    for i in lines:
        path = Path(corpus) / files.relpaths[i]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the recording of token file {files.relpaths[i]} is not in --corpus")
        f0, ovrl, voiced = clip_scores(load_audio(path, codec.sample_rate, 1)[0].numpy(), codec.sample_rate)
        entry = shards.entries[files.entry_indices[i]]
        codes = torch.from_numpy(np.asarray(shards.read(entry), dtype=np.int64)).T[None]
        with torch.inference_mode():
            recon = codec.decode(codes)[0, 0].float().cpu().numpy()
        out["speaker"].append(files.speakers[i])
        out["seconds"].append(entry.n_frames / codec.frame_rate)
        out["f0"].append(f0)
        out["dnsmos"].append(ovrl)
        out["voiced"].append(voiced)
        _, recon_ovrl, recon_voiced = clip_scores(recon, codec.sample_rate)
        out["recon_dnsmos"].append(recon_ovrl)
        out["recon_voiced"].append(recon_voiced)
    return out


def summarize(clips: list[Clip], real: dict, voices: tuple[str, str]) -> dict:
    """One --cfg scale's voice, length and quality figures (see the module docstring)."""
    real_f0 = {v: nan_median([f for f, s in zip(real["f0"], real["speaker"]) if s == v]) for v in voices}
    out = {"voices": {}}
    for v in voices:
        mine = [c.f0 for c in clips if c.voice == v]
        offsets = [semitones(f, real_f0[v]) for f in mine]
        median = nan_median(mine)
        out["voices"][v] = {"median_f0": median, "real_median_f0": real_f0[v],
                            "offset_st": semitones(median, real_f0[v]), "offset_se": mean_se(offsets)[1],
                            "voiced_clips": int(sum(math.isfinite(f) for f in mine)), "clips": len(mine),
                            "voiced_frames": mean_se([c.voiced for c in clips if c.voice == v])[0]}
    a, b = (out["voices"][v]["median_f0"] for v in voices)
    out["voice_distance_st"] = semitones(a, b)
    out["real_voice_distance_st"] = semitones(real_f0[voices[0]], real_f0[voices[1]])
    own = [c for c in clips if c.voice == real["speaker"][c.line]]
    out["length_r"] = pearson([real["seconds"][c.line] for c in own], [c.seconds for c in own])
    out["length_lines"] = len(own)
    out["mean_seconds"], out["real_mean_seconds"] = mean_se([c.seconds for c in own])[0], mean_se(real["seconds"])[0]
    out["ended_share"] = float(np.mean([c.ended for c in clips]))
    out["dnsmos"], out["dnsmos_se"], _ = mean_se([c.dnsmos for c in clips])
    return out


# ---- the script ------------------------------------------------------------------------------------

def load_pair(args):
    """The conditioned LM, the codec and the token folder, checked to belong together."""
    from codec import Codec
    from lm import MultiCodebookLM
    from lm.training import check_fingerprint
    from rvqlm_core.token_shards import TokenShards

    model = MultiCodebookLM.from_pretrained(args.lm).eval()
    if model.config.condition is None:
        raise ValueError(f"{args.lm} is not a conditioned LM (no condition encoder): nothing to measure; train "
                         "one with recipes/lm_speech_conditioned.yaml")
    for v in args.voices:
        model.config.condition.speaker_id(v)  # ValueError naming the known speakers
    codec = Codec.from_pretrained(args.codec).eval()
    shards = TokenShards.open(args.tokens)
    check_fingerprint(model.config.codec_fingerprint, shards.fingerprint, args.tokens)
    if not codec.accepts_tokens(shards.fingerprint):
        raise ValueError(f"codec mismatch: {args.tokens} holds tokens of codec {str(shards.fingerprint)[:16]}, "
                         f"the given codec's are {codec.token_fingerprint()[:16]}")
    if codec.sample_rate != 16000 or codec.channels != 1:
        raise ValueError(f"pYIN and DNSMOS are scored on 16 kHz mono here; this codec is {codec.sample_rate} Hz, "
                         f"{codec.channels} channel(s)")
    return model, codec, shards


def run(args) -> dict:
    from lm.data import TokenFiles

    model, codec, shards = load_pair(args)
    files = TokenFiles.of_split(args.tokens, args.split, shards=shards)
    voices = tuple(args.voices)
    gain = conditioning_gain(model, shards, files, voices, args.gain_files, args.seed,
                             head_frames=round(args.head_seconds * codec.frame_rate))
    lines = pick_lines(files, voices, args.max_files)
    real = real_clips(codec, shards, files, lines, args.corpus)
    max_frames = min(int(args.max_seconds * codec.frame_rate), max(int(2 * max(real["seconds"]) * codec.frame_rate), 50))
    texts = [files.texts[i] for i in lines]
    sweep = {}
    for scale in args.cfg:
        t0 = time.perf_counter()
        clips, reading = generated_clips(model, codec, texts, voices, scale, max_frames, args.seed, args.monotonic,
                                         args.speaker_cfg, sampling_options(args))
        sweep[f"{scale:g}"] = {**summarize(clips, real, voices), "reading": reading,
                               "seconds_taken": time.perf_counter() - t0}
    from lm.alignment import reads_in_order

    monotonic = reads_in_order(model.config, args.monotonic)
    bytes_r = pearson(real["seconds"], [len(t.encode("utf-8")) for t in texts])
    return {"gain": gain, "lines": [files.relpaths[i] for i in lines], "texts": texts, "monotonic": monotonic,
            "real_seconds_vs_text_bytes_r": bytes_r,
            "max_generated_seconds": max_frames / codec.frame_rate, "sweep": sweep,
            "real": {"dnsmos": mean_se(real["dnsmos"])[:2], "recon_dnsmos": mean_se(real["recon_dnsmos"])[:2],
                     "mean_seconds": mean_se(real["seconds"])[0],
                     **{key: {v: mean_se([x for x, s in zip(real[of], real["speaker"]) if s == v])[0] for v in voices}
                        for key, of in (("voiced_frames", "voiced"), ("recon_voiced_frames", "recon_voiced"))}}}


def report_lines(result: dict, voices: tuple[str, str]) -> list[str]:
    gain = result["gain"]
    out = [f"1. conditioning gain, NLL nats/token over {gain['files']} files (se across files); whole files, "
           f"then their first {gain['head_frames']} frames",
           f"   {'condition':<18} {'NLL':>7} {'se':>6}" + f" {'- true':>7} {'se':>6} {'z':>6}" * 2]
    for name, r in gain["rows"].items():
        out.append(f"   {name:<18} {r['nll']:7.3f} {r['se']:6.3f} {r['minus_true']:7.3f} {r['minus_true_se']:6.3f} "
                   f"{r['z']:6.1f} {r['head_minus_true']:7.3f} {r['head_minus_true_se']:6.3f} {r['head_z']:6.1f}")
    out.append(f"2-4. {len(result['lines'])} lines generated in each voice ({' / '.join(voices)}), at most "
               f"{result['max_generated_seconds']:.1f} s")
    head = (f"   {'cfg':>4} " + " ".join(f"{v[:11] + ' st':>14}" for v in voices)
            + f" {'dist st':>8} {'length r':>8} {'ended':>6} {'DNSMOS':>7} {'se':>5}   voiced clips, frames")
    out.append(head)
    for scale, s in result["sweep"].items():
        offsets = " ".join(f"{s['voices'][v]['offset_st']:+8.2f}±{s['voices'][v]['offset_se']:<5.2f}" for v in voices)
        voiced = " ".join(f"{s['voices'][v]['voiced_clips']}/{s['voices'][v]['clips']} {s['voices'][v]['voiced_frames']:.2f}"
                          for v in voices)
        out.append(f"   {scale:>4} {offsets} {s['voice_distance_st']:8.2f} {s['length_r']:8.2f} "
                   f"{s['ended_share']:6.2f} {s['dnsmos']:7.2f} {s['dnsmos_se']:5.2f}   {voiced}")
    any_scale = next(iter(result["sweep"].values()))
    real = result["real"]
    out.append(f"   real: voice distance {any_scale['real_voice_distance_st']:.2f} st, median F0 "
               + ", ".join(f"{v} {any_scale['voices'][v]['real_median_f0']:.0f} Hz" for v in voices)
               + f"; DNSMOS {real['dnsmos'][0]:.2f} ± {real['dnsmos'][1]:.2f}, codec reconstruction "
               f"{real['recon_dnsmos'][0]:.2f} ± {real['recon_dnsmos'][1]:.2f}")
    out.append("   voiced frames, real / codec reconstruction: " + ", ".join(
        f"{v} {real['voiced_frames'][v]:.2f} / {real['recon_voiced_frames'][v]:.2f}" for v in voices))
    out.append("   the real durations against the texts' byte counts alone: "
               f"r {result['real_seconds_vs_text_bytes_r']:.2f}")
    for scale, s in result["sweep"].items():
        if s["reading"] is not None:
            r = s["reading"]
            out.append(f"   reading window, cfg {scale}: {r['bytes_crossed']:.0f} bytes crossed, "
                       f"{r['pushed_share']:.0%} of them by pushes; ends chosen {r['ends_chosen']}, "
                       f"forced {r['ends_forced']}, capped {r['capped']}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lm", required=True, help="a conditioned LM folder (recipes/lm_speech_conditioned.yaml)")
    p.add_argument("--codec", required=True, help="the codec whose tokens the LM models")
    p.add_argument("--tokens", required=True, help="the corpus tokenized with that codec (texts and speakers inside)")
    p.add_argument("--corpus", default="data/fillets-cs-16k", help="the audio folder the tokens came from")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--gain-files", type=int, default=0, help="files scored for the conditioning gain (0: all, "
                   "the default)")
    p.add_argument("--head-seconds", type=float, default=1.0, help="the gain is also given over each file's "
                   "first this many seconds, where the audio has not yet shown who speaks (default 1)")
    p.add_argument("--max-files", type=int, default=16, help="lines generated (default 16)")
    p.add_argument("--cfg", type=float, nargs="+", default=[1.0, 2.0, 3.0, 5.0], help="guidance scales")
    p.add_argument("--speaker-cfg", type=float, default=None, metavar="S",
                   help="the speaker's own guidance scale at every --cfg (lm.guidance; default: the same as --cfg)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample each code from its K most probable (default: plain sampling, every code)")
    p.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="then from the fewest codes whose probability sums to P (default: off)")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T",
                   help="divide the guided logits by T before sampling (default 1)")
    p.add_argument("--voices", nargs=2, default=["font_small", "font_big"], help="the two speakers compared")
    p.add_argument("--max-seconds", type=float, default=12.0, help="longest generation (default 12 s)")
    p.add_argument("--monotonic", action=argparse.BooleanOptionalAction, default=None,
                   help="generate with the reading window (lm.alignment.ReadingWindow; default: the LM's default, "
                        "on for an LM trained with guided attention)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.max_files < 2 or args.threads < 1 or not args.max_seconds > 0 or min(args.cfg + [args.speaker_cfg or 0]) < 0:
        p.error("--max-files must be >= 2, --threads >= 1, --max-seconds > 0 and every --cfg and --speaker-cfg >= 0")
    if args.voices[0] == args.voices[1]:
        p.error("--voices must name two different speakers")

    try:
        SamplingOptions(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        p.error(str(e).split(";")[0])  # its hint names rvqlm generate's --greedy, which this script lacks
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    result = run(args)
    wall = time.perf_counter() - t0
    print(f"LM {args.lm}, codec {args.codec}, tokens {args.tokens}/{args.split}, seed {args.seed}, "
          f"monotonic reading {'on' if result['monotonic'] else 'off'}, speaker guidance "
          f"{'as --cfg' if args.speaker_cfg is None else args.speaker_cfg}, "
          f"{sampling_label(args)}")
    print("\n".join(report_lines(result, tuple(args.voices))))
    print(f"wall time {wall:.0f} s")
    if args.json:
        from rvqlm_core.atomic import atomic_write_json

        atomic_write_json(args.json, {**result, "lm": args.lm, "codec": args.codec, "tokens": args.tokens,
                                      "split": args.split, "seed": args.seed, "cfg": args.cfg, "speaker_cfg": args.speaker_cfg,
                                      "top_k": args.top_k, "top_p": args.top_p, "temperature": args.temperature,
                                      "voices": args.voices,
                                      "wall_seconds": wall, "torch_threads": torch.get_num_threads(),
                                      "machine": platform.platform()})
    return 0


if __name__ == "__main__":
    run_script(main, "conditioning")
