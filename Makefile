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

.PHONY: venv lint test sweep verify audit bench bench-device figures gallery notebooks clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

sweep: $(STAMP)
	$(VENV)/bin/vccc sweep

verify: $(STAMP)
	$(VENV)/bin/vccc verify

# The field audit (docs/field_audit.md): rlax, verl, AReaL and tunix's estimators checked exactly
# at lags 0, 1, 4, 16. torch (the `audit` extra) from PyPI; verl / AReaL / tunix are not
# installed (heavy dependencies): their wheels are downloaded without dependencies and
# unpacked in .audit/src, and the adapters import the audited files by path.
AUDIT_WHEELS := verl==0.9.1 areal==1.0.4 google-tunix==0.1.7
audit: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,audit]'
	$(PY) -m pip download -q --no-deps -d .audit/wheels $(AUDIT_WHEELS)
	for w in .audit/wheels/*.whl; do \
	  $(PY) -m zipfile -e $$w .audit/src/$$(basename $$w | cut -d- -f1-2); done
	$(VENV)/bin/vccc verify --field-audit --quick --num-mdps 16 --samples 256 --out docs/field_audit.md

# figures/ only (git-ignored): the tree stays clean. `make gallery` also refreshes the small
# committed PNGs of docs/figures (adding none).
figures: $(STAMP)
	$(VENV)/bin/vccc figures --results results --out figures

gallery: $(STAMP)
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
