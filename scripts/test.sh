#!/usr/bin/env bash
# Run the test suite: scripts/test.sh [pytest args...]
# Sets up the venv and PostgreSQL (scripts/setup.sh), exports DATABASE_URL from
# .cache/env.sh, then runs pytest. The tests start their own redis-server processes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh
# shellcheck source=/dev/null
. .cache/env.sh

# Not exec: pytest's "no tests collected" (exit 5) must fail the run.
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [[ "$status" -eq 5 ]]; then
    echo "[test] ERROR: pytest collected no tests (exit 5); failing the run." >&2
    exit 1
fi
exit "$status"
