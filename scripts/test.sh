#!/usr/bin/env bash
# Runs the suite on SQLite, then on PostgreSQL when one answers (or DATABASE_URL
# is set), then under Django 6.x when a Python 3.12+ interpreter exists.
# JOBSTATE_REQUIRE_POSTGRES=1 (CI) turns a missing PostgreSQL into a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PG_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
ran=()
failed=()

LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
passed_total=0; failed_total=0; skipped_total=0

count() {  # the number before WORD in pytest's closing line, or 0
  local n
  n="$(grep -Eo "[0-9]+ $1" <<<"$2" | head -1 | cut -d' ' -f1)"
  echo "${n:-0}"
}

run() {  # name, then env arguments and the pytest command
  local name="$1"; shift
  echo "=== tests on ${name} ==="
  if env "$@" 2>&1 | tee "$LOG"; then ran+=("$name"); else failed+=("$name"); fi
  local summary
  summary="$(grep -E '^=+ .*(passed|failed|error|no tests ran).* =+$|^[0-9]+ (passed|failed)' "$LOG" | tail -1)"
  passed_total=$((passed_total + $(count passed "$summary")))
  failed_total=$((failed_total + $(count failed "$summary") + $(count error "$summary")))
  skipped_total=$((skipped_total + $(count skipped "$summary")))
}

run "SQLite (Django $($BIN/python -c 'import django; print(django.get_version())'))" \
  -u DATABASE_URL "$BIN/pytest" ${PYTEST_ARGS:-}

if "$BIN/python" scripts/pg_ready.py "$PG_URL"; then
  run "PostgreSQL (Django $($BIN/python -c 'import django; print(django.get_version())'))" \
    DATABASE_URL="$PG_URL" "$BIN/pytest" ${PYTEST_ARGS:-}
elif [ "${JOBSTATE_REQUIRE_POSTGRES:-0}" = "1" ]; then
  echo "PostgreSQL is required but does not answer at $PG_URL"; failed+=("PostgreSQL (unreachable)")
else
  echo "PostgreSQL: no server answers at $PG_URL; skipped (set DATABASE_URL to run it)"
fi

PY312=""
for candidate in python3.13 python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python "$HOME"/.pyenv/versions/3.12*/bin/python; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    PY312="$candidate"; break
  fi
done
if [ -n "$PY312" ]; then
  V6=.venv-django6
  if [ ! -f "$V6/.installed" ] || [ requirements.txt -nt "$V6/.installed" ]; then
    "$PY312" -m venv "$V6" && "$V6/bin/python" -m pip install -q --upgrade pip \
      && "$V6/bin/python" -m pip install -q -r requirements.txt "Django>=6.1,<6.2" && touch "$V6/.installed"
  fi
  DJ6="$($V6/bin/python -c 'import django; print(django.get_version())')"
  run "SQLite (Django $DJ6, $($V6/bin/python -V))" -u DATABASE_URL "$V6/bin/pytest" ${PYTEST_ARGS:-}
  if "$BIN/python" scripts/pg_ready.py "$PG_URL"; then
    run "PostgreSQL (Django $DJ6)" DATABASE_URL="$PG_URL" "$V6/bin/pytest" ${PYTEST_ARGS:-}
  fi
else
  echo "Django 6.x: no Python 3.12+ interpreter found; skipped"
fi

echo
echo "Databases and versions that ran: ${ran[*]:-none}"
echo "total: ${passed_total} passed, ${failed_total} failed, ${skipped_total} skipped"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
