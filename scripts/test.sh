#!/usr/bin/env bash
# The README's test command (`make test`): the whole suite on SQLite and PostgreSQL,
# under Django 5.2 (Python 3.11) and Django 6.x (when a Python 3.12+ interpreter
# exists; its own venv, .venv-django6). JOBSTATE_REQUIRE_POSTGRES=1 (CI) turns a
# missing PostgreSQL into a failure. CI also runs scripts/test-lowest.sh (the
# in-process tests on both databases with the lowest allowed versions).
#
# Every test runs on both databases and under both Django versions, each pairing
# once, laid out so that two cores are kept busy (the whole CI run aims at < 15 min):
#
#                        SQLite             PostgreSQL
#   in-process tests     Django 6.x   (b)   Django 5.2   (a)
#   end-to-end, browser  Django 5.2   (b)   Django 6.x   (b)
#
# (a) first, CPU-bound: spread over JOBSTATE_TEST_JOBS pytest-xdist workers (default
#     2, one per core; each has its own test database: test_<db>_gwN on PostgreSQL);
# (b) then side by side, each with a database of its own: the end-to-end and browser
#     tests mostly wait on worker clusters, leases and a browser (about half a core
#     each), and the in-process run on one xdist worker takes the core they leave,
#     with a smaller search budget for the property-based tests (Hypothesis state
#     machine, Schemathesis), whose full budget ran in (a).
# Without Django 6.x, Django 5.2 fills its cells; without PostgreSQL, SQLite runs
# both rows under both versions.
# PYTEST_ARGS (e.g. "-k cancel") runs one plain pytest per database and version instead.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PG_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
JOBS="${JOBSTATE_TEST_JOBS:-2}"
IN_PROCESS=(-m "not e2e and not browser")
# The in-process run on SQLite (side by side, on one core) searches less in the
# property-based tests; the full budget runs in the PostgreSQL one.
SMALL_BUDGET=(JOBSTATE_HYPOTHESIS_EXAMPLES=40 JOBSTATE_SCHEMATHESIS_EXAMPLES=5)
END_TO_END=(-m "e2e or browser")
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
passed_total=0; failed_total=0; skipped_total=0
ran=(); failed=()
started=$(date +%s)

count() {  # the number before WORD in pytest's closing line, or 0
  local n
  n="$(grep -Eo "[0-9]+ $1" <<<"$2" | head -1 | cut -d' ' -f1)"
  echo "${n:-0}"
}

tally() {  # name, log, exit code: adds the part's counts to the totals
  local name="$1" log="$2" rc="$3" summary
  summary="$(grep -E '^=+ .*(passed|failed|error|no tests ran).* =+$|^[0-9]+ (passed|failed)' "$log" | tail -1)"
  passed_total=$((passed_total + $(count passed "$summary")))
  failed_total=$((failed_total + $(count failed "$summary") + $(count error "$summary")))
  skipped_total=$((skipped_total + $(count skipped "$summary")))
  # 5: this part selected no test (e.g. PYTEST_ARGS="-k something_in_the_other_part").
  if [ "$rc" = 0 ] || [ "$rc" = 5 ]; then ran+=("$name"); else failed+=("$name"); fi
}

part() {  # name, then env arguments and the pytest command; output shown as it comes
  local name="$1"; shift
  local log="$LOGS/part-$RANDOM.log"
  echo "=== [$(( $(date +%s) - started )) s] tests on ${name} ==="
  env "$@" 2>&1 | tee "$log"
  tally "$name" "$log" "${PIPESTATUS[0]}"
}

side_by_side() {  # pairs of (name, "env arguments and command" as one array name); shown when all end
  local names=() logs=() pids=() i=0
  while [ $# -gt 0 ]; do
    local name="$1" cmd_name="$2[@]"; shift 2
    local log="$LOGS/side-$i.log"
    echo "=== [$(( $(date +%s) - started )) s] tests on ${name} (side by side; output when it ends) ==="
    env "${!cmd_name}" >"$log" 2>&1 &
    names+=("$name"); logs+=("$log"); pids+=("$!"); i=$((i + 1))
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; local rc=$?
    echo "=== [$(( $(date +%s) - started )) s] tests on ${names[$i]} ==="
    cat "${logs[$i]}"
    tally "${names[$i]}" "${logs[$i]}" "$rc"
  done
}

pg_ok=0
if "$BIN/python" scripts/pg_ready.py "$PG_URL"; then
  pg_ok=1
elif [ "${JOBSTATE_REQUIRE_POSTGRES:-0}" = "1" ]; then
  echo "PostgreSQL is required but does not answer at $PG_URL"; failed+=("PostgreSQL (unreachable)")
else
  echo "PostgreSQL: no server answers at $PG_URL; skipped (set DATABASE_URL to run it)"
fi

DJ5="Django $($BIN/python -c 'import django; print(django.get_version())')"
SQLITE5=(-u DATABASE_URL JOBSTATE_VAR_DIR="$PWD/var")
PG5=(DATABASE_URL="$PG_URL" JOBSTATE_VAR_DIR="$PWD/var")
PY312=""
for candidate in python3.13 python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python "$HOME"/.pyenv/versions/3.12*/bin/python; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    PY312="$candidate"; break
  fi
done
V6=.venv-django6
if [ -n "$PY312" ]; then
  if [ ! -f "$V6/.installed" ] || [ requirements.txt -nt "$V6/.installed" ] || [ requirements-dev.txt -nt "$V6/.installed" ]; then
    rm -rf "$V6"
    "$BIN/uv" venv -q --python "$PY312" "$V6" \
      && "$BIN/uv" pip install -q --python "$V6/bin/python" -r requirements-dev.txt "Django>=6.1,<6.2" \
      && touch "$V6/.installed"
  fi
  BIN6="$V6/bin"
  DJ6="Django $($BIN6/python -c 'import django; print(django.get_version())'), $($BIN6/python -V)"
  SQLITE6=(-u DATABASE_URL JOBSTATE_VAR_DIR="$PWD/var/django6")
  PG6=(DATABASE_URL="${PG_URL}_django6" JOBSTATE_VAR_DIR="$PWD/var/django6")
else
  echo "Django 6.x: no Python 3.12+ interpreter found; Django 5.2 runs its part"
  BIN6="$BIN"; DJ6="$DJ5"; SQLITE6=("${SQLITE5[@]}"); PG6=(DATABASE_URL="${PG_URL}_second" JOBSTATE_VAR_DIR="$PWD/var")
fi

# shellcheck disable=SC2034  # the arrays below are read through side_by_side's indirection
if [ -n "${PYTEST_ARGS:-}" ] || [ "$JOBS" = 0 ]; then
  # shellcheck disable=SC2086
  part "SQLite ($DJ5)" "${SQLITE5[@]}" "$BIN/pytest" ${PYTEST_ARGS:-}
  # shellcheck disable=SC2086
  [ "$pg_ok" = 1 ] && part "PostgreSQL ($DJ5)" "${PG5[@]}" "$BIN/pytest" ${PYTEST_ARGS:-}
  if [ -n "$PY312" ]; then
    # shellcheck disable=SC2086
    part "SQLite ($DJ6)" "${SQLITE6[@]}" "$BIN6/pytest" ${PYTEST_ARGS:-}
    # shellcheck disable=SC2086
    [ "$pg_ok" = 1 ] && part "PostgreSQL ($DJ6)" "${PG6[@]}" "$BIN6/pytest" ${PYTEST_ARGS:-}
  fi
elif [ "$pg_ok" = 1 ]; then
  part "PostgreSQL ($DJ5), in-process tests" "${PG5[@]}" "$BIN/pytest" -n "$JOBS" "${IN_PROCESS[@]}"
  e2e_sqlite=("${SQLITE5[@]}" "$BIN/pytest" "${END_TO_END[@]}")
  e2e_pg=("${PG6[@]}" "$BIN6/pytest" "${END_TO_END[@]}")
  in_sqlite=("${SQLITE6[@]}" "${SMALL_BUDGET[@]}" "$BIN6/pytest" -n 1 "${IN_PROCESS[@]}")
  side_by_side "SQLite ($DJ5), end-to-end and browser tests" e2e_sqlite \
    "PostgreSQL ($DJ6), end-to-end and browser tests" e2e_pg \
    "SQLite ($DJ6), in-process tests" in_sqlite
  if [ -n "$PY312" ]; then
    # The django.tasks conformance suite on Django 6.x and PostgreSQL too (the table above
    # runs Django 6.x in-process on SQLite only).
    part "PostgreSQL ($DJ6), django.tasks conformance" "${PG6[@]}" "$BIN6/pytest" \
      tests/test_tasks_backend.py tests/test_tasks_running.py tests/test_tasks_switch.py \
      tests/test_tasks_backend_checks.py
  fi
else
  part "SQLite ($DJ5), in-process tests" "${SQLITE5[@]}" "$BIN/pytest" -n "$JOBS" "${IN_PROCESS[@]}"
  e2e_sqlite=("${SQLITE5[@]}" "$BIN/pytest" "${END_TO_END[@]}")
  sides=("SQLite ($DJ5), end-to-end and browser tests" e2e_sqlite)
  if [ -n "$PY312" ]; then
    e2e_sqlite6=("${SQLITE6[@]}" "$BIN6/pytest" "${END_TO_END[@]}")
    in_sqlite6=("${SQLITE6[@]}" "${SMALL_BUDGET[@]}" "$BIN6/pytest" -n 1 "${IN_PROCESS[@]}")
    part "SQLite ($DJ6), end-to-end and browser tests" "${e2e_sqlite6[@]}"
    sides+=("SQLite ($DJ6), in-process tests" in_sqlite6)
  fi
  side_by_side "${sides[@]}"
fi

echo
echo "Ran: ${ran[*]:-none}"
echo "total: ${passed_total} passed, ${failed_total} failed, ${skipped_total} skipped in $(( $(date +%s) - started )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
