# gradcam-cli developer commands. Everything runs in .venv, created on first use from nothing but Python.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install test test-quick demo lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[lite0,test]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the tool with its optional model and test extras

test: install  ## the whole suite (slow cases included)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-quick: install  ## the quick subset: no many-architecture sweeps, no subprocess smoke runs
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

demo: install  ## explain the sample photos with the ImageNet-pretrained EfficientNet-Lite0: overlays, panels, gallery
	$(BIN)/gradcam sample_images --model efficientnet_lite0 --output-dir gradcam_out/demo --top-k 2 \
		--format jpg --quality 85 --panel --report --manifest gradcam_out/demo/manifest.jsonl
	@echo "overlays and panels written to gradcam_out/demo/; open gradcam_out/demo/index.html"

lint: install
	$(BIN)/ruff check gradcam_cli tests benchmarks
	$(BIN)/ruff format --check gradcam_cli tests benchmarks

bench: install  ## speed and memory figures, as ratios against baselines measured in the same run
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf gradcam_out .pytest_cache build *.egg-info
