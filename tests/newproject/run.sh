#!/usr/bin/env bash
# The new-project test: build the wheel, install it into a fresh venv and follow the
# docs' tutorial (docs/tutorial.md) step by step in a brand-new `django-admin
# startproject`, using the very files the docs include (docs/snippets/): settings,
# urls, the app's jobs.py, the shell steps. Then start qcluster and runserver,
# enqueue a job over the API with a token, see it complete with an asset, load
# /api/schema/ and open the admin job page (tests/newproject/check.py).
# Bounded: the whole run is killed after NEWPROJECT_TIMEOUT seconds (default 600).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SNIPPETS="$ROOT/docs/snippets"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/jobstate-newproject.XXXXXX")"
PIDS=()

cleanup() {  # the script's exit status
  local rc="$1"
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  if [ "$rc" != 0 ]; then
    for log in "$WORK"/*.log; do [ -f "$log" ] && { echo "--- $log ---"; tail -40 "$log"; }; done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap 'cleanup $?' EXIT
# The time bound: a watchdog (its own process group, holding no output pipe) ends
# this script, and so its servers, if the run hangs.
LIMIT="${NEWPROJECT_TIMEOUT:-600}"
setsid bash -c 'sleep "$1"; kill -TERM "$2"' _ "$LIMIT" "$$" </dev/null >/dev/null 2>&1 &
WATCHDOG=$!
trap 'rc=$?; kill -KILL -- "-$WATCHDOG" 2>/dev/null || true; cleanup $rc' EXIT
trap 'echo "new-project test: timed out after $LIMIT s"; exit 124' TERM

stamp() { echo "[$(( $(date +%s) - started )) s] $*"; }
started=$(date +%s)
echo "=== new-project test in $WORK ==="
# 1. The wheel, as a release would build it (or the one `make dist` just built:
#    JOBSTATE_DIST=dist, as CI does).
mkdir -p "$WORK/dist"
if [ -n "${JOBSTATE_DIST:-}" ] && ls "$ROOT/$JOBSTATE_DIST"/*.whl >/dev/null 2>&1; then
  cp "$ROOT/$JOBSTATE_DIST"/*.whl "$WORK/dist/"
else
  "$ROOT/.venv/bin/python" -m build --wheel --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1
fi
stamp "built $(ls "$WORK/dist")"

# 2. The tutorial's install steps, verbatim; pip also looks in dist/ for the wheel just
#    built (django-jobstate is not on an index here), everything else as usual.
cd "$WORK"
mkdir -p bin && ln -s "$(command -v python3)" bin/python
export PATH="$WORK/bin:$PATH"
export PIP_FIND_LINKS="$WORK/dist ${PIP_FIND_LINKS:-}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_QUIET=2
# shellcheck source=/dev/null
source "$SNIPPETS/install.sh"     # ends in mysite/ with the venv active
stamp "installed into a new venv; project created"
[ "$(python -c 'import jobstate, sys; print(jobstate.__file__.startswith(sys.prefix))')" = True ] \
  || { echo "jobstate is not imported from the new venv"; exit 1; }
if python -m pip show pytest >/dev/null 2>&1; then echo "the runtime install pulled in pytest"; exit 1; fi

# 3. The tutorial's edits: append the settings block, replace urls.py, add reports/jobs.py.
cat "$SNIPPETS/settings.py" >> mysite/settings.py
cp "$SNIPPETS/urls.py" mysite/urls.py
cp "$SNIPPETS/jobs.py" reports/jobs.py

# 4. The tutorial's setup steps, verbatim, then no warning at all from the checks.
# shellcheck source=/dev/null
source "$SNIPPETS/setup.sh" >"$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log"; exit 1; }
python manage.py check --fail-level WARNING
TOKEN="$(python manage.py drf_create_token admin | awk '{print $3}')"
stamp "migrated, checked, schedules and admin user created"

# 5. The worker cluster and the web server, each in its own process group.
PORT="$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
setsid python manage.py qcluster >"$WORK/qcluster.log" 2>&1 &
PIDS+=($!)
setsid python manage.py runserver --noreload "127.0.0.1:$PORT" >"$WORK/runserver.log" 2>&1 &
PIDS+=($!)

# 6. What a user of the new project does: API with the token, schema, admin.
python "$ROOT/tests/newproject/check.py" "http://127.0.0.1:$PORT" "$TOKEN" admin change-me
echo "new-project test: passed in $(( $(date +%s) - started )) s"
