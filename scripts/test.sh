#!/usr/bin/env bash
# Run what CI runs: scripts/test.sh [pytest args...]
#
#   lint     ruff check, ruff format --check (the whole tree), mypy (stock_locks),
#            lint-imports (the layers and import contracts in pyproject.toml)
#   newest   pytest in .venv: the newest releases requirements.txt allows (with hiredis);
#            without pytest args, every test but the fault suite
#   lowest   pytest in .cache/venv-lowest: the lowest versions pyproject.toml allows
#            (requirements-min.txt; no hiredis), every test but the browser test
#            (tests/test_dashboard_browser.py: no Playwright there), the
#            many-process proofs marked slow (their calls are the same as the rest's)
#            and the fault suite (tests/faults: it kills and pauses servers for ~3 min;
#            it runs once, on the newest releases)
#   faults   (without pytest args) the fault suite (-m faults) in .venv, as a step of
#            its own: it kills, pauses and cuts servers on timers of its own
#
# Two streams run side by side (the tests mostly wait on their servers and processes):
# the newest step in the foreground; the lowest step, then the fault suite, in the
# background, their output in .cache/test-beside.log, printed after the newest step's.
# Each step of the background uses its own database (DATABASE_URL's name + "_lowest",
# + "_faults") and its own redis-servers, as every test run does.
# Sets up both virtualenvs and PostgreSQL (scripts/setup.sh --lowest), exports
# DATABASE_URL from .cache/env.sh; the tests start their own redis-server processes.
# Every step runs even when an earlier one failed; the exit status is 1 if any failed.
# Pytest args go to both pytest runs.
#
# Environment:
#   STOCK_LOCKS_TEST_RUNS="lint newest lowest"   the steps to run (default: all three)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

RUNS="${STOCK_LOCKS_TEST_RUNS:-lint newest lowest}"
for run in $RUNS; do
    case "$run" in
        lint | newest | lowest) ;;
        *) echo "[test] ERROR: unknown step '$run' in STOCK_LOCKS_TEST_RUNS (lint newest lowest)" >&2; exit 2 ;;
    esac
done
wants() { [[ " $RUNS " == *" $1 "* ]]; }

if wants lowest; then
    bash scripts/setup.sh --lowest
else
    bash scripts/setup.sh
fi
# shellcheck source=/dev/null
. .cache/env.sh

SUMMARY=()
FAILED=0
FAILURES=.cache/test-failures.log  # pytest's FAILED and ERROR lines, of every step
rm -f "$FAILURES"

# record STEP STATUS SECONDS [NOTE]
record() {
    local outcome="ok"
    [[ "$2" -eq 0 ]] || { outcome="FAILED (exit $2)"; FAILED=1; }
    SUMMARY+=("$(printf '%-7s %-18s %4ds  %s' "$1" "$outcome" "$3" "${4:-}")")
}

versions() {
    "$1" - <<'PY'
from importlib.metadata import PackageNotFoundError, version
import platform

def v(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "-"

print(f"Python {platform.python_version()}, Django {v('Django')}, redis-py {v('redis')}, "
      f"django-redis {v('django-redis')}, Celery {v('celery')}, hiredis {v('hiredis')}")
PY
}

# pytest_run STEP PYTHON [args...]: pytest's "no tests collected" (exit 5) fails the step.
pytest_run() {
    local step="$1" py="$2" status=0 start="$SECONDS" about
    shift 2
    about="$(versions "$py")"
    echo "[test] $step: $about"
    # (tee: the failed tests' lines are repeated in the summary, which CI shows last)
    "$py" -m pytest "$@" 2>&1 | tee ".cache/test-$step.out" || status=$?
    grep -E '^(FAILED|ERROR) ' ".cache/test-$step.out" | cut -c1-160 | sed "s/^/$step: /" >>"$FAILURES" || true
    if [[ "$status" -eq 5 ]]; then
        if [[ "$step" == lowest && "$#" -gt 3 ]]; then
            # Only the browser test or slow tests were asked for: the newest step runs them.
            echo "[test] lowest: none of the selected tests runs there (exit 5 ignored)."
            status=0
        else
            echo "[test] ERROR: pytest collected no tests in the $step run (exit 5)." >&2
        fi
    fi
    record "$step" "$status" "$((SECONDS - start))" "$about"
}

if wants lint; then
    start="$SECONDS"
    status=0
    echo "[test] lint: ruff check, ruff format --check, mypy, lint-imports"
    .venv/bin/ruff check . || status=$?
    .venv/bin/ruff format --check . || status=$((status ? status : $?))
    .venv/bin/mypy || status=$((status ? status : $?))
    .venv/bin/lint-imports || status=$((status ? status : $?))
    record lint "$status" "$((SECONDS - start))" "ruff, mypy, lint-imports (stock_locks)"
fi

# step_database_url SUFFIX: DATABASE_URL with "_SUFFIX" appended to the database's name
# (created when missing), so that a step's test database does not collide with the
# newest step's.
step_database_url() {
    .venv/bin/python - "$DATABASE_URL" "$1" <<'PY'
import sys
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

url = urlsplit(sys.argv[1])
if not url.scheme.startswith("postgres"):
    print(sys.argv[1])  # not PostgreSQL: used as is
    sys.exit()
name = f"{url.path.lstrip('/')}_{sys.argv[2]}"
admin = urlunsplit(url._replace(path="/postgres"))
with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
print(urlunsplit(url._replace(path=f"/{name}")))
PY
}

# The lowest versions' run checks that the API stock_locks uses works there; the
# many-process proofs (marked slow), the fault suite and the contract suite on a
# Redis Cluster and on RedLock (the same redis-py calls as one Redis, in both
# modes) exercise the same calls and run in the newest step.
run_lowest() {
    STOCK_LOCKS_CONTRACT_KINDS="redis zookeeper" \
        pytest_run lowest .cache/venv-lowest/bin/python --ignore=tests/test_dashboard_browser.py \
        -m "not slow and not faults" "$@"
}

# With no pytest args, the newest step leaves the fault suite (-m faults) to a step of
# its own: in the background stream after the lowest step (last, when there is no
# lowest step), so that the two streams take about as long as each other.
SPLIT_FAULTS=""
if wants newest && [[ "$#" -eq 0 ]]; then
    SPLIT_FAULTS=1
fi

run_faults() {
    pytest_run faults .venv/bin/python -m faults
}

BESIDE_PID=""
BESIDE_LOG=.cache/test-beside.log
BESIDE_SUMMARY=.cache/test-beside.summary
if wants lowest && wants newest; then
    rm -f "$BESIDE_SUMMARY"
    lowest_url="$(step_database_url lowest)"
    faults_url="$(step_database_url faults)"
    echo "[test] lowest${SPLIT_FAULTS:+, then faults}: running beside the newest step" \
        "(output: $BESIDE_LOG, printed after it)"
    (
        export DATABASE_URL="$lowest_url"
        run_lowest "$@"
        printf '%s\n' "${SUMMARY[-1]}" >>"$BESIDE_SUMMARY"
        if [[ -n "$SPLIT_FAULTS" ]]; then
            export DATABASE_URL="$faults_url"
            run_faults
            printf '%s\n' "${SUMMARY[-1]}" >>"$BESIDE_SUMMARY"
        fi
    ) >"$BESIDE_LOG" 2>&1 &
    BESIDE_PID=$!
fi

if wants newest; then
    if [[ -n "$SPLIT_FAULTS" ]]; then
        pytest_run newest .venv/bin/python -m "not faults"
    else
        pytest_run newest .venv/bin/python "$@"
    fi
fi

if [[ -n "$BESIDE_PID" ]]; then
    wait "$BESIDE_PID" || true
    echo "[test] ---- the background stream's output ($BESIDE_LOG) ----"
    cat "$BESIDE_LOG"
    results=0
    if [[ -s "$BESIDE_SUMMARY" ]]; then
        while IFS= read -r line; do
            SUMMARY+=("$line")
            results=$((results + 1))
            [[ "$line" != *FAILED* ]] || FAILED=1
        done <"$BESIDE_SUMMARY"
    fi
    if [[ "$results" -lt $((SPLIT_FAULTS ? 2 : 1)) ]]; then
        record beside 1 0 "the background stream ended without every result (see its output above)"
    fi
else
    if wants lowest; then
        run_lowest "$@"
    fi
    if [[ -n "$SPLIT_FAULTS" ]]; then
        run_faults
    fi
fi

echo "[test] summary:"
printf '[test]   %s\n' "${SUMMARY[@]}"
if [[ -s "$FAILURES" ]]; then
    echo "[test] failed tests:"
    sed 's/^/[test]   /' "$FAILURES"
fi
exit "$FAILED"
