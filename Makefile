# Bootstrap a local .venv from nothing and run things inside it.
# `make test` runs ruff then the whole suite; `make sweep` runs the main job.
# Accelerators: `make venv ACCEL=cuda12` (or cuda13, tpu) adds JAX's GPU / TPU wheels.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
ACCEL  ?=
comma  := ,
EXTRAS := dev$(if $(ACCEL),$(comma)$(ACCEL))
STAMP  := $(VENV)/.installed$(if $(ACCEL),-$(ACCEL))

.PHONY: venv lint test sweep verify bench bench-device figures notebooks clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest -q -n 2 --dist loadfile tests

sweep: $(STAMP)
	$(VENV)/bin/vccc sweep

verify: $(STAMP)
	$(VENV)/bin/vccc verify

figures: $(STAMP)
	$(VENV)/bin/vccc figures --results results --out figures --gallery docs/figures

# Executed notebooks (outputs included) for Jupyter: notebooks/<name>.ipynb (git-ignored).
notebooks: $(STAMP)
	$(VENV)/bin/vccc figures --results results --out figures --ipynb notebooks

bench: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,bench]'
	$(VENV)/bin/vccc bench estimators

# One run on a GPU / TPU host (under 8 minutes): results/bench/device/device.{json,md}.
bench-device: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS),bench]'
	$(VENV)/bin/vccc bench device --out results/bench/device

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
