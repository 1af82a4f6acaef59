"""`rvqlm demo`: the whole job on the built-in corpus, end to end, on a CPU, in about 10 minutes.

1. prepare the built-in corpus (Czech speech, split by level);
2. load the shipped speech codec (`models/codec-speech-16k`) and reconstruct held-out test lines
   at several bitrates;
3. tokenize the corpus with that codec (resumable: a second run reuses the tokens);
4. train a small LM on the train split's tokens for a few minutes (held-out NLL on the valid split);
5. continue held-out test prompts with the LM, decode them with the codec;
6. write everything into `samples/` with a listening report (`samples/index.html`).

Every step reads what the previous one wrote, so each stage is a library call a user can also make
on their own (see the README), and every file lands atomically.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from codec.audio import save_audio
from rvqlm.report import ReportClip, render_spectrogram

REPO = Path(__file__).resolve().parents[1]
SHIPPED_CODEC = REPO / "models" / "codec-speech-16k"
SHIPPED_LM = REPO / "models" / "lm-speech-16k"
DEMO_LM_RECIPE = REPO / "recipes" / "lm_demo.yaml"  # from scratch, when no shipped LM fits the codec
FINETUNE_LM_RECIPE = REPO / "recipes" / "lm_speech.yaml"  # the shipped LM's own recipe


@dataclass
class DemoSettings:
    samples_dir: Path = REPO / "samples"
    work_dir: Path = REPO / "data" / "demo"
    corpus_dir: Path = REPO / "data" / "fillets-cs-16k"
    tokens_dir: Path | None = None  # default data/tokens/fillets-cs-16k-<codec token fingerprint[:12]>
    codec_dir: Path = SHIPPED_CODEC
    lm_init: Path = SHIPPED_LM
    lm_recipe: Path = DEMO_LM_RECIPE
    lm_minutes: float = 4.0
    n_prompts: int = 3
    prompt_seconds: float = 3.0
    continuation_seconds: float = 6.0
    # Plain sampling: benchmarks/continuation_quality.py on the shipped models found it the only
    # setting whose continuations resemble held-out speech (silence share 0.18 vs 0.33 for the
    # real continuations); temperature 0.8 / top-k 250 and 0.9 / top-p 0.95 fall silent (0.77).
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 1


_T0 = time.perf_counter()


def _say(msg: str) -> None:
    print(f"[demo {(time.perf_counter() - _T0) / 60:5.1f} min] {msg}", flush=True)


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


def run_demo(s: DemoSettings = DemoSettings()) -> Path:
    """Run every stage; returns the path of the listening report."""
    from codec import Codec
    from codec.audio import load_audio
    from codec.losses import mel_distance, si_sdr
    from codec.tokenize import tokenize_folder
    from lm import MultiCodebookLM
    from lm.generate import generate
    from lm.training import held_out_report
    from rvqlm.corpus import corpus_files, prepare_corpus
    from rvqlm.report import ReportSection, write_report

    global _T0
    t_start = _T0 = time.perf_counter()
    torch.manual_seed(s.seed)
    out = Path(s.samples_dir)
    out.mkdir(parents=True, exist_ok=True)

    _say("1/6 preparing the built-in corpus")
    corpus = prepare_corpus(s.corpus_dir, 16000)

    _say(f"2/6 loading the codec from {s.codec_dir}")
    if not Path(s.codec_dir).is_dir():
        raise FileNotFoundError(f"no codec at {s.codec_dir}; train one with `rvqlm train-codec --config "
                                "recipes/codec_speech.yaml` and pass its pretrained/ folder with --codec")
    codec = Codec.from_pretrained(s.codec_dir).eval()
    sr = codec.sample_rate
    prompts = pick_prompts(corpus_files(corpus, "test"), s.n_prompts, s.prompt_seconds + 1.0)

    recon_rows, recon_table = [], []
    ladder = sorted({1, max(1, codec.n_codebooks // 2), codec.n_codebooks})
    for i, f in enumerate(prompts):
        wav = load_audio(f, sr, codec.channels)
        name = f"prompt{i + 1}"
        clips = [_clip(out, f"{name}-original", wav, sr, f"original ({f.parent.name}/{f.name})", {})]
        for k in ladder:
            with torch.inference_mode():
                rec = codec.decode(codec.encode(wav.unsqueeze(0), n_q=k))[0, :, : wav.shape[-1]]
            kbps = k * _bits(codec.codebook_size) * codec.frame_rate / 1000
            m = {"kbps": f"{kbps:.1f}", "mel distance": f"{mel_distance(rec[None], wav[None], sr).item():.3f}",
                 "SI-SDR dB": f"{si_sdr(rec[None], wav[None]).item():.1f}"}
            recon_table.append({"clip": name, "codebooks": str(k), **m})
            clips.append(_clip(out, f"{name}-recon-{k}cb", rec, sr, f"reconstruction, {k} codebooks", m))
        recon_rows.append(clips)

    _say("3/6 tokenizing the corpus (resumes if already done)")
    tokens_dir = Path(s.tokens_dir or REPO / "data" / "tokens" / f"fillets-cs-16k-{codec.token_fingerprint()[:12]}")
    summary = tokenize_folder(corpus, tokens_dir, codec, workers=1, progress=True)
    if summary.errors:
        raise RuntimeError(f"{len(summary.errors)} corpus files failed to tokenize; see {tokens_dir}/errors.jsonl")

    lm_run = Path(s.work_dir) / "lm"
    init = s.lm_init if _fits(s.lm_init, codec.token_fingerprint()) else None
    _say(f"4/6 {'fine-tuning the shipped LM' if init else 'training a small LM'} for {s.lm_minutes:.1f} minutes")
    lm_dir = train_demo_lm(s, tokens_dir, lm_run, init)
    model = MultiCodebookLM.from_pretrained(lm_dir).eval()
    if not codec.accepts_tokens(model.cfg.codec_fingerprint):
        raise RuntimeError("the demo LM was trained on tokens of another codec")
    held_out = held_out_report(model, str(tokens_dir), "valid", unigram=True)

    _say("5/6 generating continuations of held-out prompts")
    cont_rows, cont_table = [], []
    n_prompt_frames = int(s.prompt_seconds * codec.frame_rate)
    n_new = int(s.continuation_seconds * codec.frame_rate)
    gen = torch.Generator().manual_seed(s.seed)
    for i, f in enumerate(prompts):
        wav = load_audio(f, sr, codec.channels)
        with torch.inference_mode():
            codes = codec.encode(wav.unsqueeze(0))[:, :, :n_prompt_frames]
        t0 = time.perf_counter()
        full = generate(model, codes, n_new, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                        generator=gen, progress=True, frame_rate=codec.frame_rate)
        seconds = time.perf_counter() - t0
        with torch.inference_mode():
            audio = codec.decode(full)[0]
            prompt_audio = codec.decode(codes)[0]
        name = f"prompt{i + 1}"
        nll = model.log_likelihood(full[:, :, n_prompt_frames - 1:]).item() / (n_new * codec.n_codebooks)
        m = {"real-time factor": f"{seconds / s.continuation_seconds:.2f}", "model NLL nats/token": f"{nll:.2f}"}
        cont_table.append({"clip": name, **m})
        cont_rows.append([
            _clip(out, f"{name}-prompt", prompt_audio, sr, f"prompt ({s.prompt_seconds:.0f} s, codec tokens)", {}),
            _clip(out, f"{name}-continuation", audio, sr,
                  f"prompt + {s.continuation_seconds:.0f} s continuation", m),
        ])

    _say("6/6 writing the listening report")
    elapsed = time.perf_counter() - t_start
    tables = {"Reconstruction of held-out speech": recon_table, "Continuations": cont_table,
              "Held-out negative log-likelihood, valid split (nats/token)": [
                  {"codebook": str(c), "LM": f"{v:.3f}", "unigram baseline": f"{u:.3f}"}
                  for c, (v, u) in enumerate(zip(held_out["nll_per_codebook"], held_out["unigram_nll_per_codebook"]))]}
    notes = (f"Built-in corpus: Czech voice acting (fillets-ng-data-cs, GPL-2+), prompts from the held-out test "
             f"split. Codec: {s.codec_dir.name}, {codec.n_codebooks} x {codec.codebook_size} codes at "
             f"{codec.frame_rate:g} Hz. LM: {'the shipped ' + s.lm_init.name + ' fine-tuned' if init else 'trained from scratch'} "
             f"for {s.lm_minutes:.1f} min on this machine's CPU. "
             f"Demo wall time {elapsed / 60:.1f} min.")
    sections = [
        ReportSection("Codec reconstructions", "Held-out lines through the codec at several bitrates.", recon_rows),
        ReportSection("LM continuations", "The first seconds of each held-out line are the prompt; the rest is "
                      f"sampled ({_sampling_words(s)}).", cont_rows),
    ]
    page = write_report(out, "rvqlm demo: speech codec and LM continuations", sections, tables, notes)
    (out / "metrics.json").write_text(json.dumps(tables, indent=2) + "\n")
    _say(f"done in {elapsed / 60:.1f} min: open {page}")
    return page


def _fits(lm_dir: Path, codec_fingerprint: str) -> bool:
    """True if `lm_dir` is an LM trained on this codec's tokens."""
    config = Path(lm_dir) / "config.json"
    if not config.is_file():
        return False
    return json.loads(config.read_text()).get("config", {}).get("codec_fingerprint") == codec_fingerprint


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


def _bits(codebook_size: int) -> int:
    return max(1, (codebook_size - 1).bit_length())


def _clip(out: Path, stem: str, wav: torch.Tensor, sr: int, label: str, metrics: dict) -> ReportClip:
    """Write one clip's wav and spectrogram under `out` and describe it for the report."""
    wav_rel, png_rel = Path("audio") / f"{stem}.wav", Path("img") / f"{stem}.png"
    save_audio(out / wav_rel, wav, sr)
    render_spectrogram(wav, sr, out / png_rel, title=label)
    return ReportClip(label, wav_rel, png_rel, metrics)


def _sampling_words(s: DemoSettings) -> str:
    words = [f"temperature {s.temperature:g}"]
    if s.top_k is not None:
        words.append(f"top-k {s.top_k}")
    if s.top_p is not None:
        words.append(f"top-p {s.top_p:g}")
    return ", ".join(words) if len(words) > 1 or s.temperature != 1.0 else "plain sampling, temperature 1"
