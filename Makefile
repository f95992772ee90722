# Two commands do everything on a fresh clone: `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# torch is pinned here (not in pyproject) because a CPU wheel of this version is on disk;
# an open range would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

.PHONY: venv demo test bench bench-quick clean

$(VENV)/.installed: pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q $(TORCH_PIN)
	$(VPY) -m pip install -q -e '.[test,plot]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VPY) -m neuraldbg.demo

test: venv
	$(VPY) -m pytest -q

bench: venv
	$(VPY) -m benchmarks run --out bench-out/full

bench-quick: venv
	$(VPY) -m benchmarks run --quick --out bench-out/quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
