"""The listening report opens in a real browser (headless Chromium) with working players and images."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from codec.core.audio import load_audio
from rvqlm.demo.report import ReportClip, Section, write_clip, write_report


def _chromium_driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "Debian packages chromium and chromium-driver are needed (make system-deps)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--autoplay-policy=no-user-gesture-required", "--allow-file-access-from-files"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=opts)


def _make_report(tmp_path: Path, files: list[Path]) -> Path:
    row = []
    for i, f in enumerate(files):
        wav = load_audio(f, 16000, 1)
        seconds = {"seconds": f"{wav.shape[1] / 16000:.2f}"}
        row.append(write_clip(tmp_path, f"clip{i}", wav, 16000, f"clip {i}", seconds))
    assert [c.wav.as_posix() for c in row] == [f"audio/clip{i}.wav" for i in range(len(files))]
    return write_report(tmp_path, "rvqlm test report", [Section("Real speech", "two held-out lines", [row])],
                        tables={"metrics": [{"model": "none", "mel distance": "0.0"}]})


def test_report_loads_in_headless_chromium_with_players_and_images(tmp_path, speech_files):
    page = _make_report(tmp_path, speech_files["test"][:2])
    driver = _chromium_driver()
    try:
        driver.get(page.as_uri())
        assert driver.title == "rvqlm test report"
        deadline = time.time() + 20
        while True:
            state = driver.execute_script(
                "return {imgs: Array.from(document.images).map(i => i.complete && i.naturalWidth > 0),"
                " audio: Array.from(document.querySelectorAll('audio')).map(a => [a.readyState, a.duration, a.error])};"
            )
            ready = state["audio"] and all(rs >= 1 and d > 0 for rs, d, _ in state["audio"])
            if (ready and all(state["imgs"])) or time.time() > deadline:
                break
            time.sleep(0.2)
        assert len(state["imgs"]) == 2 and all(state["imgs"]), state
        assert len(state["audio"]) == 2, state
        for rs, duration, err in state["audio"]:
            assert err is None and rs >= 1 and duration > 0.3, state
        assert "mel distance" in driver.page_source
    finally:
        driver.quit()


def test_report_refuses_missing_clip_files(tmp_path):
    clip = ReportClip("x", Path("missing.wav"), Path("missing.png"))
    with pytest.raises(FileNotFoundError, match="missing.wav"):
        write_report(tmp_path, "t", [Section("s", "d", [[clip]])])
    assert not (tmp_path / "index.html").exists()
