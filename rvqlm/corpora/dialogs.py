"""Who says what in the built-in corpus: the game's dialog scripts (Debian's `fillets-ng-data`).

Each level's `script/<level>/*dialogs_cs.lua` (`dialogs_cs.lua`, and e.g. `brief_dialogs_cs.lua`)
holds its lines as Lua calls::

    dialogId("let-m-divna", "font_small", "What kind of strange ship is that?")
    dialogStr("Co je to za divnou loď?")

The id is the voice file's name (`sound/<level>/cs/let-m-divna.ogg`), the font who speaks it
(`font_small`: the small fish, `font_big`: the big fish, other fonts: other characters, "" none),
the third argument the English line and the following `dialogStr` the Czech one. The parser reads
the Lua that these files use: short strings in either quote with every Lua escape, long strings
(`[[...]]`), `..` concatenation, comments; anything else in a call is refused with its line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

FILLETS_SCRIPT_DIR = Path(os.environ.get("RVQLM_FILLETS_SCRIPT_DIR", "/usr/share/games/fillets-ng/script"))
DIALOG_FILES = "*dialogs_cs.lua"


class DialogError(ValueError):
    """A dialog script that cannot be read (the message names the file and line)."""


@dataclass(frozen=True)
class Dialog:
    name: str  # the voice file's name without its suffix
    font: str  # who speaks: "font_small", "font_big", ...; "" when the script names none
    text_en: str  # the English line
    text: str | None  # the Czech line; None when no dialogStr follows the dialogId


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*")
_LONG_OPEN = re.compile(r"\[(=*)\[")
_HEX_ESCAPE, _DEC_ESCAPE, _UTF8_ESCAPE = re.compile(r"x([0-9A-Fa-f]{2})"), re.compile(r"[0-9]{1,3}"), \
    re.compile(r"u\{([0-9A-Fa-f]+)\}")
_SIMPLE_ESCAPES = {"a": b"\a", "b": b"\b", "f": b"\f", "n": b"\n", "r": b"\r", "t": b"\t", "v": b"\v",
                   "\\": b"\\", '"': b'"', "'": b"'", "\n": b"\n", "\r": b"\n"}


def tokens(text: str, where: str):
    """Lua tokens: (kind, value, line) with kind "name", "string" (value: str), "number" or "op"."""
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\f\v\n":
            line += c == "\n"
            i += 1
        elif text.startswith("--", i):
            m = _LONG_OPEN.match(text, i + 2)
            end = _long_end(text, m, where, line) if m else text.find("\n", i)
            end = n if end < 0 else end
            line += text.count("\n", i, end)
            i = end
        elif c in "\"'":
            value, j = _short_string(text, i, where, line)
            yield "string", value, line
            line += text.count("\n", i, j)
            i = j
        elif (m := _LONG_OPEN.match(text, i)) is not None:
            end = _long_end(text, m, where, line)
            body = text[m.end() : end - len(m.group(0))]
            yield "string", body[1:] if body.startswith("\n") else body, line
            line += text.count("\n", i, end)
            i = end
        elif (m := _NAME.match(text, i)) or (m := _NUMBER.match(text, i)):
            yield ("name" if m.re is _NAME else "number"), m.group(0), line
            i = m.end()
        else:
            op = "..." if text.startswith("...", i) else ".." if text.startswith("..", i) else c
            yield "op", op, line
            i += len(op)


def _long_end(text: str, opening: re.Match, where: str, line: int) -> int:
    """The index just past the `]=*]` closing a long string or comment opened by `opening`."""
    close = "]" + opening.group(1) + "]"
    end = text.find(close, opening.end())
    if end < 0:
        raise DialogError(f"{where} line {line}: a long string or comment is never closed")
    return end + len(close)


def _short_string(text: str, i: int, where: str, line: int) -> tuple[str, int]:
    """The value of the quoted string starting at text[i], and the index just past it."""
    quote, out, j = text[i], bytearray(), i + 1
    while True:
        if j >= len(text) or text[j] == "\n":
            raise DialogError(f"{where} line {line}: unfinished string")
        c = text[j]
        if c == quote:
            break
        if c != "\\":
            out += c.encode("utf-8")
            j += 1
            continue
        j = _escape(text, j + 1, out, where, line)
    try:
        return out.decode("utf-8"), j + 1
    except UnicodeDecodeError:
        raise DialogError(f"{where} line {line}: a string's escapes make bytes that are not UTF-8") from None


def _escape(text: str, j: int, out: bytearray, where: str, line: int) -> int:
    """Append the value of the escape whose letter is at text[j]; return the index after it."""
    c = text[j : j + 1]
    if c in _SIMPLE_ESCAPES:
        out += _SIMPLE_ESCAPES[c]
        return j + 2 if text[j : j + 2] in ("\r\n", "\n\r") else j + 1
    if c == "z":
        j += 1
        while j < len(text) and text[j] in " \t\r\n\f\v":
            j += 1
        return j
    if (m := _HEX_ESCAPE.match(text, j)) is not None:
        out.append(int(m.group(1), 16))
        return m.end()
    if (m := _DEC_ESCAPE.match(text, j)) is not None and int(m.group(0)) < 256:
        out.append(int(m.group(0)))
        return m.end()
    if (m := _UTF8_ESCAPE.match(text, j)) is not None and int(m.group(1), 16) < 0x110000:
        out += chr(int(m.group(1), 16)).encode("utf-8", "surrogatepass")
        return m.end()
    raise DialogError(f"{where} line {line}: invalid escape sequence \\{c}")


def parse_dialogs(text: str, where: str = "<dialogs>") -> list[Dialog]:
    """The dialogs of one script, in order. Raises DialogError naming `where` and the line."""
    toks = list(tokens(text, where))
    found: list[Dialog] = []
    pending: Dialog | None = None
    i = 0
    while i < len(toks):
        kind, value, line = toks[i]
        if kind != "name" or value not in ("dialogId", "dialogStr"):
            i += 1
            continue
        args, i = _call_args(toks, i + 1, value, where, line)
        if value == "dialogId":
            if len(args) != 3:
                raise DialogError(f"{where} line {line}: dialogId takes 3 strings (id, font, English), got {len(args)}")
            if pending is not None:
                found.append(pending)
            pending = Dialog(args[0], args[1], args[2], None)
        else:
            if len(args) != 1:
                raise DialogError(f"{where} line {line}: dialogStr takes 1 string, got {len(args)}")
            if pending is None:
                raise DialogError(f"{where} line {line}: dialogStr without a dialogId before it")
            found.append(Dialog(pending.name, pending.font, pending.text_en, args[0]))
            pending = None
    if pending is not None:
        found.append(pending)
    return found


def _call_args(toks: list, i: int, fn: str, where: str, line: int) -> tuple[list[str], int]:
    """The string arguments of the call whose `(` is toks[i]; each may be `"a" .. "b"`."""
    if i >= len(toks) or toks[i][:2] != ("op", "("):
        raise DialogError(f"{where} line {line}: {fn} is not followed by '('")
    args: list[str] = []
    i += 1
    if i < len(toks) and toks[i][:2] == ("op", ")"):
        return args, i + 1
    while True:
        parts = []
        while True:
            if i >= len(toks) or toks[i][0] != "string":
                raise DialogError(f"{where} line {line}: {fn} argument {len(args) + 1} is not a string literal")
            parts.append(toks[i][1])
            i += 1
            if i < len(toks) and toks[i][:2] == ("op", ".."):
                i += 1
                continue
            break
        args.append("".join(parts))
        if i < len(toks) and toks[i][:2] == ("op", ","):
            i += 1
        elif i < len(toks) and toks[i][:2] == ("op", ")"):
            return args, i + 1
        else:
            raise DialogError(f"{where} line {line}: {fn}(...) is not closed by ')'")


def level_dialogs(level_dir: Path) -> dict[str, Dialog]:
    """Every dialog of one level's scripts (`*dialogs_cs.lua`), by voice file name. Raises
    DialogError if a script cannot be read or two of them give one id different lines."""
    found: dict[str, Dialog] = {}
    for path in sorted(level_dir.glob(DIALOG_FILES)):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise DialogError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        for d in parse_dialogs(text, str(path)):
            if d.name in found and found[d.name] != d:
                raise DialogError(f"{path}: {d.name!r} is given two different lines in {level_dir}")
            found[d.name] = d
    return found
