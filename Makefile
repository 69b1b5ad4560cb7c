# The two commands of the README, plus helpers. Each installs what it needs first (idempotent).
.PHONY: install demo test test-busy lint bench clean

install:
	bash scripts/install.sh

demo: install
	.venv/bin/kforge run --suite data/problems/smoke --backend cpu
	.venv/bin/kforge report --run-id latest

test: install
	bash scripts/browser.sh
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q --durations=10

# The cheats and their honest twins on a busy host: one CPU burner per core beside them.
test-busy: install
	bash scripts/busy.sh .venv/bin/python -m pytest -q tests/integrity/test_cheats.py tests/integrity/test_trust_boundary.py

lint: install
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bench: install
	.venv/bin/python benchmarks/cpu_compile_and_worker.py

clean:
	rm -rf data/results data/cache
