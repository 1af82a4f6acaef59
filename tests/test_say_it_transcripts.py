"""The demo's "Say it" section hears its clips (issue 47): each clip's transcript and CER with the recognizer,
one line saying how to install it without."""

from __future__ import annotations

import sys

import torch

from rvqlm.demo import say_it


class EchoASR:
    """A recognizer that hears a fixed text and records the audio it was given."""

    def __init__(self, text: str):
        self.text, self.calls = text, []

    def transcribe(self, wav, sample_rate: int = 16000) -> str:
        self.calls.append((wav.shape, sample_rate))
        return self.text


def test_a_clip_shows_what_was_heard_and_its_cer():
    asr = EchoASR("Co je to za loď")
    got = say_it.heard(asr, torch.zeros(1, 24000), 24000, "Co je to za divnou loď?")
    assert got["heard"] == "Co je to za loď" and got["CER"] == "0.32"  # "divnou " deleted: 7 of 22 characters
    assert asr.calls == [((16000,), 16000)]  # resampled to the recognizer's 16 kHz, mono
    assert say_it.heard(None, torch.zeros(1, 100), 16000, "x") == {}


def test_without_the_recognizer_one_line_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # import fails as if not installed
    lines = []
    assert say_it.recognizer(lines.append) is None
    assert len(lines) == 1 and "pip install -e '.[bench]'" in lines[0] and "\n" not in lines[0]
