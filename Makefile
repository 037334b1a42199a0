# Developer entry points. The logic lives in scripts/.
SHELL := /bin/bash
.DEFAULT_GOAL := help

.PHONY: help demo test bench bench-set chaos audit lint format clean distclean

help:
	@echo "make demo       run the test project: admin on http://127.0.0.1:8000/admin/, a worker and"
	@echo "                a steady trickle of tasks (DEMO_TRICKLE=2 s); Ctrl-C stops all of it"
	@echo "make test       run tox.ini's test matrix (every Django/Python combination on SQLite and"
	@echo "                PostgreSQL) one env after another, with a summary"
	@echo "                (knobs: TEST_COMBOS=django61 TEST_DBS=sqlite PYTEST_ARGS='-x -k name'"
	@echo "                TEST_JOBS=2: two environments side by side)"
	@echo "make bench      benchmark on PostgreSQL (BENCH_ARGS='--quick'); drops/recreates db 'bench'"
	@echo "make bench-set  three runs of W1-W3 beside the peers, then issue #18's verdict on them"
	@echo "                (bench/peerset.py: each row's median of per-run ratios; about 12 minutes)"
	@echo "make chaos      chaos run: kill, pause and cut off workers while they drain; checks"
	@echo "                nothing is lost (CHAOS_ARGS='--sqlite' or '--long'); restarts PostgreSQL"
	@echo "make audit      pip-audit the dependency sets 'make test' installed (.tox/)"
	@echo "make lint       ruff check + ruff format --check + mypy on the package"
	@echo "make format     ruff check --fix + ruff format"
	@echo "make clean      remove caches, build artefacts, test logs and test databases"
	@echo "make distclean  clean, and also the virtualenvs (.venv*, .tox) and the demo database"

demo:
	bash scripts/demo.sh

test:
	bash scripts/run-tests.sh

bench: .venv-bench/.installed
	DEBUG=false .venv-bench/bin/python bench/run.py $(BENCH_ARGS)

BENCH_SET_PEERS ?= pgqueuer,oban,celery,procrastinate

bench-set: .venv-bench/.installed
	for run in 1 2 3; do \
		DEBUG=false .venv-bench/bin/python bench/run.py --workloads W1,W2,W3 --runs 1 \
			--peers $(BENCH_SET_PEERS) || exit 1; \
	done
	.venv-bench/bin/python bench/peerset.py --last 3

chaos: .venv-bench/.installed
	.venv-bench/bin/python bench/chaos.py $(CHAOS_ARGS)

.venv-bench/.installed: pyproject.toml Makefile
	test -x .venv-bench/bin/python || python3 -m venv .venv-bench
	.venv-bench/bin/pip install -q -e ".[postgres]" psutil
	touch $@

audit:
	bash scripts/audit.sh

lint:
	bash scripts/lint.sh

format:
	bash scripts/lint.sh --fix

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis .test-logs \
		testproject/test_db.sqlite3* testproject/staticfiles
	find . \( -path ./.git -o -path ./.tox -o -path './.venv*' \) -prune -o \
		-type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf .venv .venv-* .tox testproject/db.sqlite3*
