"""Text units: what an aligned-text LM reads and a forced aligner places on the frames.

A text becomes a row of units: the edge unit EDGE (silence before the first word), then the
text's letters lowercased (Unicode NFC, any letter or digit), one WORD unit between words (any
run of spaces and punctuation), and EDGE again (silence after the last word):

    "Co je to?"  ->  "_co je to_"

An alphabet is the string of units a model knows (EDGE and WORD first, then letters in code-point
order): a unit's id is its index there. Characters outside an alphabet are refused by
`unit_ids`, naming them, so a text the model never learned to say is not said as silence.
"""

from __future__ import annotations

import unicodedata
from typing import Iterable

EDGE = "_"
WORD = " "


class TextUnitError(ValueError):
    """A text that gives no units, or units outside a model's alphabet."""


def normalize(text: str) -> str:
    """A text -> its letters and digits lowercased, words joined by one WORD, no EDGE (may be "")."""
    text = unicodedata.normalize("NFC", text).lower()
    out, gap = [], False
    for ch in text:
        if unicodedata.category(ch)[0] in "LN" and ch not in (EDGE, WORD):
            if gap and out:
                out.append(WORD)
            out.append(ch)
            gap = False
        else:
            gap = True
    return "".join(out)


def units(text: str) -> str:
    """A text -> its unit string: EDGE + normalize(text) + EDGE (TextUnitError if it has no letter or digit)."""
    core = normalize(text)
    if not core:
        raise TextUnitError(f"text {text[:40]!r} has no letter or digit to say")
    return EDGE + core + EDGE


def build_alphabet(texts: Iterable[str]) -> str:
    """The alphabet of a set of texts: EDGE, WORD, then every letter or digit they use in code-point order."""
    letters = set()
    for text in texts:
        letters.update(normalize(text))
    letters.discard(WORD)
    return EDGE + WORD + "".join(sorted(letters))


def unit_ids(text: str, alphabet: str) -> list[int]:
    """A text -> the ids of its units in `alphabet` (TextUnitError naming any character it lacks)."""
    row = units(text)
    index = {ch: i for i, ch in enumerate(alphabet)}
    missing = sorted({ch for ch in row if ch not in index})
    if missing:
        raise TextUnitError(f"text {text[:40]!r} has characters this model never learned: {''.join(missing)!r} "
                            f"(it knows {alphabet[2:]!r})")
    return [index[ch] for ch in row]
