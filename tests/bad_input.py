"""What the bad-input tables (tests/test_bad_input_<command>.py) share: tiny models built in a second,
small audio, and the check every row makes (issue 49): the exit code, one line on stderr without a
traceback, and every file that existed before unchanged (sha256 before and after), with no file left
behind but the ones the row expects.

A table is text, a row a line (an indented line continues the one before), its cells split by " | ":
an id, the command line as a shell would split it, `{w}` standing for the row's workspace (`tmp_path`,
which the test file's fixtures fill), the exit code, a fragment of the one line on stderr (empty for
none), and the files it leaves there new; lines starting with # are comments. `table` reads it into
`Row`s.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import pytest
import torch

from rvqlm.cli import main

SEANET = dict(kind="seanet", channels=4, dilations=(1, 3))


class Row(NamedTuple):
    """One case of a table (module docstring)."""

    id: str
    argv: str
    code: int
    message: str
    new: tuple[str, ...] = ()


def table(text: str, **macros: str) -> list[Row]:
    """The rows of a table (module docstring); `{name}` of each macro is replaced by its text first."""
    for name, value in macros.items():
        text = text.replace("{" + name + "}", value)
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith((" ", "\t")) and lines:
            lines[-1] += " " + line.strip()
        elif line.strip() and not line.startswith("#"):
            lines.append(line.strip())
    out = []
    for line in lines:
        cells = [c.strip() for c in line.split(" | ")]
        row_id, argv, code, message = (cells + [""])[:4]
        out.append(Row(row_id, argv, int(code), message, tuple(" ".join(cells[4:]).split())))
    return out


def rows(table: Sequence[Row]):
    """pytest.mark.parametrize over a table's rows, each named by its id."""
    return pytest.mark.parametrize("row", table, ids=[r.id for r in table])
N_C, V = 4, 32


def make_codec(folder: Path) -> Path:
    """A tiny causal SEANet codec (16 kHz, 50 frames/s, 4 codebooks of 32), its codebooks from k-means
    on a second of noise: saved in `folder`."""
    from codec import Codec, CodecConfig

    config = CodecConfig.from_dict(dict(latent_dim=16, encoder=SEANET, decoder=SEANET,
                                        quantizer=dict(n_codebooks=N_C, codebook_size=V, kmeans_iters=2)))
    torch.manual_seed(0)
    codec = Codec(config).train()
    codec(0.1 * torch.randn(1, 1, 16000))
    return codec.eval().save_pretrained(folder)


def make_lm(folder: Path, codec_dir: Path) -> Path:
    """A tiny AR LM (1 layer, 64 positions: 60 frames of context) on the tiny codec's tokens."""
    from codec import Codec
    from lm import LMConfig, MultiCodebookLM

    fingerprint = Codec.from_pretrained(codec_dir).token_fingerprint()
    torch.manual_seed(0)
    cfg = LMConfig(n_codebooks=N_C, codebook_size=V, d_model=16, n_layers=1, n_heads=2, max_seq_len=64,
                   codec_fingerprint=fingerprint)
    return MultiCodebookLM(cfg).save_pretrained(folder)


def write_wav(path: Path, seconds: float = 0.5, rate: int = 16000, peak: float = 0.5,
              subtype: str = "PCM_16") -> Path:
    """A voiced-sounding test signal (a 150 Hz buzz with noise), `peak` its largest magnitude."""
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    x = np.sign(np.sin(2 * np.pi * 150 * t)) * 0.5 + np.sin(2 * np.pi * 450 * t) + 0.1 * rng.standard_normal(len(t))
    x = (peak * x / np.abs(x).max()).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), x, rate, subtype=subtype)
    return path


def hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` ("folder" for a folder), by path relative to it."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
            for p in sorted(root.rglob("*"))}


def run(argv: Sequence[str], capsys) -> tuple[int, str]:
    """`rvqlm ARGV` in this process -> (exit code, stderr)."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's and LightningCLI's own exits
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


def fill(argv: str | Sequence[str], where: Path) -> list[str]:
    """The command line (a string split as a shell would, or a list) with {w} replaced by `where`."""
    return [a.format(w=where) for a in (shlex.split(argv) if isinstance(argv, str) else argv)]


def check_row(root: Path, argv: str | Sequence[str], code: int, message: str, capsys,
              new: Sequence[str] = ()) -> str:
    """Run one row in `root` and check it (module docstring); returns its stderr line."""
    before = hashes(root)
    got, err = run(fill(argv, root), capsys)
    assert_one_line(err, message.format(w=root))
    assert got == code, err
    assert_unchanged(root, before, new)
    return err.strip()


def assert_one_line(err: str, message: str) -> None:
    """One line holding `message` on stderr; none at all for message "" (a row that succeeds quietly)."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    if not message:
        assert lines == [], err
        return
    assert len(lines) == 1, err
    assert message in lines[0], err


def assert_unchanged(root: Path, before: dict[str, str], new: Sequence[str] = ()) -> None:
    """Every file of `before` as it was, and nothing new under `root` (no file, no folder) but what `new` names."""
    after = hashes(root)
    assert {k: after.get(k) for k in before} == before
    assert sorted(set(after) - set(before)) == sorted(new)


@pytest.fixture(autouse=True)
def _debug_off(monkeypatch):
    """The rows check what a user sees: never the RVQLM_DEBUG traceback. Nor does a row change the process
    for later tests: torch's thread count is restored, and as a tokenize row would turn oneDNN's primitive
    cache off for the rest of the session (rvqlm/commands/tokenize.py sets ONEDNN_PRIMITIVE_CACHE_CAPACITY=0
    unless set, for its own process), making later convolutions many times slower, the variable is set
    to oneDNN's default first."""
    monkeypatch.delenv("RVQLM_DEBUG", raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024"))
    threads = torch.get_num_threads()  # a command may set its own (tokenize --threads)
    yield
    torch.set_num_threads(threads)


def one_thread_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1")
