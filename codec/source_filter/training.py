"""`rvqlm train-source-filter RECIPE`: the source-filter codec (codec.source_filter.parts) trained with
plain regression, in three resumable steps under the recipe's `run_dir`:

  1. targets/   every training and validation file analysed (codec.source_filter.world_analysis: Harvest's and pYIN's
                F0, WORLD's mel-cepstrum and coded aperiodicity; one .npz a file, written atomically,
                skipped once there);
  2. encoder.pt the analysis network trained on them: cross-entropy on the classes of `target_f0`
                (Harvest's F0 in pYIN's octave; Gaussian-smoothed over
                neighbouring bins, unvoiced a class of its own) + squared error on the aperiodicity
                (dB / 10), AdamW with a one-cycle schedule; checkpointed, resumed;
  3. the quantizer: codebook 1 the F0 grid, codebooks 2..N_c residual k-means of the encoder's latents
                (its envelope measured at its F0) on the training files; then the codec is written to
                `export_dir`.

The recipe (YAML) holds `SourceFilterTraining`'s fields; `codec:` is a nested CodecConfig.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from codec.core.audio import band_limited, load_audio
from codec.core.config import CodecConfig
from codec.core.model import Codec
from codec.core.quantizer import kmeans, nearest_codes
from codec.source_filter.net import F0_BINS, HOP, SourceFilterNet, class_to_f0, f0_to_continuous_class
from codec.source_filter.parts import AP_SCALE, LATENT_DIM, pitch_codebook
from rvqlm_core.atomic import atomic_path
from rvqlm_core.settings import settings_from_dict

SAMPLE_RATE = 16000
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")


def _default_codec() -> dict[str, Any]:
    return {"latent_dim": LATENT_DIM, "encoder": {"kind": "source_filter"}, "decoder": {"kind": "source_filter"},
            "quantizer": {"n_codebooks": 8, "codebook_size": 1024, "kmeans_init": False, "dropout": 0.0}}


@dataclass(frozen=True)
class SourceFilterTraining:
    """A source-filter codec recipe (see the module docstring)."""

    corpora: tuple[str, ...]  # corpus folders with train/ and valid/ splits of 16 kHz audio
    run_dir: str = "runs/codec-source-filter"
    export_dir: str | None = None  # default: run_dir/pretrained
    codec: dict = field(default_factory=_default_codec)  # the nested CodecConfig
    max_files: int | None = None  # per corpus and split (None: all)
    steps: int = 8000  # network training steps
    batch: int = 16  # windows a step
    seconds: float = 2.0  # scored audio a window
    lr: float = 1e-3  # peak learning rate
    sigma: float = 1.5  # width in F0 bins of the soft F0 target
    kmeans_frames: int = 300_000  # frames the quantizer's k-means sees (a random subset)
    kmeans_iters: int = 25
    narrowband_every: int = 0  # the quantizer also sees every n-th training file through 8 kHz (0: none)
    workers: int = 2  # processes of the WORLD analysis
    seed: int = 0
    checkpoint_every: int = 500
    decoder_dtype: str = "float16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "corpora", tuple(self.corpora))
        if not self.corpora:
            raise ValueError("a source-filter recipe needs at least one corpus folder")

    def codec_config(self) -> CodecConfig:
        return CodecConfig.from_dict({**_default_codec(), **self.codec}, source="recipe codec")


def read_recipe(path: str | os.PathLike) -> SourceFilterTraining:
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    return settings_from_dict(SourceFilterTraining, data, str(path))


# ----------------------------------------------------------------------------- 1. targets


def split_files(corpus: str, split: str, max_files: int | None) -> list[Path]:
    root = Path(corpus) / split
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder (a corpus has train/ and valid/ splits)")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES)
    return files[:max_files] if max_files else files


def target_path(run_dir: Path, audio: Path) -> Path:
    st = audio.stat()
    key = hashlib.sha1(f"{audio.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:20]
    return run_dir / "targets" / f"{key}.npz"


TARGET_FIELDS = ("f0", "f0_pyin", "params")


def _analyse(job: tuple[str, str]) -> str | None:
    from codec.source_filter.world_analysis import compact_params, harvest_f0, pyin_f0

    audio, dest = job
    try:
        wav = load_audio(audio, SAMPLE_RATE, 1)[0].double().numpy()
    except Exception as e:  # noqa: BLE001 - a bad file is skipped with its reason, the run goes on
        return f"{audio}: {e}"
    if len(wav) < 2 * HOP:
        return f"{audio}: shorter than 40 ms"
    found = _read_target(Path(dest))  # a target written before pYIN was added keeps its WORLD analysis
    f0 = found["f0"] if found else harvest_f0(wav, SAMPLE_RATE)
    params = found["params"] if found else compact_params(wav, f0, SAMPLE_RATE)
    f0_pyin = pyin_f0(wav, SAMPLE_RATE, len(f0))
    with atomic_path(dest, ".npz") as tmp:
        np.savez(tmp, f0=np.asarray(f0, np.float32), f0_pyin=f0_pyin.astype(np.float32),
                 params=np.asarray(params, np.float32), path=str(audio))
    return None


def _read_target(path: Path) -> dict | None:
    try:
        with np.load(path) as d:
            return {k: d[k] for k in d.files}
    except (OSError, ValueError):
        return None


def _has_target(path: Path) -> bool:
    try:
        with np.load(path) as d:
            return all(k in d.files for k in TARGET_FIELDS)
    except (OSError, ValueError):
        return False


def make_targets(recipe: SourceFilterTraining, files: list[Path]) -> None:
    run_dir = Path(recipe.run_dir)
    (run_dir / "targets").mkdir(parents=True, exist_ok=True)
    jobs = [(str(f), str(target_path(run_dir, f))) for f in files if not _has_target(target_path(run_dir, f))]
    print(f"targets: {len(files) - len(jobs)} of {len(files)} files analysed already", flush=True)
    with Pool(recipe.workers) as pool:
        for i, error in enumerate(pool.imap_unordered(_analyse, jobs, chunksize=4), 1):
            if error:
                print(f"skipped {error}", flush=True)
            if i % 500 == 0:
                print(f"targets: {i} / {len(jobs)}", flush=True)


def load_items(run_dir: Path, files: list[Path]) -> list[dict]:
    """The analysed files: {wav [S], f0 [T] (`target_f0`), params [T, 26] (aperiodicity / AP_SCALE)}."""
    from codec.source_filter.world_analysis import target_f0

    items = []
    for f in files:
        d = _read_target(target_path(run_dir, f))
        if d is None or not all(k in d for k in TARGET_FIELDS):
            continue
        params = torch.from_numpy(d["params"]).clone()
        params[:, -1] /= AP_SCALE
        f0 = torch.from_numpy(target_f0(d["f0"], d["f0_pyin"]).astype(np.float32))
        items.append({"wav": load_audio(f, SAMPLE_RATE, 1)[0], "f0": f0, "params": params})
    return items


# ----------------------------------------------------------------------------- 2. the network


def soft_f0_target(f0: torch.Tensor, sigma: float) -> torch.Tensor:
    """f0 [N] Hz -> [N, 1 + F0_BINS]: unvoiced one-hot on class 0; voiced a Gaussian of `sigma` bins
    around the unrounded class position, over the voiced classes."""
    voiced = f0 > 0
    pos = f0_to_continuous_class(torch.where(voiced, f0, torch.full_like(f0, 100.0)))
    bins = torch.arange(1, F0_BINS + 1, dtype=torch.float32)
    g = torch.exp(-0.5 * ((bins[None] - pos[:, None]) / sigma) ** 2)
    target = torch.zeros(f0.shape[0], 1 + F0_BINS)
    target[:, 1:] = g / g.sum(1, keepdim=True) * voiced[:, None]
    target[:, 0] = (~voiced).float()
    return target


def batch_of(items: list[dict], weights: torch.Tensor, batch: int, frames: int, context: int,
             gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random windows on the frame grid: wav [B, 1, (context + frames) * hop], f0 [B, frames],
    ap [B, frames] (dB / AP_SCALE), mask [B, frames] (frames inside the file). The first `context`
    frames are history, not scored."""
    picks = torch.multinomial(weights, batch, replacement=True, generator=gen).tolist()
    wavs, f0s, params, masks = [], [], [], []
    for i in picks:
        it = items[i]
        t = len(it["f0"])
        first = int(torch.randint(0, max(1, t - frames + 1), (1,), generator=gen))
        start = (first - context) * HOP
        wav = torch.zeros((context + frames) * HOP)
        lo, hi = max(0, start), min(len(it["wav"]), start + len(wav))
        if hi > lo:
            wav[lo - start: hi - start] = it["wav"][lo:hi]
        n = max(0, min(frames, t - first))
        f0, par, mask = torch.zeros(frames), torch.zeros(frames), torch.zeros(frames, dtype=torch.bool)
        f0[:n], par[:n], mask[:n] = it["f0"][first:first + n], it["params"][first:first + n, -1], True
        wavs.append(wav), f0s.append(f0), params.append(par), masks.append(mask)
    return torch.stack(wavs)[:, None], torch.stack(f0s), torch.stack(params), torch.stack(masks)


def network_loss(net: SourceFilterNet, wav, f0, ap, mask, context: int, sigma: float):
    """(cross-entropy of the F0 classes, squared error of the aperiodicity / AP_SCALE) on scored frames."""
    logits, pred = net(wav)
    logits = logits[:, :, context:].transpose(1, 2)[mask]
    pred = pred[:, 0, context:][mask]
    ce = -(soft_f0_target(f0[mask], sigma) * F.log_softmax(logits, -1)).sum(-1).mean()
    return ce, (pred - ap[mask]).pow(2).mean()


@torch.inference_mode()
def evaluate(net: SourceFilterNet, items: list[dict]) -> dict[str, float]:
    """Validation: voicing accuracy, share of frames both call voiced > 50 cents off Harvest,
    aperiodicity RMSE (dB)."""
    net.eval()
    frames = right = both = gross = 0
    ap = []
    for it in items:
        logits, pred = net(it["wav"][None, None])
        t = min(logits.shape[-1], len(it["f0"]))
        lg, ref = logits[0, :, :t], it["f0"][:t]
        voiced = lg[0] < torch.logsumexp(lg[1:], 0)
        f0 = class_to_f0(lg[1:].argmax(0) + 1)
        frames += t
        right += int((voiced == (ref > 0)).sum())
        b = voiced & (ref > 0)
        both += int(b.sum())
        gross += int((1200 * torch.log2(f0[b] / ref[b]).abs() > 50).sum())
        ap.append(((pred[0, 0, :t] - it["params"][:t, -1]) * AP_SCALE) ** 2)
    net.train()
    return {"voicing": right / max(1, frames), "gross_f0": gross / max(1, both),
            "ap_db": float(torch.cat(ap).mean().sqrt())}


def train_network(recipe: SourceFilterTraining, config: CodecConfig, train: list[dict],
                  valid: list[dict]) -> SourceFilterNet:
    enc = config.encoder
    net = SourceFilterNet(enc.width, enc.layers, enc.kernel)
    ckpt = Path(recipe.run_dir) / "encoder.pt"
    decay = [p for p in net.parameters() if p.ndim >= 2]
    rest = [p for p in net.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=recipe.lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=recipe.steps, pct_start=0.05,
                                                div_factor=20, final_div_factor=100)
    gen = torch.Generator().manual_seed(recipe.seed)
    step = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        net.load_state_dict(state["net"]), opt.load_state_dict(state["opt"]), sched.load_state_dict(state["sched"])
        gen.set_state(state["gen"])
        step = int(state["step"])
        print(f"network: resumed at step {step} of {recipe.steps}", flush=True)
    else:
        net.init_ap_bias(torch.cat([it["params"][:, -1] for it in train]).mean())
    context = math.ceil(-net.frame_span()[0] / HOP)
    frames = round(recipe.seconds * SAMPLE_RATE / HOP)
    weights = torch.tensor([float(max(len(it["f0"]), frames)) for it in train])
    began, seen = time.time(), step
    while step < recipe.steps:
        ce, mse = network_loss(net, *batch_of(train, weights, recipe.batch, frames, context, gen), context,
                               recipe.sigma)
        opt.zero_grad(set_to_none=True)
        (ce + mse).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % 100 == 0:
            rate = (time.time() - began) / (step - seen)
            print(f"network step {step}: f0 cross-entropy {ce.item():.3f}, parameter error {mse.item():.3f} "
                  f"({rate:.2f} s/step)", flush=True)
        if step % recipe.checkpoint_every == 0 or step == recipe.steps:
            with atomic_path(ckpt) as tmp:
                torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                            "gen": gen.get_state(), "step": torch.tensor(step)}, tmp)
        if valid and (step % (5 * recipe.checkpoint_every) == 0 or step == recipe.steps):
            m = evaluate(net, valid)
            print(f"validation at step {step}: voicing {m['voicing']:.4f}, > 50 cents {100 * m['gross_f0']:.2f} %, "
                  f"aperiodicity {m['ap_db']:.2f} dB", flush=True)
    return net.eval()


# ----------------------------------------------------------------------------- 3. the quantizer


def narrowband_copies(items: list[dict], every: int) -> list[dict]:
    """Every `every`-th item's wav [S] through 8 kHz and back, as telephone audio arrives ([] for 0): the
    codebooks then hold band-limited envelopes too (issue 48: without them, CER on telephone audio 0.09
    against 0.01 from the unquantized latent)."""
    if every <= 0:
        return []
    return [{"wav": band_limited(it["wav"], SAMPLE_RATE)} for it in items[::every]]


@torch.inference_mode()
def fit_quantizer(codec: Codec, items: list[dict], frames: int, iters: int, seed: int) -> None:
    """The parameters' mean (in the encoder and the decoder), then codebook 1: the pitch grid; codebooks
    2..N_c: residual k-means of the encoder's latents."""
    torch.manual_seed(seed)
    codec.encoder.param_mean.zero_()
    latents = torch.cat([codec.encoder(it["wav"][None, None])[0].T for it in items])  # [N, D]
    mean = latents[:, 1:].mean(0)
    codec.encoder.param_mean.copy_(mean)
    codec.decoder.param_mean.copy_(mean)
    latents[:, 1:] -= mean
    if latents.shape[0] > frames:
        latents = latents[torch.randperm(latents.shape[0])[:frames]]
    q = codec.quantizer
    books = [pitch_codebook(q.codebook_size, latents.shape[1])]
    residual = latents - books[0][nearest_codes(latents, books[0])]
    for c in range(1, q.n_codebooks):
        book, _ = kmeans(residual, q.codebook_size, iters)
        residual = residual - book[nearest_codes(residual, book)]
        books.append(book)
        print(f"quantizer: codebook {c + 1} fitted, residual {residual.pow(2).sum(1).mean():.4f}", flush=True)
    embed = torch.stack(books)
    counts = torch.ones(q.n_codebooks, q.codebook_size)
    q.embed.copy_(embed), q.cluster_size.copy_(counts), q.embed_sum.copy_(embed)
    q.initialized.fill_(True)
    q.frozen = True


def train_source_filter(recipe_path: str | os.PathLike) -> Path:
    """Run a recipe's three steps (each resumes); returns the exported codec folder."""
    recipe = read_recipe(recipe_path)
    config = recipe.codec_config()
    torch.manual_seed(recipe.seed)
    run_dir = Path(recipe.run_dir)
    train_files = [f for c in recipe.corpora for f in split_files(c, "train", recipe.max_files)]
    valid_files = [f for c in recipe.corpora for f in split_files(c, "valid", recipe.max_files)]
    make_targets(recipe, valid_files + train_files)
    train, valid = load_items(run_dir, train_files), load_items(run_dir, valid_files)
    print(f"network: {len(train)} training files ({sum(len(it['wav']) for it in train) / SAMPLE_RATE / 3600:.2f} h), "
          f"{len(valid)} validation files", flush=True)
    net = train_network(recipe, config, train, valid)
    codec = Codec(config).eval()
    codec.encoder.net.load_state_dict(net.state_dict())
    fit_quantizer(codec, train + narrowband_copies(train, recipe.narrowband_every), recipe.kmeans_frames,
                  recipe.kmeans_iters, recipe.seed)
    dest = Path(recipe.export_dir or run_dir / "pretrained")
    codec.save_pretrained(dest, decoder_dtype=recipe.decoder_dtype)
    print(f"codec saved to {dest}", flush=True)
    return dest

