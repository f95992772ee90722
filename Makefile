# Two commands do everything on a fresh clone: `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# torch is pinned here (not in pyproject) because a CPU wheel of this version is on disk;
# an open range would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

.PHONY: venv venv-demo demo test bench bench-quick priors priors-check docs-figures clean

# Two environments in one .venv, each installed once: the demo's (the core, the plot extra and
# the pinned torch: what `python -m neuraldbg.demo` imports) and the full one of `make test`
# (adds the test and ecosystem extras: lightning, transformers, diffusers, torch_geometric ...).
$(VENV)/.demo-installed: pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q $(TORCH_PIN)
	$(VPY) -m pip install -q -e '.[plot]' $(TORCH_PIN)
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.demo-installed
	$(VPY) -m pip install -q -e '.[test,plot,ecosystem]' $(TORCH_PIN)
	touch $@

venv-demo: $(VENV)/.demo-installed

venv: $(VENV)/.installed

demo: venv-demo
	$(VPY) -m neuraldbg.demo

test: venv
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q

bench: venv
	$(VPY) -m benchmarks run --out bench-out/full

bench-quick: venv
	$(VPY) -m benchmarks run --quick --out bench-out/quick

# read from the package (neuraldbg/vocab.py), not copied here; `=` defers it until the venv exists
FAMILIES = $(shell $(VPY) -c "from neuraldbg.vocab import FAMILIES; print(*FAMILIES)")
BENCH_DIR ?= bench-out/full

# Refit every shipped prior file from a full benchmark run (reuses $(BENCH_DIR) when it holds
# one: the harness resumes, running again only the records other code made, which tune-priors
# would refuse). Each file keeps the hand-set tables it started from, so running this twice
# does not count the same runs twice.
priors: venv
	$(VPY) -m benchmarks run --out $(BENCH_DIR)
	for f in $(FAMILIES); do \
	  $(VPY) -m neuraldbg.cli tune-priors --family $$f --runs $(BENCH_DIR) --out neuraldbg/priors/$$f.json --no-temperature || exit 1; \
	done

# Whether every shipped prior file was fitted on exactly the evidence this code records (exit 1
# when one is stale: refit with `make priors`); runs the full benchmark into $(BENCH_DIR) first.
priors-check: venv
	$(VPY) -m benchmarks run --out $(BENCH_DIR)
	$(VPY) -m neuraldbg.cli check-priors --runs $(BENCH_DIR)

# Every figure under docs/ comes from this script (headless Chromium; it says how to get one
# when none is installed), so a figure cannot drift from what the code draws today.
docs-figures: venv-demo
	$(VPY) docs/figures.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
