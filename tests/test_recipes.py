"""Every recipe parses with the CLI it is written for, layered as its header (and, for the shipped
models' stages, scripts/train_shipped_models.sh) layers it: no unknown key, no wrong type. Headers
stay short, recipes/ holds only what a user runs, and default data paths name the folders that
`rvqlm corpus prepare fillets` and `make demo` write."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from rvqlm.cli import main

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
SCRIPT = REPO / "scripts" / "train_shipped_models.sh"
COMMANDS = {"codec": "train-codec", "lm": "train-lm"}
SOURCE_FILTER = re.compile(r"(?:rvqlm|\$RVQLM) train-source-filter\s+(\S+)")  # one recipe, read by codec/source_filter/training.py
USER_RECIPES = {"codec_tiny.yaml", "lm_tiny.yaml", "lm_demo.yaml", "codec_speech.yaml",  # + the shipped stages
                "lm_speech_conditioned.yaml", "lm_text_bytes.yaml", "lm_masked_tiny.yaml", "lm_masked_speech.yaml",
                "codec_source_filter.yaml", "lm_mimi.yaml", "lm_encodec.yaml"}
HF_RECIPES = {"lm_mimi.yaml": ("mimi", 32), "lm_encodec.yaml": ("encodec", 32)}  # family, its N_c (docs/codec.md)
PREPARED_CORPORA = {"data/fillets-cs-16k", "data/voices-16k"}  # what `rvqlm corpus prepare fillets|voices` writes
TEXT_TOKENS_DIR = "data/tokens/fillets-cs-16k-text-bytes"  # what `rvqlm corpus text-tokens` writes by default
COMMAND = re.compile(r"(?:rvqlm|\$RVQLM) (train-codec|train-lm)((?:\s+--config\s+\S+)+)")


def _recipes() -> list[Path]:
    found = sorted(RECIPES.glob("*.yaml")) + sorted(RECIPES.glob("shipped/*.yaml")) + sorted(
        (RECIPES / "experiments").glob("*.yaml"))
    assert found, f"no recipes under {RECIPES}"
    return found


def _header(recipe: Path) -> list[str]:
    lines = recipe.read_text().splitlines()
    return lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))]


def _stacks(text: str) -> list[tuple[str, list[str]]]:
    """(command, [recipe, ...]) of every `rvqlm train-* --config A --config B ...` in `text`."""
    joined = re.sub(r"\\\n[#\s]*", " ", text)
    return [(m.group(1), re.findall(r"--config\s+(\S+)", m.group(2))) for m in COMMAND.finditer(joined)]


def _print_config(command: str, recipes: list[str], capsys) -> dict:
    args = [command]
    for recipe in recipes:
        args += ["--config", str(REPO / recipe)]
    with pytest.raises(SystemExit) as exit_info:
        main(args + ["--print_config"])
    out, err = capsys.readouterr()
    assert exit_info.value.code in (0, None), err
    return yaml.safe_load(out)


@pytest.fixture(scope="module")
def shipped_tokens_dir() -> str:
    """data/tokens/<corpus>-<token fingerprint[:12]>: where `make demo` tokenizes the corpus with the
    shipped codec (rvqlm/demo/pipeline.py)."""
    from codec import Codec
    from rvqlm.demo.pipeline import SHIPPED_CODEC, DemoSettings

    corpus = DemoSettings().corpus_dir.relative_to(REPO)
    return str(Path("data") / "tokens" / f"{corpus.name}-{Codec.from_pretrained(SHIPPED_CODEC).token_fingerprint()[:12]}")


@pytest.mark.parametrize("recipe", _recipes(), ids=lambda p: str(p.relative_to(RECIPES)))
def test_recipe_parses_as_its_header_runs_it(recipe, capsys, shipped_tokens_dir):
    header = _header(recipe)
    assert 1 <= len(header) <= 3, f"{recipe.name}: a header of at most three lines, not {len(header)}"
    if (runs := SOURCE_FILTER.findall("\n".join(header))):
        _check_source_filter_recipe(recipe, runs)
        return
    stacks = _stacks("\n".join(header))
    assert len(stacks) == 1, f"{recipe.name}: its header should show the one command that runs it"
    command, layers = stacks[0]
    assert command == COMMANDS.get(recipe.name.split("_")[0]), f"{recipe.name}: codec_*.yaml or lm_*.yaml"
    assert layers[-1] == str(recipe.relative_to(REPO)), f"{recipe.name}: its header runs {layers[-1]}"
    config = _print_config(command, layers, capsys)
    if command == "train-codec":  # `model.codec` holds each part's settings as a dict: build them
        from codec.neural.training import codec_config

        codec_config(config["model"]["codec"])
    data = config["data"]
    if command == "train-lm" and recipe.name == "lm_text_bytes.yaml":
        assert data["tokens_dir"] == TEXT_TOKENS_DIR, "the token folder `rvqlm corpus text-tokens` writes"
    elif recipe.name.startswith("lm_speech_conditioned") or recipe.name.endswith("_aligned.yaml"):
        # the folder lm_speech_conditioned.yaml's header tokenizes (aligned-text recipes read its alignments)
        assert data["tokens_dir"] == shipped_tokens_dir.replace("fillets-cs-16k", "fillets-synth-cs-16k")
    elif recipe.name in HF_RECIPES:  # the folder its header tokenizes with a Hugging Face codec
        family, n_c = HF_RECIPES[recipe.name]
        assert data["tokens_dir"] == f"data/tokens/fillets-cs-16k-{family}"
        assert f"rvqlm tokenize data/fillets-cs-16k {data['tokens_dir']} --codec" in "\n".join(header)
        kept = data["keep_codebooks"]
        assert 1 <= kept <= n_c and config["model"]["config"]["max_seq_len"] >= data["window_frames"] + kept - 1
    elif command == "train-lm":
        assert data["tokens_dir"] == shipped_tokens_dir, "the token folder `make demo` writes"
    elif data.get("train_dir") is None:
        folders = data["corpus_dir"] if isinstance(data["corpus_dir"], list) else [data["corpus_dir"]]
        assert folders and set(folders) <= PREPARED_CORPORA, "the folders `rvqlm corpus prepare fillets` writes"


def _check_source_filter_recipe(recipe: Path, runs: list[str]) -> None:
    from codec.source_filter.training import read_recipe

    assert runs == [str(recipe.relative_to(REPO))], f"{recipe.name}: its header runs {runs}"
    settings = read_recipe(recipe)
    settings.codec_config()  # builds every part's settings
    assert set(settings.corpora) <= PREPARED_CORPORA, "the folders `rvqlm corpus prepare` writes"


def test_a_source_filter_recipe_with_an_unknown_key_is_refused(tmp_path):
    from codec.source_filter.training import read_recipe

    bad = tmp_path / "codec_bad.yaml"
    bad.write_text((RECIPES / "codec_source_filter.yaml").read_text() + "no_such_setting: 1\n")
    with pytest.raises(ValueError, match="no_such_setting"):
        read_recipe(bad)


def test_the_shipped_models_stages_parse_as_the_script_layers_them(capsys):
    text = SCRIPT.read_text()
    assert SOURCE_FILTER.findall(text) == ["recipes/codec_source_filter.yaml"], "the shipped codec's one recipe"
    stacks = _stacks(text)
    assert not [layers for command, layers in stacks if command == "train-codec"]
    assert [layers[-1] for command, layers in stacks] == [
        "recipes/lm_speech.yaml", "recipes/shipped/lm_speech_stage2.yaml", "recipes/lm_masked_speech.yaml",
        "recipes/lm_speech_conditioned.yaml"]
    for command, layers in stacks:
        assert _print_config(command, layers, capsys)["model"]


def test_recipes_holds_only_what_a_user_runs():
    """The tiny recipes, the GPU-sized codec and the shipped models' recipes (the LM's second stage in
    recipes/shipped/); runs that were not kept live in recipes/experiments/ (docs/experiments.md)."""
    staged = {layer for _, layers in _stacks(SCRIPT.read_text()) for layer in layers}
    found = {str(p.relative_to(REPO)) for p in [*RECIPES.glob("*.yaml"), *RECIPES.glob("shipped/*.yaml")]}
    assert found == {f"recipes/{name}" for name in USER_RECIPES} | staged
    notebook = (REPO / "docs" / "experiments.md").read_text()
    for recipe in (RECIPES / "experiments").glob("*.yaml"):
        assert f"recipes/experiments/{recipe.name}" in notebook, f"docs/experiments.md does not tell {recipe.name}"


def test_a_broken_recipe_is_refused(tmp_path, capsys):
    bad = tmp_path / "codec_bad.yaml"
    bad.write_text((RECIPES / "codec_tiny.yaml").read_text().replace("model:\n", "model:\n  no_such_option: 1\n", 1))
    assert main(["train-codec", "--config", str(bad), "--print_config"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "no_such_option" in err and "see rvqlm train-codec --help" in err


def test_a_bad_setting_is_refused_with_its_own_line(tmp_path, capsys):
    code = main(["train-codec", "--config", str(RECIPES / "codec_tiny.yaml"), "--model.losses.loudness_weight", "-1",
                 "--trainer.default_root_dir", str(tmp_path), "--data.corpus_dir", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("rvqlm train-codec: error: loudness_weight must be >= 0")
