# The two commands of the README, plus helpers. Each installs what it needs first (idempotent).
.PHONY: install demo test lint bench clean

install:
	bash scripts/install.sh

demo: install
	.venv/bin/kforge run --suite data/problems/smoke --backend cpu
	.venv/bin/kforge report --run-id latest

test: install
	bash scripts/browser.sh
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q --durations=10

lint: install
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bench: install
	.venv/bin/python benchmarks/cpu_compile_and_worker.py

clean:
	rm -rf data/results data/cache
