# Hook Lab: `make lab` to study, `make test` to check everything. See README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell for py in $(SUPPORTED_PYTHONS:%=python%) python3; do \
	command -v $$py >/dev/null && $$py -c '' 2>/dev/null && { command -v $$py; break; }; done)
# PYTHON: the first of python3.11, python3.12, python3.13, python3 that runs (a pyenv shim of a
# version that is not selected does not); make env PYTHON=... picks another. The Pythons Hook Lab
# supports (pyproject.toml's requires-python and tools/pythons.py say the same): the pinned packages
# (requirements.lock) install on each, and the stored outputs hold on each (make pythons).
SUPPORTED_PYTHONS := 3.11 3.12 3.13
# make env needs a supported Python: checked first, before anything is created or downloaded. The
# venv's own python once it exists, else $(PYTHON).
CHECK_PYTHON = py="$$( [ -x $(BIN)/python ] && echo $(BIN)/python || echo '$(PYTHON)' )"; \
	version="$$( [ -n "$$py" ] && "$$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null )"; \
	case "$$version" in 3.11.*|3.12.*|3.13.*) ;; *) \
	  if [ -z "$$py" ]; then echo "Hook Lab needs Python 3.11, 3.12 or 3.13, and none of python3.11, python3.12, python3.13, python3 runs."; \
	  elif [ -z "$$version" ]; then echo "Hook Lab needs Python 3.11, 3.12 or 3.13, and $$py does not run."; \
	  else echo "Hook Lab needs Python 3.11, 3.12 or 3.13, and $$py is Python $$version."; fi; \
	  echo "Install one of them (python.org, your package manager, pyenv, or: uv python install 3.13), then pick it with"; \
	  echo "  make env PYTHON=/path/to/python3.13   (or python3.11, python3.12)"; \
	  [ ! -e $(BIN)/python ] || echo "after deleting $(VENV), which was made with that Python (make clean)."; \
	  exit 1;; esac
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hooklab-installed
NB ?= notebooks

# Notebooks run in the course's kernel, "Hook Lab" (tools/install_kernel.py, installed by make env):
# one thread and a fixed hash seed, wherever it is started (make, JupyterLab, a hub). Nothing pins
# the CPU's kernels: printed numbers are compared to the precision they were printed with
# (tools/nbval_numbers.py), so the stored outputs hold on any x86-64 CPU. make test checks that by
# running every notebook again the way other CPUs compute (VARIANTS below).
export PYTHONHASHSEED := 0
unexport PYTHONWARNINGS

NBVAL := $(BIN)/python -m pytest -p no:cacheprovider --nbval --nbval-kernel-name hooklab \
	--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=300

# How other machines compute, simulated on this one: no SIMD kernels at all on two threads (every
# float sum in another order: the farthest from any real CPU), and the AVX2 kernels (what a CPU
# without AVX-512 runs) on one thread. The plain nbval run uses this CPU's best kernels.
# Without SIMD a check runs up to 15 times slower: HOOKLAB_CHECK_TIME_SCALE stretches check()'s time limits.
# OMP_WAIT_POLICY=PASSIVE: its two threads sleep instead of spinning while they wait, so the run does not
# slow itself and the check beside it when make test shares the cores (the sums' order is unchanged).
NO_SIMD_2_THREADS := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_CBWR=COMPATIBLE HOOKLAB_THREADS=2 \
	HOOKLAB_CHECK_TIME_SCALE=10 OMP_WAIT_POLICY=PASSIVE
AVX2_1_THREAD := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2 HOOKLAB_THREADS=1

.PHONY: help env lab test lint unit unit-core sections nbval variants variant-no-simd variant-avx2 browser pythons notebooks check grade site release lock bench clean

help:
	@echo "make lab        build the environment if needed and open JupyterLab on the course"
	@echo "make test       the same environment, then every check (lint, then unit tests, sections, nbval, its variants, browser: two at a time, logs in artifacts/checks/)"
	@echo "make check NB=notebooks/01_tensor_hooks.ipynb   strict nbval on one notebook"
	@echo "make notebooks [NB=path.ipynb]   re-execute notebooks in a fresh kernel and save them"
	@echo "make browser    JupyterLab in Debian's Chromium: Run All, move the sliders (screenshots in artifacts/)"
	@echo "make grade NB=\"a.ipynb b.ipynb\"   run students' notebooks and report each exercise's verdict"
	@echo "                GRADE_ARGS=\"--jobs 4 --csv grades.csv\": 4 notebooks at a time; one CSV row per student and exercise"
	@echo "                each in a sandbox (bubblewrap) with limits: tools/grade.py --help"
	@echo "make site       the course as a static website in artifacts/site/ (stored outputs, no kernel)"
	@echo "                SITE_ARGS=--no-answers: without the worked answers"
	@echo "make release    a student copy in artifacts/release/ (no solutions, no tests) and artifacts/hooklab-student.zip"
	@echo "make bench      recording overhead, memory, widget redraw and notebook times (artifacts/bench.json)"
	@echo "make env        create .venv with the pinned packages (reinstalled only when requirements.lock or pyproject.toml change)"
	@echo "make lock       after editing requirements.txt: pin every package again (requirements.lock, environment.yml, binder/)"
	@echo "make lint       ruff check on src, tests, tools and notebooks"
	@echo "make unit       the unit tests (pytest tests, without the browser test; make unit-core and make sections are its two parts)"
	@echo "make nbval      nbval on every notebook under notebooks/, guide/ and solutions/ included (saved outputs must match a fresh run; numbers to their printed precision)"
	@echo "make variants [NB=path.ipynb]   nbval again as other CPUs compute: no SIMD on 2 threads, and AVX2 (logs in artifacts/)"
	@echo "make pythons    nbval on every supported Python found (3.11, 3.12, 3.13: PATH, pyenv), each in its own .venv-X.Y"
	@echo "                PYTHONS_ARGS=\"3.12 --jobs 1\": only these; --skip-venv leaves out .venv's (make test checked it)"
	@echo "make clean      delete .venv, the .venv-X.Y of make pythons, the pytest and ruff caches and artifacts/"

env: $(STAMP)

# Rebuilt when the locked pins or the package metadata change; otherwise nothing is reinstalled.
$(STAMP): requirements.lock pyproject.toml tools/install_kernel.py
	@$(CHECK_PYTHON)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.lock
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps -e .
	$(BIN)/python tools/install_kernel.py
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS)

# Every check on two queues, the longest first (tools/run_checks.py): the unit tests, the sections
# test, nbval, its two CPU variants and the browser, two at a time; logs in artifacts/checks/.
test: lint
	$(BIN)/python tools/run_checks.py

lint: $(STAMP)
	$(BIN)/ruff check src tests tools notebooks

unit: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -m "not browser" tests

# make unit in two parts that make test runs side by side: every section of every lesson and guide
# run alone after the setup cells (tests/test_sections.py), and the rest.
unit-core: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -m "not browser" --ignore=tests/test_sections.py tests

sections: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests/test_sections.py

# Installs Debian's chromium first when it is missing (apt-get, as root or with passwordless sudo); never downloads a browser.
browser: $(STAMP)
	tools/ensure_browser.sh
	$(BIN)/python -m pytest -p no:cacheprovider -m browser tests/browser

nbval: $(STAMP)
	$(NBVAL) notebooks

# The two runs share the machine's two cores; each writes its own log (named after NB's first
# notebook, so that runs on different notebooks do not overwrite each other) and prints its summary.
VARIANT_LOG = artifacts/nbval-$(1)-$(notdir $(basename $(firstword $(NB)))).log
variants: $(STAMP)
	@mkdir -p artifacts
	@echo "nbval, as a CPU without SIMD kernels on 2 threads computes, and as an AVX2 CPU does:"
	$(NO_SIMD_2_THREADS) $(NBVAL) -q $(NB) > $(call VARIANT_LOG,no-simd) 2>&1 & no_simd=$$!; \
	$(AVX2_1_THREAD) $(NBVAL) -q $(NB) > $(call VARIANT_LOG,avx2) 2>&1; avx2=$$?; \
	wait $$no_simd; no_simd=$$?; \
	for log in $(call VARIANT_LOG,no-simd) $(call VARIANT_LOG,avx2); do echo "--- $$log:"; tail -n 25 $$log; done; \
	test $$no_simd = 0 -a $$avx2 = 0

# One variant at a time (make test queues them beside the other checks).
variant-no-simd: $(STAMP)
	$(NO_SIMD_2_THREADS) $(NBVAL) -q $(NB)

variant-avx2: $(STAMP)
	$(AVX2_1_THREAD) $(NBVAL) -q $(NB)

check: $(STAMP)
	$(NBVAL) $(NB)

# Strict nbval on every supported Python found on this machine (python3.X on PATH, else pyenv's), each
# in its own venv (.venv for its own version, .venv-3.X for the others), installed from requirements.lock
# with pip's cache like make env; a Python not found is reported, not failed (tools/pythons.py).
# What it adds to CI after make test (.ci/run: 3.12 and 3.13 two at a time on 2 cores, measured
# 2026-11-28): 6.6 minutes with both venvs installed (nbval 397 s and 376 s side by side, load 5-7),
# plus 2-3 minutes per venv to install on a fresh clone (12-20 minutes each at a load of 10-18).
pythons: $(STAMP)
	$(BIN)/python tools/pythons.py $(PYTHONS_ARGS)

notebooks: $(STAMP)
	$(BIN)/python tools/run_notebooks.py $(filter %.ipynb,$(NB))

# Each kernel runs in bubblewrap: installed first when missing (apt-get, as root or with passwordless sudo);
# where it cannot be, tools/grade.py says so (GRADE_ARGS="--sandbox fallback" grades anyway, with a warning).
grade: $(STAMP)
	@test "$(origin NB)" != file || { echo 'usage: make grade NB="students/ a.ipynb ..." [GRADE_ARGS="--jobs 4 --csv grades.csv --json grades.json"]'; exit 2; }
	@tools/ensure_sandbox.sh || true
	$(BIN)/python tools/grade.py $(NB) $(GRADE_ARGS)

site: $(STAMP)
	$(BIN)/python tools/build_site.py --out artifacts/site $(SITE_ARGS)

release: $(STAMP)
	$(BIN)/python tools/release.py --out artifacts/release

# uv resolves requirements.txt for every platform; installed in a throwaway venv, never in .venv.
UV_VERSION := 0.13.9
lock:
	@test -x artifacts/uv/bin/uv || { $(PYTHON) -m venv artifacts/uv && artifacts/uv/bin/pip install -q uv==$(UV_VERSION); }
	$(PYTHON) tools/lock.py --uv artifacts/uv/bin/uv

bench: $(STAMP)
	$(BIN)/python tools/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(SUPPORTED_PYTHONS:%=.venv-%) .pytest_cache .ruff_cache artifacts
