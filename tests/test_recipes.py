"""Every recipe in recipes/ parses with the CLI it is written for: no unknown key, no wrong type
(a recipe is code a user runs; a renamed option must not leave one broken)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rvqlm.cli import main

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
COMMANDS = {"codec": "train-codec", "lm": "train-lm"}


def _recipes() -> list[Path]:
    found = sorted(RECIPES.glob("*.yaml"))
    assert found, f"no recipes under {RECIPES}"
    return found


@pytest.mark.parametrize("recipe", _recipes(), ids=lambda p: p.name)
def test_recipe_parses(recipe, capsys):
    command = COMMANDS.get(recipe.name.split("_")[0])
    assert command, f"{recipe.name}: name it codec_*.yaml or lm_*.yaml so its command is known"
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--config", str(recipe), "--print_config"])
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    assert "model:" in capsys.readouterr().out


def test_a_broken_recipe_is_refused(tmp_path, capsys):
    bad = tmp_path / "codec_bad.yaml"
    bad.write_text((RECIPES / "codec_tiny.yaml").read_text().replace("model:\n", "model:\n  no_such_option: 1\n", 1))
    with pytest.raises(SystemExit) as exit_info:
        main(["train-codec", "--config", str(bad), "--print_config"])
    assert exit_info.value.code not in (0, None)
    assert "no_such_option" in capsys.readouterr().err
