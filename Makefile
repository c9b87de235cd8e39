# velvetrope — see README.md.  `make test` and `make demo` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-latest lock lock-peer bench-peer docs reference test-engines llama-server demo install lint typecheck pytest bench chaos fuzz soak clean constraints deploy-bench studies

# llama.cpp's llama-server, built from the llama-cpp-python sdist (harness/llama_build.py)
# and kept here between runs: minutes to build on two cores, once per machine
LLAMA_CACHE ?= $(HOME)/.cache/velvetrope/llama
export VELVETROPE_LLAMA_CACHE := $(LLAMA_CACHE)

# the modules that setup.py compiles with mypyc: edited, they are built again
COMPILED := $(shell sed -n 's/^ *"\(velvetrope\/[a-z_]*\/[a-z_]*\.py\)",$$/\1/p' setup.py)

# requirements/dev.txt: every package `make` installs (the dev tools, every extra and the
# build requirements), resolved once and hashed by pip-compile; `make lock` refreshes it on
# purpose.  The package itself keeps ranges (pyproject.toml): users install it as a library.
PIP_VERSION := 26.3
PIP_TOOLS_VERSION := 7.7.0
LOCK := requirements/dev.txt

$(STAMP): pyproject.toml setup.py $(LOCK) $(COMPILED)
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# re-resolve the lock to today's newest releases within pyproject.toml's ranges and the
# image's pins (deploy/constraints.txt: `make constraints` moves those); `make lock
# LOCK_UPGRADE=` keeps every pin the lock has and only adds what pyproject.toml newly needs
LOCK_UPGRADE ?= --upgrade
lock:
	$(PY) -m venv .venv-lock
	.venv-lock/bin/python -m pip install --quiet pip==$(PIP_VERSION) pip-tools==$(PIP_TOOLS_VERSION)
	.venv-lock/bin/pip-compile --quiet $(LOCK_UPGRADE) --generate-hashes --allow-unsafe \
	  --extra dev --all-build-deps --strip-extras --no-emit-index-url --no-emit-find-links \
	  --constraint deploy/constraints.txt --output-file $(LOCK) pyproject.toml
	@# dev's own `velvetrope[all]` resolves to this checkout: not a locked package
	sed -i '/^# WARNING: pip install will require/,/^    # via file:/d' $(LOCK)

# the suite against the newest releases of everything (not the lock), in a venv of its own:
# drift shows here before it breaks a fresh `make test`.  Not part of .ci/run.
LATEST := .venv-latest
test-latest:
	rm -rf $(LATEST) && $(PY) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet --upgrade -e '.[dev]'
	$(LATEST)/bin/ruff check velvetrope tests bench harness
	$(LATEST)/bin/ruff format --check velvetrope tests bench harness
	$(LATEST)/bin/mypy
	$(LATEST)/bin/python -m pytest -q -n 2 --ignore=tests/engines

# promtool, for the alert rules' unit tests (tests/test_chart.py): from Debian's
# `prometheus` package, unpacked (no daemon installed or started); one on PATH is reused
PROMTOOL := $(BIN)/promtool
$(PROMTOOL): | $(STAMP)
	@if command -v promtool >/dev/null; then ln -sf "$$(command -v promtool)" $@; else \
	  tmp=$$(mktemp -d) && cd $$tmp && \
	  { apt-get download prometheus 2>/dev/null || { apt-get update -qq && apt-get download prometheus; }; } && \
	  dpkg-deb -x prometheus_*.deb x && cp x/usr/bin/promtool $(CURDIR)/$@ && rm -rf $$tmp; fi
	$@ --version | head -1

install: $(STAMP) $(PROMTOOL)

lint: $(STAMP)
	$(BIN)/ruff check velvetrope tests bench harness
	$(BIN)/ruff format --check velvetrope tests bench harness

typecheck: $(STAMP)
	$(BIN)/mypy

# two workers (the 10-minute budget on two cores), then the tests marked `alone` by
# themselves: their verdicts read load (client hang-ups, leftovers) another test would add
pytest: $(STAMP) $(PROMTOOL)
	$(BIN)/python -m pytest -q -n 2 -m "not alone" --ignore=tests/engines
	$(BIN)/python -m pytest -q -m alone --ignore=tests/engines

test: lint typecheck pytest

llama-server: $(STAMP)
	$(BIN)/python -m harness.llama_build

# the tier with a real engine nobody here wrote (llama.cpp): .ci/run runs it after `make test`
test-engines: llama-server
	$(BIN)/python -m pytest -q tests/engines

demo: $(STAMP)
	$(BIN)/velvetrope demo

# every experiments/*/run.py, two at a time, then experiments/README.md's verdict table; a
# study that reproduces its committed report leaves it (and its stamp) byte-identical
studies: $(STAMP)
	$(BIN)/python -m experiments

# the documentation site (mkdocs.yml, docs/): strict, so a broken link, a missing page or any
# other warning fails; into site/ (not committed).  NO_MKDOCS_2_WARNING: Material's banner
# about its end of life (May 2027; Zensical, its successor, reads this mkdocs.yml) is not
# a build warning, and CI's log needs it once, here, not on every build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the generated files: the configuration reference and the config's JSON Schema (from the
# pydantic models) and the chart's values.schema.json (from values.yaml and that schema);
# tests/test_reference.py and tests/test_chart.py fail when the committed ones are stale
reference: $(STAMP)
	$(BIN)/python -m harness.config_reference
	$(BIN)/python -m harness.chart_schema

bench: $(STAMP)
	$(BIN)/python bench/core_bench.py

# the demo's workload through SGLang's Shepherd Model Gateway against ours, real processes
# (bench/peer_gateway.py); SMG from requirements/peer.txt (hashed) in a venv of its own
PEER := .venv-peer
PEER_LOCK := requirements/peer.txt
$(PEER)/.installed: $(PEER_LOCK)
	$(PY) -m venv $(PEER)
	$(PEER)/bin/python -m pip install --quiet pip==$(PIP_VERSION)
	$(PEER)/bin/python -m pip install --quiet --require-hashes -r $(PEER_LOCK)
	touch $@

PEER_DRAIN ?= 12
bench-peer: $(STAMP) $(PEER)/.installed
	$(BIN)/python bench/peer_gateway.py --smg $(PEER)/bin/smg --drain $(PEER_DRAIN)

lock-peer:
	$(PY) -m venv .venv-lock
	.venv-lock/bin/python -m pip install --quiet pip==$(PIP_VERSION) pip-tools==$(PIP_TOOLS_VERSION)
	.venv-lock/bin/pip-compile --quiet --upgrade --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links --output-file $(PEER_LOCK) requirements/peer.in

# deploy/constraints.txt: the image's pinned dependency set, what a base install (no extra)
# resolves to; run after changing [project] dependencies (tests/test_packaging.py checks it)
constraints: $(STAMP)
	$(BIN)/python -m harness.wheelenv constraints

# wheel, base install, serve RSS, chart renders and schema checks: the `deploy:` line
deploy-bench: $(STAMP)
	$(BIN)/python bench/deploy_bench.py

# two gateways, one Redis, two engines under load through Redis, engine and gateway faults,
# both failure policies; ends with one verdict line per policy, exit 0 iff all counters are 0
chaos: $(STAMP)
	$(BIN)/python -m harness.chaos

# schema-aware fuzzing of both completion endpoints against real processes (harness/fuzz.py)
fuzz: $(STAMP)
	$(BIN)/python -m harness.fuzz

# an hour of the demo's load through one gateway on Redis; SOAK_SECONDS=600 for a shorter one
SOAK_SECONDS ?= 3600
soak: $(STAMP)
	$(BIN)/python -m harness.soak --seconds $(SOAK_SECONDS)

clean:
	rm -rf $(VENV) .venv-lock $(LATEST) $(PEER) .mypy_cache .pytest_cache .ruff_cache .hypothesis
