"""Shared fixtures: the built-in real-speech corpus and small real audio files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tests use tiny models, for which OpenMP threads only wait on each other (up to 50x slower on a
    busy 2-core machine). Subprocess-based tests (DDP, kill -9) set their own thread counts."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The full built-in corpus (16 kHz mono, split by level), prepared once into data/ and reused."""
    from rvqlm.corpora.fillets import prepare_corpus

    return prepare_corpus(REPO / "data" / "fillets-cs-16k", 16000, progress=False)


@pytest.fixture(scope="session")
def speech_files(corpus_dir) -> dict[str, list[Path]]:
    from rvqlm.corpora.folder import SPLITS, corpus_files

    return {s: corpus_files(corpus_dir, s) for s in SPLITS}


@pytest.fixture(scope="session")
def real_ogg() -> Path:
    """One original Vorbis file of the corpus (22.05 kHz mono)."""
    from rvqlm.corpora.fillets import list_source_files

    return list_source_files()[0].source
