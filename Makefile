# Two commands for a fresh clone:
#   make demo   set up (.venv, system packages, built-in corpus) and run the main job (report in runs/demo/)
#   make test   set up and run the test suite
# `make example-report` rewrites the committed example report in samples/ (on purpose only).
VENV   ?= .venv
PY     := $(VENV)/bin/python
RVQLM  := $(VENV)/bin/rvqlm
STAMP  := $(VENV)/.installed

.PHONY: setup system-deps corpus voices demo example-report test bench-setup clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) system-deps

# Debian packages: the built-in real-speech corpus (fillets-ng-data-cs) and small wav prompts.
system-deps:
	@bash scripts/system_deps.sh

corpus: setup
	$(RVQLM) corpus prepare fillets

# The voices corpus (other speakers and languages; Debian's asterisk-core-sounds-*-g722).
voices: setup
	@bash scripts/system_deps.sh --voices
	$(RVQLM) corpus prepare voices

demo: setup
	$(RVQLM) demo

example-report: setup
	$(RVQLM) demo --samples samples

test: setup
	$(PY) -m pytest -q

# Benchmarks (not run in CI): quality against Opus/codec2 needs PESQ/STOI and the reference codecs.
bench-setup: setup
	$(PY) -m pip install -q -e '.[dev,bench]'
	@bash scripts/system_deps.sh --bench

clean:
	rm -rf data runs lightning_logs .pytest_cache
