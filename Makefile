# gpustat — the two commands are `make demo` and `make test`.
# Both create .venv with python3.12 when it is missing and install what they need.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# python3.12 may be a pyenv shim that refuses to run: take the first one that runs.
PYTHON312 ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo "$$p"; break; }; done)
# The JAX range of pyproject.toml is tested at both ends. `make test` runs
#   at the newest end (.venv, where pip resolves the newest jax/jaxlib the range allows):
#     lint, the whole CPU pytest suite (`make pytest`; `slow` tests are never in CI), the
#     notebooks (small) and the docs build;
#   at the lower end (jax/jaxlib $(JAX_MIN), the GPU machine's, installed without
#     dependencies in $(JAX_MIN_DIR) ahead of .venv's packages through PYTHONPATH; every
#     other package is .venv's): the test modules of JAX_MIN_TESTS (`make pytest-jax-min`),
#     the code that leans on JAX's own APIs: the deviceless CUDA lowering of every Pallas
#     kernel, the kernel registry and warnings, the Pallas interpret mode (elementwise
#     kernels), shard_map on a 1-device mesh, the backend table and the package surface.
#     The rest of the suite runs at the newest end only.
# The lower end's pytest runs beside the notebooks and the docs build (make -j), on the
# cores their tails leave idle.
PYTEST_ARGS ?= -q -n 2 -m "not slow"
JAX_MIN := 0.11.2
JAX_MIN_DIR := $(VENV)/jax-$(JAX_MIN)
JAX_MIN_TESTS := tests/pallas/test_lowering.py tests/test_lowerings.py \
	tests/pallas/test_numerics.py tests/pallas/test_mosaic_mixture.py \
	tests/pallas/test_mosaic_piecewise.py tests/test_distributed.py tests/test_backend.py \
	tests/test_public_api.py tests/test_packaging.py
# (tests/test_distributed.py without its 4-device subprocess checks, its costliest part)
PYTEST_JAX_MIN_ARGS ?= -q -m "not slow" $(JAX_MIN_TESTS) \
	--deselect tests/test_distributed.py::test_sharded_equals_unsharded
# `make pytest` and `make notebooks` compile hundreds of small XLA programs, most run
# once: LLVM at optimisation level 0 compiles them ~20% faster (full CPU suite 528 vs
# 664 s on 2 cores). No fast-math at either level; the suite passes at both.
TEST_XLA_FLAGS ?= --xla_backend_optimization_level=0
pytest pytest-jax-min notebooks: export XLA_FLAGS := $(TEST_XLA_FLAGS) $(XLA_FLAGS)
# the two longest first, so that the two-at-a-time run below ends together
LONG_NOTEBOOKS := notebooks/mixture.py notebooks/distributed.py
NOTEBOOKS := $(LONG_NOTEBOOKS) $(filter-out $(LONG_NOTEBOOKS),$(sort $(wildcard notebooks/*.py)))
# what `make gpu-check` runs: gpu-marked tests under TESTS, benchmarks of MODULES
MODULES ?= all
TESTS ?= tests

.PHONY: demo test lint pytest pytest-jax-min notebooks docs gpu-check bench-report clean

$(VENV)/bin/python:
	@test -n "$(PYTHON312)" || { echo "python3.12 not found (pyenv install 3.12 or set PYTHON312=...)"; exit 1; }
	$(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.demo-deps: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test-deps: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e ".[test,docs,notebooks]" pytest-xdist
	touch $@

$(JAX_MIN_DIR)/.installed: $(VENV)/.test-deps
	rm -rf $(JAX_MIN_DIR)
	$(PY) -m pip install -q --no-deps --target $(JAX_MIN_DIR) jax==$(JAX_MIN) jaxlib==$(JAX_MIN)
	PYTHONPATH=$(JAX_MIN_DIR) $(PY) -c 'import jax, jaxlib; \
		assert jax.__version__ == jaxlib.__version__ == "$(JAX_MIN)", jax.__version__'
	touch $@

# The demo keeps compiled programs in JAX's persistent compilation cache, so a second
# `make demo` skips most compilation (the library never switches the cache on itself).
JAX_CACHE_DIR ?= $(HOME)/.cache/gpustat-jax/jax
demo: $(VENV)/.demo-deps
	JAX_COMPILATION_CACHE_DIR=$(JAX_CACHE_DIR) JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
		$(PY) -m gpustat demo

test: $(VENV)/.test-deps $(JAX_MIN_DIR)/.installed
	$(MAKE) lint pytest
	$(MAKE) -j 3 --output-sync=target notebooks docs pytest-jax-min

lint: $(VENV)/.test-deps
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

JAX_VERSION := -c 'import jax, jaxlib; print("pytest with jax", jax.__version__, "jaxlib", jaxlib.__version__)'
pytest: $(VENV)/.test-deps
	@$(PY) $(JAX_VERSION)
	$(PY) -m pytest $(PYTEST_ARGS)

# (PYTHONPATH on the commands only: pip, installing .venv, must not see the lower end)
pytest-jax-min: $(JAX_MIN_DIR)/.installed
	@PYTHONPATH=$(abspath $(JAX_MIN_DIR)) $(PY) $(JAX_VERSION)
	PYTHONPATH=$(abspath $(JAX_MIN_DIR)) $(PY) -m pytest $(PYTEST_JAX_MIN_ARGS)

# two at a time (CI has 2 cores); each notebook's output is printed whole when it ends,
# and any failing notebook fails the target (xargs exits non-zero)
notebooks: $(VENV)/.test-deps
	@printf '%s\n' $(NOTEBOOKS) | xargs -P 2 -I{} sh -c \
		'out=$$(GPUSTAT_NOTEBOOK_SMALL=1 MPLBACKEND=Agg $(PY) {} 2>&1); rc=$$?; \
		printf "== %s (small, exit %s)\n%s\n" {} $$rc "$$out"; exit $$rc'

docs: $(VENV)/.test-deps
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir $(VENV)/site

# What the GPU machine runs, with no install: gpu-marked tests, then the quick
# benchmarks. Logs and JSON lines go to $GPUSTAT_OUT (default benchmarks/results/<device>/).
# The tests are compile-bound: where pytest-xdist is importable they run in
# GPU_TEST_WORKERS processes sharing the GPU (no memory preallocation per process).
GPU_TEST_WORKERS ?= 4
gpu-check:
	@set -o pipefail; \
	out=$${GPUSTAT_OUT:-$$(PYTHONPATH=. python3 -c 'from benchmarks.harness import default_out_dir; print(default_out_dir())')}; \
	mkdir -p "$$out"; log="$$out/gpu-check.log"; status=0; \
	workers=$$(python3 -c 'import xdist' >/dev/null 2>&1 && echo "-n $(GPU_TEST_WORKERS)"); \
	PYTHONPATH=. python3 -m gpustat info 2>&1 | tee "$$log"; \
	XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. python3 -m pytest -m gpu -q \
		-p no:cacheprovider $$workers $(TESTS) 2>&1 | tee -a "$$log" || status=1; \
	PYTHONPATH=. python3 -m gpustat bench $(MODULES) --quick --out "$$out" 2>&1 | tee -a "$$log" || status=1; \
	exit $$status

bench-report: $(VENV)/.test-deps
	$(PY) benchmarks/report.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
