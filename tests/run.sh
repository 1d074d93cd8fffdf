#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs every rackhub test.
# Usage: tests/run.sh [extra ctest args, e.g. -L unit or -R admin]
#
# Stages, in this order (docs/testing.md). Each one runs even if an earlier
# one failed (after bootstrap); the run fails if any stage failed.
#   release  Release build in build/, every test with CTest
#   asan     ASan + UBSan build in build-asan/ (clang, also the fuzz targets):
#            the CTest label `asan` (every unit test and a set of integration tests)
#   tsan     TSan build in build-tsan/ (GCC): the CTest label `tsan`
#   fuzz     every libFuzzer target of fuzz/ for RACKHUB_FUZZ_SECONDS (20) each
#   rdma     the RDMA tests on a real verbs device or in a Soft-RoCE VM
#   systemd  the rackhubd unit and package under a real systemd, in a VM
#            (tests/systemd/run.sh; uses build/ only)
# With no arguments every stage runs. With ctest arguments only `release`
# runs (a quick filtered run, as before) unless RACKHUB_STAGES names the
# stages; the arguments go to every CTest stage chosen, e.g.
#   RACKHUB_STAGES="asan tsan" tests/run.sh -R lane_fault
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/bootstrap.sh

if [ -n "${RACKHUB_STAGES:-}" ]; then
  stages=" $RACKHUB_STAGES "
elif [ $# -eq 0 ]; then
  stages=" release asan tsan fuzz rdma systemd "
else
  stages=" release "
fi
want() { [[ "$stages" == *" $1 "* ]]; }
jobs=$(nproc)
ctest_args=(--output-on-failure "$@")
# Sanitizer reports fail the process that has them (tests and the rackhubd
# they start); TSan's known reports from uninstrumented libraries are
# suppressed with a comment per entry (tests/sanitizers/).
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp"

failed=()
summary=()
stage() {  # stage NAME COMMAND...: runs it, times it, records a failure
  local name=$1 start rc
  shift
  echo "================ stage $name ================"
  start=$(date +%s)
  stage_marker=$(mktemp)
  set +e
  ( set -e; "$@" )
  rc=$?
  set -e
  summary+=("$(printf '%-8s %5ss  %s' "$name" "$(( $(date +%s) - start ))" \
    "$([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")")")
  [ $rc -eq 0 ] || failed+=("$name")
  # Name the failed tests here too: a CI log is often read from its tail.
  local dir log
  for dir in build build-asan build-tsan; do
    log=$dir/Testing/Temporary/LastTestsFailed.log
    if [ $rc -ne 0 ] && [ -s "$log" ] && [ "$log" -nt "$stage_marker" ]; then
      summary+=("         failed in $dir: $(cut -d: -f2- "$log" | tr '\n' ' ')")
      # ... and the first assertions that failed (GoogleTest's "Failure"
      # lines and the lines that follow them), from CTest's full log.
      local details
      details=$(grep -A4 -E ': Failure$|^\[  FAILED  \]' "$dir/Testing/Temporary/LastTest.log" \
        2>/dev/null | cut -c1-200 | head -40 || true)
      [ -z "$details" ] || summary+=("$(sed 's/^/           | /' <<<"$details")")
    fi
  done
  rm -f "$stage_marker"
}

release() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
  cmake --build build -j"$jobs"
  ctest --test-dir build --timeout 600 "${ctest_args[@]}"
}

# One clang build serves both: the sanitized test subset and the fuzzers
# (RACKHUB_FUZZ=ON instruments every library for both).
asan_build() {
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DRACKHUB_FUZZ=ON
  local targets=()
  want asan && targets+=(asan_tests)
  want fuzz && targets+=(fuzzers)
  cmake --build build-asan -j"$jobs" --target "${targets[@]}"
}
asan() {
  ctest --test-dir build-asan -L asan --timeout 900 "${ctest_args[@]}"
}

tsan() {
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Release -DRACKHUB_SANITIZE=thread
  cmake --build build-tsan -j"$jobs" --target tsan_tests
  ctest --test-dir build-tsan -L tsan --timeout 900 "${ctest_args[@]}"
}

fuzz() {
  fuzz/run.sh --build build-asan --seconds "${RACKHUB_FUZZ_SECONDS:-20}"
}

# The RDMA tests (label `rdma`) on a real verbs device: natively, or in a
# Soft-RoCE VM when this host has none (SKIPPED, loudly, if neither works).
rdma() {
  tests/rdma/run.sh build "$@"
}

# The .deb (or install tree) of build/ in a VM booted with systemd as PID 1:
# start after READY, stop, config errors, watchdog restarts, hardening score
# (SKIPPED, loudly, if the VM cannot boot).
systemd_vm() {
  tests/systemd/run.sh build
}

want release && stage release release
if want asan || want fuzz; then
  stage asan-build asan_build
  if [[ " ${failed[*]} " == *" asan-build "* ]]; then
    want asan && failed+=(asan) && summary+=("asan     skipped (build failed)")
    want fuzz && failed+=(fuzz) && summary+=("fuzz     skipped (build failed)")
  else
    want asan && stage asan asan
  fi
fi
want tsan && stage tsan tsan
if want fuzz && [[ " ${failed[*]} " != *" asan-build "* ]]; then stage fuzz fuzz; fi
want rdma && stage rdma rdma "$@"
want systemd && stage systemd systemd_vm

echo "================ summary ================"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "tests/run.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "tests/run.sh: every stage passed"
