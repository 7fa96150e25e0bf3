# loglin-edu: `make book` builds the book, `make test` runs the tests. Each sets up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-fast gpu-test book clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

setup: $(VENV)/.installed

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -x --hypothesis-profile=default -k "not slow"

gpu-test: setup
	$(PY) -m pytest -q -m gpu

clean:
	rm -rf $(VENV) _build book/_build .pytest_cache .hypothesis
