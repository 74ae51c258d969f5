# Two commands work on a fresh clone with only python3: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint clean venv bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev,plot,inspect,serve,vision]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/aiayn demo

test: $(STAMP)
	$(PY) -m pytest tests -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
