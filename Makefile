# make run   - create .venv if missing, run the whole DAG on the embedded default config
# make test  - create .venv if missing, run the test suite (what CI runs)
# make test-fast - the same without the `slow` end-to-end tests (quick local runs)
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
# make test's pytest-xdist workers (tests/sharing.py: what they must not share, and the tests
# that run alone); TEST_WORKERS=0 runs them in one process. Beside them, where a cgroup can be
# made (root, cgroup v1), the light tests run at idle CPU priority (tests/beside.py).
TEST_WORKERS ?= 2
PYTEST := $(PY) tests/beside.py -n $(TEST_WORKERS) --dist loadgroup
STAMP := $(VENV)/.tula-installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: run test test-fast lint clean-results

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing Tula and its dependencies into $(VENV) (torch pinned by constraints.txt) ..."
	@$(PY) -m pip install -q -c constraints.txt -e '.[dev]' 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
	@# pip compiles what it installs, not an editable install's own modules: compiled once here,
	@# a process where PYTHONDONTWRITEBYTECODE is set (this CI's) no longer compiles them anew
	@$(PY) -m compileall -q src
	@touch $(STAMP)

run: $(STAMP)
	snakemake --cores $(CORES)

# Under CI=true the tests also get a real one-node SLURM cluster (scripts/slurm-cluster.sh,
# needs root), stopped again however the tests end.
test: $(STAMP)
	@if [ "$${CI:-}" = true ]; then \
	  trap 'bash scripts/slurm-cluster.sh down' EXIT; \
	  bash scripts/slurm-cluster.sh up; \
	  TULA_REQUIRE_SLURM=1 $(PYTEST); \
	else \
	  $(PYTEST); \
	fi

test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

lint: $(STAMP)
	ruff format --check src tests bench
	ruff check src tests bench
	snakemake --lint
	snakefmt --check Snakefile rules/
	lint-imports

clean-results:
	rm -rf results/partitions results/probes results/model results/plots results/train results/logs \
	  results/benchmarks results/plan results/*.csv results/*.json results/report.html
