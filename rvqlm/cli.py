"""The `rvqlm` command: parses arguments and calls library functions, nothing more.

Each subcommand lives in `rvqlm/commands/<name>.py`, which defines `register(subparsers)`; the
handlers import torch and the libraries lazily so `rvqlm --help` stays fast. Training commands
hand their arguments to LightningCLI (YAML recipes in `recipes/`).

User errors (bad audio, wrong checkpoint, bad option values) print one clear line and exit 2;
set RVQLM_DEBUG=1 to see the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Callable, NoReturn

COMMAND_MODULES = ("corpus", "codec", "tokenize", "lm", "generate", "demo", "align")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rvqlm", description="Audio-token language modeling: codec + LM.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"rvqlm.commands.{name}")
        module.register(sub)
    return parser


def _error_line(text: str) -> None:
    """`text` and its newline in one write: ranks of one torchrun sharing a pipe cannot splice
    their lines together (print writes the newline separately)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        _error_line("rvqlm: interrupted")
        return 130
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        if os.environ.get("RVQLM_DEBUG"):
            raise
        _error_line(f"rvqlm {args.command}: error: {e}")
        return 2
    except OSError as e:  # the system refused a read or a write (permissions, a read-only or full disk)
        if os.environ.get("RVQLM_DEBUG"):
            raise
        _error_line(f"rvqlm {args.command}: error: {os_error_line(e)}")
        return 2
    return int(result or 0)


def os_error_line(e: OSError) -> str:
    """An OSError as one line naming its path(s): `PATH: Permission denied`."""
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    reason = e.strerror or str(e) or type(e).__name__
    return f"{paths}: {reason}" if paths else reason


def run_script(script_main: Callable[[], int | None], name: str) -> NoReturn:
    """Exit with `script_main()`'s status; user errors print one line, `NAME: error: ...`, and exit 1
    (a benchmark script's entry point)."""
    try:
        sys.exit(script_main())
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        _error_line(f"{name}: error: {e}")
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
