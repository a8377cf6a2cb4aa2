# Modelyard: `make run` serves the embedded default; `make test` runs every check CI runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install run test lint typecheck services bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: install
	$(BIN)/modelyard serve

services:
	bash scripts/services.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy modelyard registry storage inference bench

test: install services lint typecheck
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/pytest
	$(BIN)/pytest -m slow

bench: install services
	$(BIN)/python bench/upload.py

clean:
	rm -rf $(VENV) .modelyard .pytest_cache .mypy_cache .ruff_cache
