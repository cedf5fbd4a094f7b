# gradcam-cli developer commands. Everything runs in .venv, created on first use from nothing but Python.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install browser test test-quick demo yolo-example lint bench gpu-check smoke baseline clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

PLUGIN := tests/plugins/example_plugin

$(STAMP): pyproject.toml $(PLUGIN)/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[lite0,timm,hf,ray,serve,yolo,clip,medical,test]'
	$(BIN)/python -m pip install --quiet -e $(PLUGIN)
	touch $(STAMP)

install: $(STAMP) browser  ## create .venv and install the tool with every extra (lite0, timm, hf, ray, serve, yolo, clip, medical), the test tools and the example plugin (tests/plugins)

browser:  ## headless Chromium for the gallery's browser tests: Debian's package when root, else the tests say how
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the gallery tests"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q chromium >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } || \
		echo "warning: apt-get could not install chromium; the gallery's browser tests will be skipped"; \
	else \
		echo "note: no chromium on PATH; the gallery's browser tests will be skipped (install Chromium to run them)"; \
	fi

test: install  ## the whole suite (slow cases included)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-quick: install  ## the quick subset, about a minute: the tests marked quick, a few light ones in every folder of tests/
	$(BIN)/python -m pytest -m "quick and not slow" $(PYTEST_ARGS)

demo: install  ## explain the sample photos with the ImageNet-pretrained EfficientNet-Lite0: overlays, panels, gallery
	$(BIN)/gradcam sample_images --model efficientnet_lite0 --output-dir gradcam_out/demo --top-k 2 \
		--quality 85 --panel --report --manifest gradcam_out/demo/manifest.jsonl
	@echo "overlays and panels written to gradcam_out/demo/; open gradcam_out/demo/index.html"

yolo-example: install  ## squares.pt (a tiny YOLO trained on coloured squares, seeded, offline) and wide.png, for the README's YOLO example
	$(BIN)/python tests/yolo_model.py .

lint: install  ## ruff (style and common bugs) and mypy --strict on the package
	$(BIN)/ruff check gradcam_cli tests benchmarks
	$(BIN)/ruff format --check gradcam_cli tests benchmarks
	$(BIN)/mypy

gpu-check: install  ## on a CUDA GPU, under 8 minutes: the gpu tests, resnet50 images/s in fp32 and bf16 against a plain loop, a tiny VLM's map, peak memory; figures into docs/benchmarks.md (exit 77 without CUDA)
	$(BIN)/python benchmarks/gpu_check.py

SMOKE    := sample_images --model efficientnet_lite0 --method gradcam,layercam --top-k 2 --deterministic --quiet
BASELINE := tests/drift_baseline.jsonl

smoke: install  ## explain sample_images/ and diff the maps against the committed baseline (fails on drift; CI runs it)
	rm -rf gradcam_out/smoke
	$(BIN)/gradcam $(SMOKE) --output-dir gradcam_out/smoke --manifest gradcam_out/smoke/manifest.jsonl
	$(BIN)/gradcam diff $(BASELINE) gradcam_out/smoke --report gradcam_out/smoke/diff

baseline: install  ## rewrite tests/drift_baseline.jsonl from this code and model (after a deliberate change of the maps)
	rm -rf gradcam_out/baseline
	$(BIN)/gradcam $(SMOKE) --output-dir gradcam_out/baseline --manifest $(BASELINE)

bench: install  ## speed and memory figures, as ratios against baselines measured in the same run
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf gradcam_out .pytest_cache build *.egg-info
