# Bootstrap a local .venv from nothing and run things inside it.
# `make test` runs the whole suite; `make sweep` runs the main job.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test sweep verify bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

sweep: $(STAMP)
	$(VENV)/bin/vccc sweep

verify: $(STAMP)
	$(VENV)/bin/vccc verify

bench: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,bench]'
	$(VENV)/bin/vccc bench estimators

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
