#!/usr/bin/env bash
# tests/stress.sh N [extra ctest args]
#
# The flake hunt (docs/testing.md): runs the quick level's tests (`ctest -j`,
# every test but label `rdma_device`, as tests/run.sh does) N times in a row
# while a CPU hog keeps every core busy (stress-ng --cpu NPROC from Debian,
# which deploy/bootstrap.sh installs; without it one busy shell loop per
# core), then reports every failure: the test, the run, its exit and the path
# of its full output, with the output's failing lines.
#
# The build must exist: tests/run.sh (its build stage) makes it; this script
# only rebuilds what changed. Env: RACKHUB_BUILD_DIR (build), RACKHUB_JOBS
# (nproc), STRESS_HOG_WORKERS (nproc; 0 = no hog), STRESS_OUT (where the logs
# go; default a fresh /tmp/rackhub-stress.XXXXXX, kept).
# Exit status: 0 when every run passed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:?usage: tests/stress.sh N [extra ctest args]}
shift
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "stress: N must be a positive integer" >&2; exit 2; }
build=${RACKHUB_BUILD_DIR:-build}
jobs=${RACKHUB_JOBS:-$(nproc)}
hog_workers=${STRESS_HOG_WORKERS:-$(nproc)}
out=${STRESS_OUT:-$(mktemp -d /tmp/rackhub-stress.XXXXXX)}
mkdir -p "$out"

[ -f "$build/CTestTestfile.cmake" ] \
  || { echo "stress: no build in $build: run tests/run.sh first" >&2; exit 2; }
cmake --build "$build" -j"$jobs" > "$out/build.log" 2>&1 \
  || { tail -30 "$out/build.log"; echo "stress: the build failed ($out/build.log)" >&2; exit 1; }

# The hog: processes started here, stopped by their ids at exit.
hog_pids=()
stop_hog() {
  local pid
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hog_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  hog_pids=()
}
trap stop_hog EXIT
if [ "$hog_workers" -gt 0 ]; then
  if command -v stress-ng >/dev/null; then
    stress-ng --cpu "$hog_workers" --cpu-method matrixprod --quiet > "$out/hog.log" 2>&1 &
    hog_pids+=($!)
    hog="stress-ng --cpu $hog_workers"
  else
    for _ in $(seq "$hog_workers"); do
      bash -c 'while :; do :; done' &
      hog_pids+=($!)
    done
    hog="$hog_workers busy shell loops (stress-ng is not installed)"
  fi
else
  hog="none"
fi
echo "stress: $runs run(s) of the quick level's tests in $build, ctest -j$jobs, CPU hog: $hog"
echo "stress: logs in $out"

# One test's part of CTest's LastTest.log (its command, output and result).
test_log() {  # test_log LASTTEST_LOG NAME
  awk -v name="$2" '
    /^[0-9]+\/[0-9]+ Test(ing)?: / { on = ($3 == name) }
    on { print }
  ' "$1"
}

failures=0
summary=()
start_all=$(date +%s)
for i in $(seq "$runs"); do
  start=$(date +%s)
  rc=0
  ctest --test-dir "$build" -LE rdma_device --timeout 600 -j"$jobs" --output-on-failure "$@" \
    > "$out/run-$i.log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  cp "$build/Testing/Temporary/LastTest.log" "$out/run-$i.LastTest.log" 2>/dev/null || true
  failed_tests=()
  if [ $rc -ne 0 ] && [ -s "$build/Testing/Temporary/LastTestsFailed.log" ]; then
    mapfile -t failed_tests < <(cut -d: -f2- "$build/Testing/Temporary/LastTestsFailed.log")
  fi
  if [ $rc -ne 0 ] && [ ${#failed_tests[@]} -eq 0 ]; then
    failed_tests=("(ctest itself: exit $rc, see run-$i.log)")
  fi
  summary+=("run $i: ${secs}s, $([ $rc -eq 0 ] && echo passed || echo "FAILED: ${failed_tests[*]}")")
  echo "stress: ${summary[-1]}"
  for t in "${failed_tests[@]}"; do
    [[ "$t" == "("* ]] && { failures=$((failures + 1)); continue; }
    failures=$((failures + 1))
    test_log "$out/run-$i.LastTest.log" "$t" > "$out/run-$i.$t.log"
  done
done
stop_hog

echo "================ stress summary: $runs run(s), $(( $(date +%s) - start_all )) s, hog: $hog ================"
printf '%s\n' "${summary[@]}"
if [ $failures -eq 0 ]; then
  echo "stress: no failure in $runs run(s)"
  exit 0
fi
echo "stress: $failures failure(s); each with its log:"
for f in "$out"/run-*.*.log; do
  case $f in *.LastTest.log) continue ;; esac
  [ -e "$f" ] || continue
  echo "---- $f"
  # The failing lines first (GoogleTest failures, Python tracebacks, timeouts).
  lines=$(grep -E -A6 ': Failure$|^\[  FAILED  \]|Traceback|Error|FAIL|Timeout|timed out|Exception' "$f" \
    | cut -c1-220 | head -40 || true)
  # Nothing recognizable: the end of its output.
  [ -n "$lines" ] || lines=$(tail -15 "$f" | cut -c1-220)
  echo "$lines"
done
exit 1
