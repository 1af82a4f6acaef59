"""Where in its text an espeak-ng line is at each moment, from the synthesizer's own events.

libespeak-ng (Debian `libespeak-ng1`, beside the `espeak-ng` program) reports, while it speaks,
each word's character span and each phoneme's start sample. `alignment` turns them into anchors
of a piecewise-linear map from time to the UTF-8 byte of the text being spoken::

    [[seconds, byte], ...]   both non-decreasing; the first is [0, 0], the last [duration, len(bytes)]

A word's phonemes share its bytes evenly from their start times; the bytes after a word (space,
punctuation) are crossed during whatever follows its last phoneme (a pause, or the next word's
first phoneme). The library speaks the samples the `espeak-ng --stdout` program writes (the
program then adds trailing silence), so the anchors hold for `rvqlm.corpora.synthetic` files.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

_WORD, _PHONEME = 1, 7  # espeak_EVENT_TYPE
_SYNCHRONOUS, _PHONEME_EVENTS, _DONT_EXIT = 2, 0x0001, 0x8000
_RATE, _PITCH = 1, 3  # espeak_PARAMETER
_POS_CHARACTER, _CHARS_UTF8 = 1, 1


class EspeakError(RuntimeError):
    """libespeak-ng is missing or could not speak a line."""


class _Event(ctypes.Structure):  # espeak_EVENT (speak_lib.h)
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_char * 8)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


@dataclass(frozen=True)
class Event:
    kind: str  # "word" or "phoneme"
    char: int  # 0-based character position in the text (a phoneme: its word's, or a pause's)
    length: int  # characters (words; 0 for phonemes)
    sample: int  # start sample at `Speaker.sample_rate`
    name: str = ""  # the phoneme's mnemonic ("_" and "_:" are pauses)


class Speaker:
    """One libespeak-ng instance (synchronous): speak(text, voice, rate, pitch) -> (events, n_samples)."""

    _instance: "Speaker | None" = None

    def __init__(self):
        path = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        try:
            self.lib = ctypes.CDLL(path)
        except OSError:
            raise EspeakError("libespeak-ng is not installed (Debian package libespeak-ng1, with espeak-ng)")
        self.sample_rate = self.lib.espeak_Initialize(_SYNCHRONOUS, 0, None, _PHONEME_EVENTS | _DONT_EXIT)
        if self.sample_rate <= 0:
            raise EspeakError(f"libespeak-ng failed to start (code {self.sample_rate})")
        self._events: list[Event] = []
        self._samples = 0
        self._callback = _CALLBACK(self._on_synth)  # kept referenced while the library may call it
        self.lib.espeak_SetSynthCallback(self._callback)

    @classmethod
    def shared(cls) -> "Speaker":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _on_synth(self, wav, n: int, events) -> int:
        self._samples += max(int(n), 0)
        i = 0
        while events[i].type != 0:
            e = events[i]
            if e.type in (_WORD, _PHONEME):
                name = bytes(e.id).split(b"\0")[0].decode("ascii", "replace") if e.type == _PHONEME else ""
                self._events.append(Event("word" if e.type == _WORD else "phoneme", e.text_position - 1,
                                          e.length if e.type == _WORD else 0, e.sample, name))
            i += 1
        return 0

    def speak(self, text: str, voice: str, rate: int, pitch: int) -> tuple[list[Event], int]:
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise EspeakError(f"libespeak-ng has no voice {voice!r}")
        self.lib.espeak_SetParameter(_RATE, int(rate), 0)
        self.lib.espeak_SetParameter(_PITCH, int(pitch), 0)
        self._events, self._samples = [], 0
        data = text.encode("utf-8")
        status = self.lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        self.lib.espeak_Synchronize()
        if status != 0 or self._samples == 0:
            raise EspeakError(f"libespeak-ng spoke nothing for {text[:40]!r} (status {status})")
        return self._events, self._samples


def anchors(text: str, events: list[Event], n_samples: int, sample_rate: int) -> list[list[float]]:
    """The module docstring's [[seconds, byte], ...] from a line's events."""
    starts = [0]
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8")))
    n_chars, n_bytes = len(text), starts[-1]

    def byte(char: int) -> int:
        return starts[min(max(char, 0), n_chars)]

    phonemes = sorted((e for e in events if e.kind == "phoneme"), key=lambda e: e.sample)
    points = [(0, 0.0)]
    for w in sorted((e for e in events if e.kind == "word"), key=lambda e: e.sample):
        own = [i for i, p in enumerate(phonemes) if p.char == w.char and not p.name.startswith("_")]
        if not own:
            continue
        b0, b1 = byte(w.char), byte(w.char + w.length)
        points += [(phonemes[i].sample, b0 + (b1 - b0) * k / len(own)) for k, i in enumerate(own)]
        after = next((p.sample for p in phonemes[own[-1] + 1:] if p.char != w.char or p.name.startswith("_")),
                     n_samples)
        points.append((after, float(b1)))
    points.append((n_samples, float(n_bytes)))
    out, reached, last_t = [], 0.0, 0
    for t, b in sorted(points, key=lambda p: p[0]):
        reached, last_t = max(reached, b), max(last_t, min(t, n_samples))
        anchor = [round(last_t / sample_rate, 4), round(reached, 2)]
        if not out or anchor != out[-1]:
            out.append(anchor)
    return out


def alignment(text: str, voice: str, rate: int, pitch: int) -> list[list[float]]:
    """`text` spoken by espeak-ng voice `voice` at `rate` words a minute and `pitch` (0-99), as the
    `espeak-ng -v VOICE -s RATE -p PITCH` program speaks it -> the module docstring's anchors."""
    speaker = Speaker.shared()
    events, n_samples = speaker.speak(text, voice, rate, pitch)
    return anchors(text, events, n_samples, speaker.sample_rate)
