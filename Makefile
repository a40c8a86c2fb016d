# `make demo` and `make test` are the only commands a new user needs: both create
# .venv when missing and install the project (editable) into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench experiments clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# Two workers (pytest-xdist; a file with a module fixture stays on one worker): CI has 2 cores.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) benchmarks/dp_speed.py
	$(PY) benchmarks/auto_plan_time.py --quick

experiments: $(STAMP)
	$(PY) -m paper_experiments --quick

clean:
	rm -rf $(VENV) results .pytest_cache
