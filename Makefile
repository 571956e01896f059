# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv and install the pinned dependencies themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo drill test check fmt clean gpu-check system-deps

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[torch,dev]'
	touch $(STAMP)

# The venv's bin goes first on PATH: the demo spec runs `python train.py`.
demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" examples/charlm/demo.sh

# The operations acceptance test on the demo: a reference run, then a run killed after its
# first checkpoint and preempted later; both must agree bit for bit (`acceptrun drill`).
drill: $(STAMP)
	cd examples/charlm && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" acceptrun drill spec.toml

test: $(STAMP) system-deps
	$(PY) -m pytest -q

# Debian packages the suite uses for real: headless Chromium and its driver (the HTML
# report is opened in a browser), Slurm and munge (a single-node cluster on localhost).
SYSTEM_PACKAGES := chromium chromium-driver slurm-wlm munge wrk
system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null \
	    || { echo "could not install $$missing: install them with apt-get (root) and run make test again"; exit 1; }; \
	fi

check: $(STAMP)
	$(VENV)/bin/ruff check src tests examples bench tools
	$(VENV)/bin/ruff format --check src tests examples bench tools
	$(VENV)/bin/mypy

fmt: $(STAMP)
	$(VENV)/bin/ruff format src tests examples bench tools
	$(VENV)/bin/ruff check --fix src tests examples bench tools

# Every GPU check of the project; figures go into the folder given as OUT.
gpu-check:
	bash bench/gpu_check.sh $(OUT)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
