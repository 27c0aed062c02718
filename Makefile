# Two commands for a fresh machine: `make demo` and `make test`.
# Everything else here is what those two call.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/postgres
PYTEST_ARGS ?=

.PHONY: demo test setup lint format migrations-check test-sqlite test-postgres test-django6 bench clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/python scripts/demo.py

test: setup
	@bash scripts/test.sh

test-sqlite: setup
	env -u DATABASE_URL $(BIN)/pytest $(PYTEST_ARGS)

test-postgres: setup
	DATABASE_URL=$(PG_URL) $(BIN)/pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

migrations-check: setup
	env -u DATABASE_URL $(BIN)/python manage.py makemigrations --check --dry-run

clean:
	rm -rf $(VENV) .venv-django6 var
