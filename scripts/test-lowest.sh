#!/usr/bin/env bash
# The suite with the lowest versions pyproject.toml allows for every direct dependency
# (uv's --resolution lowest-direct), on PostgreSQL (SQLite when no PostgreSQL answers),
# in its own venv .venv-lowest (Python 3.11, the lowest supported). One database: the
# lower bounds are about the libraries' APIs, which the SQLite and PostgreSQL runs
# exercise alike, save psycopg's (PostgreSQL only); `make test` runs every test on
# both databases. JOBSTATE_LOWEST_BOTH=1 runs SQLite as well. The test tools themselves are
# installed at their usual versions, constrained so they cannot move a runtime package.
# It runs the in-process tests (-m "not e2e and not browser"): the end-to-end and
# browser tests exercise the same library calls with worker processes and a browser
# on top, and take most of a full run's time. The property-based tests run with the
# smaller search budget (the full budget runs in `make test` on PostgreSQL).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
V=.venv-lowest
PG_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
UV="$BIN/uv"
[ -x "$UV" ] || "$BIN/python" -m pip install -q uv

if [ ! -f "$V/.installed" ] || [ requirements.txt -nt "$V/.installed" ] || [ pyproject.toml -nt "$V/.installed" ]; then
  rm -rf "$V"
  "$UV" venv -q --python "$("$BIN/python" -c 'import sys; print(sys.executable)')" "$V"
  # The runtime: jobstate's own dependencies and its [postgres] extra, at their lowest.
  "$UV" pip install -q --python "$V/bin/python" --resolution lowest-direct -r requirements.txt
  "$UV" pip freeze --python "$V/bin/python" > "$V/runtime-constraints.txt"
  "$UV" pip install -q --python "$V/bin/python" -c "$V/runtime-constraints.txt" \
    "pytest>=8" "pytest-django>=4.8" "pytest-xdist>=3.5" "hypothesis>=6.100" "schemathesis>=4.0,<5" \
    "django-tasks>=0.12" "standardwebhooks>=1.0" "opentelemetry-api>=1.25" "opentelemetry-sdk>=1.25" \
    "import-linter>=2.1,<3"
  touch "$V/.installed"
fi

# Show (and check) that the direct dependencies really are at their lower bounds.
"$V/bin/python" - <<'PY'
import re, sys
from importlib.metadata import version
from pathlib import Path

wrong = []
for line in Path("requirements.txt").read_text().splitlines():
    line = line.split("#")[0].strip()
    m = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)", line)
    if not m:
        continue
    name, low = m.group(1), m.group(3)
    have = version(name)
    norm = lambda v: [int(p) for p in re.findall(r"\d+", v)] + [0] * 4
    ok = norm(have)[:4] == norm(low)[:4]
    print(f"  {name:26} lower bound {low:12} installed {have}{'' if ok else '  <- not the lower bound'}")
    if not ok:
        wrong.append(name)
sys.exit(f"not at their lower bounds: {wrong}" if wrong else 0)
PY

export JOBSTATE_HYPOTHESIS_EXAMPLES="${JOBSTATE_HYPOTHESIS_EXAMPLES:-40}"
export JOBSTATE_SCHEMATHESIS_EXAMPLES="${JOBSTATE_SCHEMATHESIS_EXAMPLES:-5}"
status=0
sqlite() {
  echo "=== lowest versions, SQLite ==="
  env -u DATABASE_URL JOBSTATE_VAR_DIR="$PWD/var/lowest" "$V/bin/pytest" -q -n "${JOBSTATE_TEST_JOBS:-2}" \
    -m "not e2e and not browser" || status=1
}
if "$BIN/python" scripts/pg_ready.py "$PG_URL"; then
  [ "${JOBSTATE_LOWEST_BOTH:-0}" = "1" ] && sqlite
  echo "=== lowest versions, PostgreSQL ==="
  DATABASE_URL="${PG_URL}_lowest" "$V/bin/pytest" -q -n "${JOBSTATE_TEST_JOBS:-2}" \
    -m "not e2e and not browser" || status=1
elif [ "${JOBSTATE_REQUIRE_POSTGRES:-0}" = "1" ]; then
  echo "PostgreSQL is required but does not answer at $PG_URL"; status=1
else
  sqlite
fi
exit $status
