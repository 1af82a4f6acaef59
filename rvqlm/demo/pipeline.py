"""`rvqlm demo`: the whole job on the built-in corpus, end to end, on a CPU, in about 10 minutes.

Its stages, each a function a user can also call:

1. `prepare_corpus` (rvqlm/corpora/fillets.py): the built-in corpus (Czech speech, split by level);
2. `load_codec`, `reconstruct`: held-out test lines through the shipped codec at several bitrates,
   and `foreign_speaker_clips` (rvqlm/demo/foreign_clips.py): lines of speakers it never trained on
   (the voices corpus's test split, when `make voices` has prepared it) against Opus 6 kbps;
3. `tokenize_corpus`: the corpus as codec tokens (resumable: a second run reuses them);
4. `demo_lm`: the shipped LM fine-tuned for a few minutes (or a small LM trained when it does not
   fit the codec, or the shipped LM as it is), held-out NLL on the valid split;
5. `continue_prompts`: held-out prompts continued by the LM, decoded by the codec, and
   `say_it_clips` (rvqlm/demo/say_it.py): held-out lines said in both fish voices by the text- and
   speaker-conditioned LM, when one fits the codec;
6. `write_demo_report`: everything in `runs/demo/` (untracked) with a listening report
   (`index.html`) and its tables in `metrics.json`; `--samples samples` regenerates the committed
   example report under `samples/` on purpose.

Every stage reads what the previous one wrote, and every file lands atomically.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rvqlm.demo.foreign_clips import foreign_speaker_clips
from rvqlm.demo.masked import masked_continuations
from rvqlm.demo.report import Section, write_clip
from rvqlm.demo.say_it import say_it_clips
from rvqlm.corpora.voices import DEFAULT_VOICES_DIR

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CODEC = REPO / "models" / "codec-speech-16k"
SHIPPED_LM = REPO / "models" / "lm-speech-16k"
SHIPPED_CONDITIONED_LM = REPO / "models" / "lm-speech-conditioned-16k"
SHIPPED_MASKED_LM = REPO / "models" / "lm-masked-speech-16k"
DEMO_LM_RECIPE = REPO / "recipes" / "lm_demo.yaml"  # from scratch, when no shipped LM fits the codec
FINETUNE_LM_RECIPE = REPO / "recipes" / "lm_speech.yaml"  # the shipped LM's own recipe


@dataclass
class DemoSettings:
    samples_dir: Path = REPO / "runs" / "demo"  # untracked; REPO / "samples" holds the committed example report
    work_dir: Path = REPO / "data" / "demo"
    corpus_dir: Path = REPO / "data" / "fillets-cs-16k"
    corpus_files_per_split: int | None = None  # a quick subset: the first N files of each split
    voices_dir: Path = REPO / DEFAULT_VOICES_DIR  # foreign-speaker clips from its test split, when prepared
    foreign_clips: int = 4  # lines of its test split shown (4: each of its 3 speakers, then one more)
    tokens_dir: Path | None = None  # default data/tokens/fillets-cs-16k-<codec token fingerprint[:12]>
    codec_dir: Path = SHIPPED_CODEC
    lm_init: Path = SHIPPED_LM
    lm_recipe: Path = DEMO_LM_RECIPE
    lm_minutes: float = 4.0  # 0: the shipped LM as it is, no training
    n_prompts: int = 3
    prompt_seconds: float = 3.0
    continuation_seconds: float = 6.0
    # Plain sampling: the one setting whose continuations resemble held-out speech (docs/experiments.md).
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 1
    conditioned_lm: Path = SHIPPED_CONDITIONED_LM  # the "Say it" section, when it fits the codec
    say_it_lines: int = 4  # held-out lines said in both voices (0: leave the section out)
    say_it_cfg: float = 3.0  # guidance: the shipped conditioned LM's voices land nearest the real ones at 3 (valid split)
    masked_lm: Path = SHIPPED_MASKED_LM  # the masked-LM continuations, when it fits the codec


class Narrator:
    """Prints each step with the minutes since the demo started."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def minutes(self) -> float:
        return (time.perf_counter() - self.start) / 60

    def __call__(self, msg: str) -> None:
        print(f"[demo {self.minutes():5.1f} min] {msg}", flush=True)


def run_demo(s: DemoSettings = DemoSettings()) -> Path:
    """Run every stage; returns the path of the listening report."""
    from lm.training import held_out_report
    from rvqlm.corpora.fillets import prepare_corpus
    from rvqlm.corpora.folder import corpus_files, corpus_subset

    say = Narrator()
    torch.manual_seed(s.seed)
    out = Path(s.samples_dir)
    out.mkdir(parents=True, exist_ok=True)

    say("1/6 preparing the built-in corpus")
    corpus = prepare_corpus(s.corpus_dir, 16000)
    if s.corpus_files_per_split is not None:
        n = s.corpus_files_per_split
        corpus = corpus_subset(corpus, Path(s.work_dir) / f"corpus-{n}-per-split", n)

    say(f"2/6 loading the codec from {s.codec_dir}")
    codec = load_codec(s.codec_dir)
    init = shipped_lm_for(s, codec)
    prompts = pick_prompts(corpus_files(corpus, "test"), s.n_prompts, s.prompt_seconds + 1.0)
    recon = reconstruct(codec, prompts, out)
    foreign = foreign_speaker_clips(codec, s.voices_dir, s.foreign_clips, out, say)

    say("3/6 tokenizing the corpus (resumes if already done)")
    tokens_dir = tokenize_corpus(s, corpus, codec)

    say(f"4/6 {_lm_stage_words(s, init)}")
    model = demo_lm(s, codec, tokens_dir, init)
    held_out = held_out_report(model, str(tokens_dir), "valid", unigram=True)

    say("5/6 generating continuations of held-out prompts, and held-out lines from their text")
    continuations = continue_prompts(s, codec, model, prompts, out)
    masked = masked_continuations(codec, s.masked_lm, prompts, s.prompt_seconds, s.continuation_seconds, out,
                                  temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed, say=say)
    said = say_it_clips(codec, s.conditioned_lm, corpus, s.say_it_lines, out, cfg_scale=s.say_it_cfg, seed=s.seed,
                        say=say)

    say("6/6 writing the listening report")
    page = write_demo_report(s, codec, init, [recon, foreign, continuations, masked, said], held_out, say.minutes())
    say(f"done in {say.minutes():.1f} min: open {page}")
    return page


def pick_prompts(files: list[Path], n: int, min_seconds: float) -> list[Path]:
    """The first `n` files (sorted) at least `min_seconds` long, spread over different levels."""
    import soundfile as sf

    chosen, levels = [], set()
    for f in sorted(files):
        if f.parent.name in levels:
            continue
        if sf.info(str(f)).duration >= min_seconds:
            chosen.append(f)
            levels.add(f.parent.name)
        if len(chosen) == n:
            return chosen
    if not chosen:
        raise RuntimeError(f"no held-out file is at least {min_seconds:.1f} s long")
    return chosen


def load_codec(codec_dir: Path):
    """The saved codec at `codec_dir` (rvqlm's own or a Hugging Face EnCodec / DAC / Mimi folder, codec.loading)
    in eval mode; a clear error if there is none."""
    from codec.loading import load_codec as load

    if not Path(codec_dir).is_dir():
        raise FileNotFoundError(f"no codec at {codec_dir}; train one with `rvqlm train-codec --config "
                                "recipes/codec_speech.yaml` and pass its pretrained/ folder with --codec")
    return load(codec_dir)


def reconstruct(codec, prompts: list[Path], out: Path) -> Section:
    """Each prompt file and its reconstructions with 1, N_c / 2 and N_c codebooks, with their bitrate,
    mel distance, STOI and wideband PESQ (after `estimate_lag` alignment: a decoder may make its own
    phase, so no waveform-matching measure such as SI-SDR; "n/a" where pystoi or pesq is missing)."""
    from codec.core.audio import load_audio
    from codec.neural.losses import mel_distance
    from rvqlm.quality.metrics import align, estimate_lag, pesq_wb, stoi

    sr = codec.sample_rate
    ladder = sorted({1, max(1, codec.n_codebooks // 2), codec.n_codebooks})
    done = Section("Codec reconstructions", "Held-out lines through the codec at several bitrates.",
                   table_title="Reconstruction of held-out speech")

    def shown(value: float, digits: int) -> str:
        return "n/a" if value != value else f"{value:.{digits}f}"

    for i, f in enumerate(prompts):
        wav = load_audio(f, sr, codec.channels)  # [C, S]
        name = f"prompt{i + 1}"
        clips = [write_clip(out, f"{name}-original", wav, sr, f"original ({f.parent.name}/{f.name})", {})]
        ref = wav.mean(0).numpy()
        for k in ladder:
            with torch.inference_mode():
                rec = codec.decode(codec.encode(wav.unsqueeze(0), n_q=k))[0, :, : wav.shape[-1]]
            dec = rec.mean(0).numpy()
            dec = align(dec, estimate_lag(ref, dec, sr), len(ref))
            m = {"kbps": f"{codec.bitrate_kbps(k):.1f}",
                 "mel distance": f"{mel_distance(rec[None], wav[None], sr).item():.3f}",
                 "STOI": shown(stoi(ref, dec, sr), 3),
                 "PESQ": shown(pesq_wb(ref, dec, sr) if sr == 16000 else float("nan"), 2)}
            done.table.append({"clip": name, "codebooks": str(k), **m})
            clips.append(write_clip(out, f"{name}-recon-{k}cb", rec, sr, f"reconstruction, {k} codebooks", m))
        done.rows.append(clips)
    return done


def tokenize_corpus(s: DemoSettings, corpus: Path, codec) -> Path:
    """Tokenize `corpus` with `codec` into `s.tokens_dir` (or the default folder); returns that folder."""
    from codec.tokenize.folder import tokenize_folder

    fingerprint = codec.token_fingerprint()[:12]
    if s.tokens_dir is not None:
        tokens_dir = Path(s.tokens_dir)
    elif s.corpus_files_per_split is not None:
        tokens_dir = Path(s.work_dir) / f"tokens-{s.corpus_files_per_split}-per-split-{fingerprint}"
    else:
        tokens_dir = REPO / "data" / "tokens" / f"fillets-cs-16k-{fingerprint}"
    summary = tokenize_folder(corpus, tokens_dir, codec, workers=1, progress=True)
    if summary.errors:
        raise RuntimeError(f"{len(summary.errors)} corpus files failed to tokenize; see {tokens_dir}/errors.jsonl")
    return tokens_dir


def shipped_lm_for(s: DemoSettings, codec) -> Path | None:
    """`s.lm_init` if it was trained on this codec's tokens, else None (a small LM is trained instead)."""
    from lm.trunk import read_lm_config

    try:
        fits = read_lm_config(s.lm_init).codec_fingerprint == codec.token_fingerprint()
    except (OSError, ValueError):
        fits = False
    if not fits and s.lm_minutes == 0:
        raise RuntimeError(f"{s.lm_init} is not an LM trained on this codec's tokens, so the demo must train one: "
                           "give it minutes (--lm-minutes)")
    return Path(s.lm_init) if fits else None


def demo_lm(s: DemoSettings, codec, tokens_dir: Path, init: Path | None):
    """The demo's LM in eval mode: `init` as it is (lm_minutes 0), `init` fine-tuned, or a small LM
    trained from scratch (init None) for `s.lm_minutes`."""
    from lm import MultiCodebookLM

    if s.lm_minutes == 0:
        lm_dir = init
    else:
        lm_dir = train_demo_lm(s, tokens_dir, Path(s.work_dir) / "lm", init)
    model = MultiCodebookLM.from_pretrained(lm_dir).eval()
    if not codec.accepts_tokens(model.config.codec_fingerprint):
        raise RuntimeError("the demo LM was trained on tokens of another codec")
    return model


def train_demo_lm(s: DemoSettings, tokens_dir: Path, run_dir: Path, init: Path | None) -> Path:
    """Train (from scratch with `s.lm_recipe`) or fine-tune (`init`, with its own recipe at a low
    learning rate) for `s.lm_minutes`; returns the run's pretrained folder."""
    import shutil

    from lm.training import train_main

    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh short run each time; the tokens are what is reused
    minutes = max(s.lm_minutes, 0.1)
    args = ["--data.tokens_dir", str(tokens_dir), "--trainer.default_root_dir", str(run_dir),
            "--trainer.max_time", f"00:00:{int(minutes):02d}:{int((minutes % 1) * 60):02d}",
            "--trainer.enable_progress_bar", "true"]
    if init is None:
        train_main(["--config", str(s.lm_recipe), *args])
    else:
        train_main(["--config", str(FINETUNE_LM_RECIPE), *args, "--model.init_from", str(init),
                    "--model.lr", "2e-4", "--model.warmup_steps", "10", "--trainer.max_steps", "10000",
                    "--trainer.val_check_interval", "50", "--data.max_valid_windows", "32"])
    pretrained = run_dir / "pretrained"
    if not (pretrained / "config.json").exists():
        raise RuntimeError(f"LM training ended without exporting {pretrained}")
    return pretrained


def continue_prompts(s: DemoSettings, codec, model, prompts: list[Path], out: Path) -> Section:
    """The first `s.prompt_seconds` of each prompt file (as codec tokens) continued by `model` for
    `s.continuation_seconds`, with its real-time factor and the model's NLL of what it sampled."""
    from codec.core.audio import load_audio
    from lm.generate import generate
    from lm.sampling import SamplingOptions

    sr = codec.sample_rate
    n_prompt_frames = int(s.prompt_seconds * codec.frame_rate)
    n_new = int(s.continuation_seconds * codec.frame_rate)
    gen = torch.Generator().manual_seed(s.seed)
    done = Section("LM continuations", "The first seconds of each held-out line are the prompt; the rest is "
                   f"sampled ({_sampling_words(s)}).", table_title="Continuations")
    for i, f in enumerate(prompts):
        wav = load_audio(f, sr, codec.channels)
        with torch.inference_mode():
            codes = codec.encode(wav.unsqueeze(0))[:, :, :n_prompt_frames]  # [1, N_c, T]
        t0 = time.perf_counter()
        full = generate(model, codes, n_new, sampling=SamplingOptions(s.temperature, s.top_k, s.top_p),
                        generator=gen, progress=True, frame_rate=codec.frame_rate)
        seconds = time.perf_counter() - t0
        with torch.inference_mode():
            audio = codec.decode(full)[0]
            prompt_audio = codec.decode(codes)[0]
        name = f"prompt{i + 1}"
        nll = model.log_likelihood(full[:, :, n_prompt_frames - 1:]).item() / (n_new * codec.n_codebooks)
        m = {"generation s": f"{seconds:.2f}", "real-time factor": f"{seconds / s.continuation_seconds:.2f}",
             "model NLL nats/token": f"{nll:.2f}"}
        done.table.append({"clip": name, **m})
        done.rows.append([
            write_clip(out, f"{name}-prompt", prompt_audio, sr, f"prompt ({s.prompt_seconds:g} s, codec tokens)", {}),
            write_clip(out, f"{name}-continuation", audio, sr,
                       f"prompt + {s.continuation_seconds:g} s continuation", m),
        ])
    return done


def write_demo_report(s: DemoSettings, codec, init: Path | None, sections: list[Section], held_out: dict,
                      minutes: float) -> Path:
    """`index.html` (notes, tables, clips) and `metrics.json` (the tables) in `s.samples_dir`."""
    from rvqlm.demo.report import write_report
    from rvqlm_core.atomic import atomic_write_text

    out = Path(s.samples_dir)
    tables = {**{x.table_title: x.table for x in sections if x.table},
              "Held-out negative log-likelihood, valid split (nats/token)": [
                  {"codebook": str(c), "LM": f"{v:.3f}", "unigram baseline": f"{u:.3f}"}
                  for c, (v, u) in enumerate(zip(held_out["nll_per_codebook"], held_out["unigram_nll_per_codebook"]))]}
    notes = (f"Built-in corpus: Czech voice acting (fillets-ng-data-cs, GPL-2+), prompts from the held-out test "
             f"split. Codec: {Path(s.codec_dir).name}, {codec.n_codebooks} x {codec.codebook_size} codes at "
             f"{codec.frame_rate:g} Hz. LM: {_lm_words(s, init)}. Demo wall time {minutes:.1f} min.")
    page = write_report(out, "rvqlm demo: speech codec and LM continuations", sections, tables, notes)
    atomic_write_text(out / "metrics.json", json.dumps(tables, indent=2) + "\n")
    return page


def _lm_stage_words(s: DemoSettings, init: Path | None) -> str:
    if s.lm_minutes == 0:
        return f"using the shipped LM {Path(s.lm_init).name} as it is"
    return f"{'fine-tuning the shipped LM' if init else 'training a small LM'} for {s.lm_minutes:.1f} minutes"


def _lm_words(s: DemoSettings, init: Path | None) -> str:
    if s.lm_minutes == 0:
        return f"the shipped {Path(s.lm_init).name} as it is, not fine-tuned"
    trained = f"the shipped {Path(s.lm_init).name} fine-tuned" if init else "trained from scratch"
    return f"{trained} for {s.lm_minutes:.1f} min on this machine's CPU"


def _sampling_words(s: DemoSettings) -> str:
    words = [f"temperature {s.temperature:g}"]
    if s.top_k is not None:
        words.append(f"top-k {s.top_k}")
    if s.top_p is not None:
        words.append(f"top-p {s.top_p:g}")
    return ", ".join(words) if len(words) > 1 or s.temperature != 1.0 else "plain sampling, temperature 1"
