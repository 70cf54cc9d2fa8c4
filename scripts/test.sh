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
#   faults   (without pytest args) the fault suite (-m faults) in .venv, last, once the
#            other steps are done: its kills and pauses run on timers of their own
#
# The newest and lowest steps run side by side (both mostly wait on their servers and
# processes): the lowest step's output goes to .cache/test-lowest.log and is printed
# after the newest step's. It uses its own database (DATABASE_URL's name + "_lowest")
# and its own redis-servers, as every test run does.
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

# The lowest step's database: DATABASE_URL's with "_lowest" appended to its name
# (created when missing), so its test database does not collide with the newest's.
lowest_database_url() {
    .venv/bin/python - "$DATABASE_URL" <<'PY'
import sys
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

url = urlsplit(sys.argv[1])
if not url.scheme.startswith("postgres"):
    print(sys.argv[1])  # not PostgreSQL: used as is
    sys.exit()
name = url.path.lstrip("/") + "_lowest"
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

LOWEST_PID=""
LOWEST_LOG=.cache/test-lowest.log
LOWEST_SUMMARY=.cache/test-lowest.summary
if wants lowest && wants newest; then
    rm -f "$LOWEST_SUMMARY"
    lowest_url="$(lowest_database_url)"
    echo "[test] lowest: running beside the newest step (output: $LOWEST_LOG, printed after it)"
    (
        export DATABASE_URL="$lowest_url"
        run_lowest "$@"
        printf '%s\n' "${SUMMARY[-1]}" >"$LOWEST_SUMMARY"
    ) >"$LOWEST_LOG" 2>&1 &
    LOWEST_PID=$!
fi

# With no pytest args, the newest step leaves the fault suite (-m faults: it kills,
# pauses and cuts servers on timers of their own) to a step of its own, run last,
# alone on the machine: beside the lowest step, a restarted Sentinel primary once
# took over 90 s to rejoin. (It adds ~2 min to the run: the suite takes ~4.5 alone.)
SPLIT_FAULTS=""
if wants newest && [[ "$#" -eq 0 ]]; then
    SPLIT_FAULTS=1
fi

if wants newest; then
    if [[ -n "$SPLIT_FAULTS" ]]; then
        pytest_run newest .venv/bin/python -m "not faults"
    else
        pytest_run newest .venv/bin/python "$@"
    fi
fi

if [[ -n "$LOWEST_PID" ]]; then
    wait "$LOWEST_PID" || true
    echo "[test] ---- lowest step's output ($LOWEST_LOG) ----"
    cat "$LOWEST_LOG"
    if [[ -s "$LOWEST_SUMMARY" ]]; then
        line="$(cat "$LOWEST_SUMMARY")"
        SUMMARY+=("$line")
        [[ "$line" != *FAILED* ]] || FAILED=1
    else
        record lowest 1 0 "the step ended without a result (see its output above)"
    fi
elif wants lowest; then
    run_lowest "$@"
fi

if [[ -n "$SPLIT_FAULTS" ]]; then
    pytest_run faults .venv/bin/python -m faults
fi

echo "[test] summary:"
printf '[test]   %s\n' "${SUMMARY[@]}"
if [[ -s "$FAILURES" ]]; then
    echo "[test] failed tests:"
    sed 's/^/[test]   /' "$FAILURES"
fi
exit "$FAILED"
