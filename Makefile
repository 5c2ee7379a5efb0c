# lime-sweeps entry points. Every target installs what it needs on a fresh machine.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# A plain `torch` requirement can pull a multi-GB CUDA build; pin the install step.
TORCH   ?= torch==2.13.0
SWEEP   ?= default
# e.g. SWEEP_ARGS=--until-decided: seeds in waves until every comparison is decided
SWEEP_ARGS ?=
PYTEST_ARGS ?=
# `make test`: pytest-xdist workers (2 on CI's 2 cores; tests/conftest.py gives each its share of torch's
# threads); TEST_WORKERS=0 runs the suite in this one process. `make test-shuffled`: the same tests in a
# shuffled order (modules shuffled, and the tests within each), SHUFFLE_SEED=<n> to repeat an order.
TEST_WORKERS ?= 2
TEST_DIST    ?= loadgroup
SHUFFLE_SEED ?=
SEED         := $(or $(SHUFFLE_SEED),$(shell od -An -N3 -tu4 /dev/urandom | tr -d " "))
FAST_TESTS   := -m "not slow and not cluster"
XDIST        := -n $(TEST_WORKERS) --dist $(TEST_DIST)
# `make bench`: the headline table (L16 MHA/GQA eager and compiled, L64-MHA eager; rows stop once their
# interval decides their target; estimated, not yet measured: ~21 min alone on 2 cores with a warm Inductor
# cache, ~38 min cold, docs/BENCH.md); `make bench-full`: every shape
BENCH_ARGS ?= --headline --compile default
BENCH_FULL_ARGS ?= --compile default
REFUSAL_ARGS ?=
STAMP   := $(VENV)/.installed

.PHONY: install lint test test-shuffled test-cluster test-slow test-all gpu-check dashboard-check sweep report bench bench-full refusal-bench mlflow-ui clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) lint
	$(BIN)/python -m pytest -q $(FAST_TESTS) $(XDIST) $(PYTEST_ARGS)

# the order-proof check: every test passes whichever tests ran before it in its process
test-shuffled: $(STAMP) lint
	@echo "shuffled with SHUFFLE_SEED=$(SEED)"
	$(BIN)/python -m pytest -q $(FAST_TESTS) $(XDIST) --random-order-bucket=module --random-order-seed=$(SEED) $(PYTEST_ARGS)

# the tests marked slow, which `make test` leaves out to stay within 8 minutes on 2 cores: the big simulations,
# every router, dynamic form and depth mix compiled, the router x depth-mix product of test_divergence (make test
# keeps a representative subset of each);
# not timed: tens of minutes on 2 cores, Inductor builds every compiled case (cluster tests: make test-cluster)
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m "slow and not cluster" $(XDIST) $(PYTEST_ARGS)

# a two-node Ray cluster and an MLflow server on this machine, Ray sweeps (ASHA, divergence)
test-cluster: $(STAMP)
	$(BIN)/python -m pytest -q -m "cluster and not slow" $(PYTEST_ARGS)

# CUDA readiness: bf16, flash-attn, allocator peak memory, every router kind eager and compiled
gpu-check: $(STAMP)
	@$(BIN)/python -m orchestrator.engine.gpu_check

# the MLflow dashboard of a small sweep in headless Chromium (Debian's package, installed here if missing):
# runs view, charts, compare page, report.html; screenshots in $${LIME_RESULTS:-results}/dashboard
dashboard-check: $(STAMP)
	@test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	$(BIN)/python tools/dashboard_check.py

test-all: $(STAMP) lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

sweep: $(STAMP)
	$(BIN)/lime sweep run sweeps/$(SWEEP).yaml $(SWEEP_ARGS)
	$(BIN)/lime report $(SWEEP)

report: $(STAMP)
	$(BIN)/lime report $(SWEEP)

bench: $(STAMP)
	$(BIN)/lime bench $(BENCH_ARGS)

bench-full: $(STAMP)
	$(BIN)/lime bench $(BENCH_FULL_ARGS)

# how fast the CLI refuses malformed sweep files and trial configs, as a ratio to `lime --help`
# (wall-clock: run it alone on the machine; REFUSAL_ARGS=--rounds 10 for more)
refusal-bench: $(STAMP)
	$(BIN)/python tools/refusal_bench.py $(REFUSAL_ARGS)

mlflow-ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri "$${MLFLOW_TRACKING_URI:-sqlite:///mlflow.db}" --host 127.0.0.1 --port 5000

clean:
	rm -rf $(VENV) results/ray
