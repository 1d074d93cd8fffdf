#!/usr/bin/env bash
# fuzz/run_long.sh: the long fuzz run (bench/results/fuzz-*.md): every target
# for 10 M executions each (RUNS), or MAX_SECONDS per target when it is slower
# than that allows (default 3600). Prints the per-target table; SUMMARY=FILE
# appends it as markdown. Usage: fuzz/run_long.sh [--build DIR] [TARGET...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/run.sh" --runs "${RUNS:-10000000}" --max-seconds "${MAX_SECONDS:-3600}" "$@"
