# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv and install the pinned dependencies themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo drill test test-unit test-pythons test-integration suite-cpu check fmt clean gpu-check system-deps lock bytecode

# requirements/dev.lock pins every package of the dev/CI environment; `make lock` regenerates
# it (and requirements/test.lock, the core test tier's) with uv from pyproject.toml.
$(STAMP): pyproject.toml requirements/dev.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements/dev.lock -e '.[torch,dev]'
	touch $(STAMP)

# Regenerate the locks after a dependency change in pyproject.toml. Versions already locked
# are kept where they still fit; torch stays at requirements/pins.txt's 2.13.0 (a CPU build,
# from /opt/wheels on these machines).
UV := $(VENV)/bin/uv
LOCK_ARGS := -c requirements/pins.txt --find-links /opt/wheels --python-version 3.11 --no-header --annotation-style line
lock: $(STAMP)
	$(PY) -m pip install --quiet uv
	$(UV) pip compile pyproject.toml --extra torch --extra dev $(LOCK_ARGS) -o requirements/dev.lock
	$(UV) pip compile pyproject.toml --extra torch --extra test $(LOCK_ARGS) -o requirements/test.lock

# Where PYTHONDONTWRITEBYTECODE is set (as on these machines), nothing caches the compiled
# modules of the editable install: every `acceptrun` process would compile the ~120 it
# imports again (a trivial `acceptrun run`: 2.0 -> 1.35 CPU-s). compileall writes them
# once and skips what is up to date; Python reads them whatever that variable says.
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 src tests bench examples tools

# The venv's bin goes first on PATH: the demo spec runs `python train.py`.
demo: $(STAMP) bytecode
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" examples/charlm/demo.sh

# The operations acceptance test on the demo: a reference run, then a run killed after its
# first checkpoint and preempted later; both must agree bit for bit (`acceptrun drill`).
drill: $(STAMP) bytecode
	cd examples/charlm && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" acceptrun drill spec.toml

# Two tiers (docs/architecture.md, Tests): tests/unit starts no process and runs in well
# under a minute; tests/integration runs real child processes, spread over xdist workers
# a file at a time (module-scoped fixtures are set up once; most of the time is spent
# waiting on children, so more workers than cores pays off; more than 4 does not: run back
# to back here, 4 workers 10 min 26 s and 1,065 CPU-s, 6 workers 11 min 31 s and 1,174).
# Files go out in collection order; starting the longest files first is in
# docs/architecture.md (Tests): tried, not kept.
# `pytest` alone runs the unit tier.
# PYTHONDONTWRITEBYTECODE is emptied for the suite: pytest honours it by rewriting the
# asserts of every test module again in every xdist worker (7.5 CPU-s a worker here); with
# it empty, the rewritten modules are cached in tests/**/__pycache__ after the first run.
TEST_WORKERS ?= 4
# The unit tier on both cores: 2,500 tests of about 35 ms each, 90 s on one core.
UNIT_WORKERS ?= 2
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest
test: $(STAMP) system-deps bytecode
	$(PYTEST) -q -n $(UNIT_WORKERS) tests/unit
	$(MAKE) --no-print-directory test-pythons
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile tests/integration

test-unit: $(STAMP) bytecode
	$(PYTEST) -q -n $(UNIT_WORKERS) tests/unit

# The unit tier on every other Python the package declares (pyproject's classifiers), each
# in .venv-<version> with the test extra only: torch's CPU wheel here is for 3.11, so the
# test files that import torch are left out there, and the summary names them. The
# interpreter is python<version> on PATH, else pyenv's; none fails the target: every
# declared version is tested. Then the torch-free integration files below, on each of
# them: real supervisors, signals, torn logs, the client and a newer release's record
# (about 25 s a version on two cores; the rest of the tier's workloads import torch).
OTHER_PYTHONS ?= 3.12 3.13
PYTHONS_INTEGRATION ?= tests/integration/test_supervisor.py tests/integration/test_client.py \
  tests/integration/test_steplog_torn.py tests/integration/test_torn_log.py \
  tests/integration/test_hostile_paths.py tests/integration/test_watched_habits.py \
  tests/integration/test_versions.py tests/integration/test_durable_crashes.py \
  tests/integration/test_watchdog_identity.py
test-pythons:
	@for v in $(OTHER_PYTHONS); do \
	  py=; for c in "$$(command -v python$$v)" $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v; do \
	    if [ -x "$$c" ] && "$$c" -c '' >/dev/null 2>&1; then py=$$c; break; fi; done; \
	  [ -n "$$py" ] || { echo "no python$$v here (PATH, pyenv): install it (pyenv install $$v) to test it"; exit 1; }; \
	  venv=.venv-$$v; \
	  if [ ! -f $$venv/.installed ] || [ pyproject.toml -nt $$venv/.installed ] || [ requirements/test.lock -nt $$venv/.installed ]; then \
	    rm -rf $$venv && $$py -m venv $$venv && $$venv/bin/python -m pip install --quiet --upgrade pip \
	    && $$venv/bin/python -m pip install --quiet -c requirements/test.lock -e '.[test]' && touch $$venv/.installed || exit 1; \
	  fi; \
	  echo "unit tier on $$($$venv/bin/python --version)"; \
	  PYTHONDONTWRITEBYTECODE= $$venv/bin/python -m pytest -q -n 2 -p no:cacheprovider tests/unit || exit 1; \
	  echo "torch-free integration files on $$($$venv/bin/python --version)"; \
	  PYTHONDONTWRITEBYTECODE= $$venv/bin/python -m pytest -q -n 2 --dist loadfile -p no:cacheprovider $(PYTHONS_INTEGRATION) || exit 1; \
	done

test-integration: $(STAMP) system-deps bytecode
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile tests/integration

# Where the integration tier's CPU goes, per file and per test (tools/suite_cpu.py).
# SUITE_CPU_TESTS narrows it (a file, a folder).
SUITE_CPU_LOG ?= /tmp/acceptrun-suite-cpu.jsonl
SUITE_CPU_TESTS ?= tests/integration
suite-cpu: $(STAMP) system-deps bytecode
	rm -f $(SUITE_CPU_LOG)
	-ACCEPTRUN_TEST_CPU_LOG=$(SUITE_CPU_LOG) $(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile $(SUITE_CPU_TESTS)
	$(PY) tools/suite_cpu.py $(SUITE_CPU_LOG)

# Debian packages the suite uses for real: headless Chromium and its driver (the HTML
# report is opened in a browser), Slurm and munge (a one- or two-node cluster on localhost).
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
	$(VENV)/bin/ruff check --no-cache src tests examples bench tools  # a cache keeps a moved module's old import section
	$(VENV)/bin/ruff format --no-cache --check src tests examples bench tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports  # the layering contract in .importlinter

fmt: $(STAMP)
	$(VENV)/bin/ruff format src tests examples bench tools
	$(VENV)/bin/ruff check --fix src tests examples bench tools

# Every GPU check of the project; figures go into the folder given as OUT.
gpu-check:
	bash bench/gpu_check.sh $(OUT)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
