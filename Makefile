# make test: builds .venv (CPU stack, pinned), installs the project, runs the whole suite.
# make demo: the end-to-end CPU example (not built yet: see README).
# make bench: the core's speed and memory benchmark (docs/performance.md).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export RAY_AUTH_MODE ?= disabled

.PHONY: install test demo bench clean

$(STAMP): requirements.txt constraints.txt setup.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is required"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/bench_core.py

demo: $(STAMP)
	@echo "make demo will run D-ARL one-step-off training end to end on CPU (Ray, a tiny model,"
	@echo "real weight sync, replay K=4, pmis). That pipeline is not built yet; see README.md."
	@exit 2

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
