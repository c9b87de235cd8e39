# velvetrope — see README.md.  `make test` and `make demo` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo install lint typecheck pytest bench chaos fuzz soak clean

# the modules that setup.py compiles with mypyc: edited, they are built again
COMPILED := $(shell sed -n 's/^ *"\(velvetrope\/[a-z_]*\/[a-z_]*\.py\)",$$/\1/p' setup.py)

$(STAMP): pyproject.toml setup.py $(COMPILED)
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check velvetrope tests bench harness
	$(BIN)/ruff format --check velvetrope tests bench harness

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

demo: $(STAMP)
	$(BIN)/velvetrope demo

bench: $(STAMP)
	$(BIN)/python bench/core_bench.py

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
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
