"""The LM families: the one place that knows which families there are and what each can do.

A family is a model class on the shared trunk (lm.trunk.LMTrunk, with `family` = its name), the way it
decodes (`decode`, reached only through lm.generate.generate), its own decoding options (a dataclass;
`SamplingOptions` are every family's), the LightningModule that trains it (reached only through
`rvqlm train-lm`, which reads `family` from the recipe) and its held-out score (`rvqlm eval-lm`).
Each part is the object itself or "module:name", imported when first used, so this registry imports
no other module of lm (LMConfig asks it about a config without importing a model).

A new family is one `register_family(Family(...))`, from any module (tests/test_lm_families.py adds
a toy one from the test file alone); lm.trunk.load_lm loads a saved LM of any registered family.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

PATTERNS = ("delay", "parallel")  # every codebook pattern (lm.patterns)
DEFAULT_FAMILY = "ar"  # LMConfig.family's default


@dataclass(frozen=True)
class Family:
    """One LM family. model_class: its LMTrunk subclass. decode(model, request) -> (codes [B, N_c, T],
    lengths [B]) (see lm.generate). options: its decoding options' dataclass (every field defaulted).
    training_module / held_out_report: the LightningModule and `report(model, tokens_dir, split,
    **options) -> dict`. patterns: the codebook patterns it takes. predicts_end: a conditioned LM of it
    predicts its end of audio. streams: its decode hands each frame over as it is made (`--stream`)."""

    name: str
    model_class: type | str
    decode: Callable | str
    options: type | str
    training_module: type | str
    held_out_report: Callable | str
    patterns: tuple[str, ...] = PATTERNS
    predicts_end: bool = False
    streams: bool = False

    def resolve(self, part: str) -> Any:
        """The part named `part`, imported first where it is a "module:name" string."""
        value = getattr(self, part)
        if isinstance(value, str):
            module, name = value.split(":")
            value = getattr(importlib.import_module(module), name)
        return value

    def make_options(self, given: dict[str, Any], names: dict[str, str] | None = None) -> Any:
        """The family's options from `given` (field -> value; None values left at their defaults).
        ValueError naming the option (by `names[field]`, e.g. a CLI flag) when the family has no such option."""
        options = self.resolve("options")
        known = [f.name for f in fields(options)]
        label = (names or {}).get
        for key, value in given.items():
            if value is not None and key not in known:
                raise ValueError(f"{label(key, key)} is not an option of the {self.name!r} LM family (its decoding "
                                 f"options: {', '.join(label(f, f) for f in known) or 'none'})")
        return options(**{k: v for k, v in given.items() if v is not None})


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add a family (ValueError if another holds its name, its class builds another family, or its
    options are no dataclass)."""
    model_class, options = family.model_class, family.options
    if not isinstance(model_class, str) and model_class.family != family.name:
        raise ValueError(f"{model_class.__name__}.family is {model_class.family!r}, the family registered is "
                         f"{family.name!r}")
    if not isinstance(options, str) and not is_dataclass(options):
        raise ValueError(f"a family's decoding options are a dataclass, got {options!r}")
    if FAMILIES.get(family.name, family) != family:
        raise ValueError(f"an LM family named {family.name!r} is registered already")
    FAMILIES[family.name] = family
    return family


def family_of(name: str) -> Family:
    """The registered family `name` (ValueError naming the known ones)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown LM family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def recipe_family(args: Sequence[str]) -> str:
    """The LM family a `train-lm` command line asks for: the last `--model.config.family` given, else the
    last `model.config.family` of its --config recipes, else DEFAULT_FAMILY."""
    family = DEFAULT_FAMILY
    for i, arg in enumerate(args):
        key, _, value = arg.partition("=")
        value = value or (args[i + 1] if i + 1 < len(args) else "")
        if key == "--config" and value:
            import yaml

            try:
                recipe = yaml.safe_load(Path(value).read_text(encoding="utf-8"))
                family = ((recipe.get("model") or {}).get("config") or {}).get("family", family)
            except (OSError, yaml.YAMLError, AttributeError):
                continue  # LightningCLI names the unreadable recipe itself
        elif key == "--model.config.family" and value:
            family = value
    return family


register_family(Family("ar", "lm.model:MultiCodebookLM", "lm.ar_decode:decode", "lm.ar_decode:ARDecoding",
                       "lm.training:LMTrainingModule", "lm.training:held_out_report", predicts_end=True,
                       streams=True))
register_family(Family("masked", "lm.masked_model:MaskedLM", "lm.masked_generate:decode",
                       "lm.masked_generate:MaskedDecoding", "lm.masked_training:MaskedLMTrainingModule",
                       "lm.masked_training:masked_held_out_report", patterns=("parallel",)))
