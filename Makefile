# The two commands of the README: `make run` and `make test`. Both set themselves up.
.PHONY: setup run test lint bench

VENV := .venv/bin

setup:
	@scripts/setup.sh

run: setup
	@scripts/run.sh

lint: setup
	$(VENV)/ruff check ledger inference_wrapper audit_cli tests bench
	$(VENV)/mypy ledger inference_wrapper audit_cli
	$(VENV)/lint-imports --no-cache

test: setup lint
	$(VENV)/python -m pytest
	cd chaincode && npm test --silent
