# Two commands for a fresh machine: `make demo` and `make test`.
# Everything else here is what those two call.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/postgres
PYTEST_ARGS ?=

.PHONY: demo test setup setup-dev lint format typecheck migrations-check test-sqlite test-postgres \
	test-lowest test-newproject dist docs docs-ref docs-serve bench clean

# The runtime only (requirements.txt): what `make demo` needs.
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile -r requirements.txt
	touch $@

# The runtime plus tests and tooling (requirements-dev.txt): what `make test` needs.
# uv installs the tools (it resolves and installs in seconds where pip takes a minute).
$(VENV)/.installed-dev: requirements-dev.txt $(VENV)/.installed
	$(BIN)/python -m pip install -q "uv>=0.4"
	$(BIN)/uv pip install -q --python $(BIN)/python -r requirements-dev.txt
	touch $@

setup: $(VENV)/.installed

setup-dev: $(VENV)/.installed-dev

demo: setup
	$(BIN)/python scripts/demo.py

test: setup-dev
	@bash scripts/test.sh

test-sqlite: setup-dev
	env -u DATABASE_URL $(BIN)/pytest $(PYTEST_ARGS)

test-postgres: setup-dev
	DATABASE_URL=$(PG_URL) $(BIN)/pytest $(PYTEST_ARGS)

# The suite with the lowest versions pyproject.toml allows (a separate venv, .venv-lowest).
test-lowest: setup-dev
	@bash scripts/test-lowest.sh

# Build the wheel, install it into a fresh venv, follow the docs' steps in a new project.
test-newproject: setup-dev
	@bash tests/newproject/run.sh

# The wheel and sdist in dist/, checked by twine.
dist: setup-dev
	rm -rf dist
	$(BIN)/python -m build --outdir dist . >/dev/null
	$(BIN)/twine check --strict dist/*

# The documentation site in site/ (strict: a warning or a broken link fails).
docs: setup-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Rewrite the generated parts of the pages (docs/hooks.py): the references from the code,
# the code blocks from docs/snippets/. tests/test_docs.py fails until they are current.
docs-ref: setup
	env -u DATABASE_URL $(BIN)/python docs/hooks.py --write

docs-serve: setup-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# mypy, strict for jobstate/ and project/ ([tool.mypy] in pyproject.toml).
typecheck: setup-dev
	$(BIN)/mypy

migrations-check: setup
	env -u DATABASE_URL $(BIN)/python manage.py makemigrations --check --dry-run

clean:
	rm -rf $(VENV) .venv-django6 .venv-lowest var dist build site
