"""The demo's "Masked LM continuations" section: the held-out prompts of the AR LM's section continued
by a masked LM (lm.masked_model: iterative parallel decoding, level by level) for the same length and
with the same sampling, each with its generation time, so the two families can be heard side by side.

The section needs a masked LM trained on this codec's tokens (DemoSettings.masked_lm, default
models/lm-masked-speech-16k); without one it is one line saying how to get it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from rvqlm.demo.report import Section, write_clip

TITLE = "Masked LM continuations"
TABLE = "Masked LM continuations (iterative parallel decoding)"
RECIPE = "rvqlm train-lm --config recipes/lm_masked_speech.yaml"


def masked_lm_hint(lm_dir: str | Path, codec) -> str | None:
    """None when `lm_dir` holds a masked LM of `codec`'s tokens, else the one line saying why the section
    is left out and how to get one."""
    how = f"train one on this codec's tokens with `{RECIPE}` and give its pretrained/ folder with --masked-lm"
    from lm.trunk import read_lm_config
    from lm.masked_model import MaskedLM

    try:
        config = read_lm_config(lm_dir)
    except (OSError, ValueError):
        return f"“{TITLE}” left out: no masked LM at {lm_dir}; {how}."
    if config.family != MaskedLM.family:
        return f"“{TITLE}” left out: {lm_dir} is not a masked LM; {how}."
    if not codec.accepts_tokens(config.codec_fingerprint):
        return f"“{TITLE}” left out: {lm_dir} was trained on another codec's tokens; {how}."
    return None


def masked_continuations(codec, lm_dir: str | Path, prompts: list[Path], prompt_seconds: float, seconds: float,
                         out: Path, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                         steps=None, seed: int = 1, say: Callable[[str], None] = print) -> Section:
    """The first `prompt_seconds` of each prompt file continued by `seconds` with the masked LM at `lm_dir`,
    written under `out` (audio/masked-promptI-*.wav); `say` gets the hint when the section is left out."""
    from codec.core.audio import load_audio
    from lm.trunk import load_lm
    from lm.generate import generate
    from lm.masked_generate import MaskedDecoding, default_window, model_calls, steps_per_level
    from lm.sampling import SamplingOptions

    why_not = masked_lm_hint(lm_dir, codec) if prompts else f"“{TITLE}” left out (no prompts)."
    if why_not is not None:
        say(why_not)
        return Section(TITLE, why_not, table_title=TABLE)
    model = load_lm(lm_dir).eval()
    level_steps = steps_per_level(steps, model.config.n_codebooks)
    n_prompt = int(prompt_seconds * codec.frame_rate)
    n_new = int(seconds * codec.frame_rate)
    calls = model_calls(n_prompt, n_new, default_window(model.config, n_prompt + n_new), level_steps)
    done = Section(TITLE, f"The same prompts continued by {Path(lm_dir).name}, a masked LM filling the "
                          f"{seconds:g} s in parallel steps ({','.join(map(str, level_steps))} per level, "
                          f"{calls} model calls in all, against one a frame for the AR LM), same sampling.",
                   table_title=TABLE)
    gen = torch.Generator().manual_seed(seed)
    for i, f in enumerate(prompts):
        with torch.inference_mode():
            codes = codec.encode(load_audio(f, codec.sample_rate, codec.channels).unsqueeze(0))[:, :, :n_prompt]
        t0 = time.perf_counter()
        full = generate(model, codes, n_new, sampling=SamplingOptions(temperature, top_k, top_p),
                        options=MaskedDecoding(steps=level_steps), generator=gen)
        took = time.perf_counter() - t0
        with torch.inference_mode():
            audio = codec.decode(full)[0]
        m = {"generation s": f"{took:.2f}", "real-time factor": f"{took / seconds:.2f}", "model calls": str(calls)}
        done.table.append({"clip": f"prompt{i + 1}", **m})
        done.rows.append([write_clip(out, f"masked-prompt{i + 1}-continuation", audio, codec.sample_rate,
                                     f"prompt + {seconds:g} s masked-LM continuation", m)])
    say(f"masked LM: {len(prompts)} continuations in {sum(float(r['generation s']) for r in done.table):.1f} s")
    return done
