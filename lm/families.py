"""Loading a saved LM of either family: the folder's config.json says which (LMConfig.family).

    from lm.families import load_lm
    model = load_lm("models/lm-speech-16k")      # MultiCodebookLM ("ar") or MaskedLM ("masked")
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lm.masked_model import MaskedLM
from lm.model import MultiCodebookLM

FAMILY_CLASSES = {"ar": MultiCodebookLM, "masked": MaskedLM}


def lm_family(path: str | Path) -> str:
    """The family a saved LM folder holds ("ar" when its config names none or cannot be read: the
    AR loader then gives the folder's own error)."""
    try:
        header = json.loads((Path(path) / "config.json").read_text())
        family = header["config"].get("family", "ar")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "ar"
    return family if family in FAMILY_CLASSES else "ar"


def load_lm(path: str | Path, map_location: str | torch.device = "cpu") -> MultiCodebookLM:
    """`from_pretrained` of the class the folder's family names (a MaskedLM is a MultiCodebookLM subclass)."""
    return FAMILY_CLASSES[lm_family(path)].from_pretrained(path, map_location=map_location)
