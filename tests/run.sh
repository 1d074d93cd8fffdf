#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs rackhub's tests at one of two
# levels (docs/testing.md).
# Usage: tests/run.sh [--full] [extra ctest args, e.g. -L unit or -R admin]
#
# Quick level (the default): stages
#   build    Release build in build/ (ccache when installed)
#   tests    every CTest test that needs neither a VM nor a sanitizer build
#            (all but label `rdma_device`), `ctest -j$(nproc)`
# --full (what .ci/run runs): the quick level, then
#   asan     ASan + UBSan unity build in build-asan/ (clang, also the fuzz targets):
#            the CTest label `asan` (every unit test and a set of integration tests)
#   tsan     TSan unity build in build-tsan/ (GCC): the CTest label `tsan`
#   fuzz     every libFuzzer target of fuzz/ for RACKHUB_FUZZ_SECONDS (20) each
#   rdma     the RDMA tests on a real verbs device or in a Soft-RoCE VM
#            (RACKHUB_REQUIRE_RDMA=1: a VM that cannot boot fails)
#   systemd  the rackhubd unit and package under a real systemd, in a VM
#            (RACKHUB_REQUIRE_SYSTEMD_VM=1; uses build/ only)
# Each stage runs even if an earlier one failed (after bootstrap; the tests
# need their build); the run fails if any stage failed. ctest arguments go to
# every CTest stage chosen; RACKHUB_STAGES names the stages to run instead,
# e.g.  RACKHUB_STAGES="asan tsan" tests/run.sh --full -R lane_fault
#
# Skips: the summary lists every skip of the CTest stages (whole entries that
# CTest reports "Skipped", i.e. exit 77, and each GTEST_SKIP with its reason).
# With --full a skip that tests/allowed-skips.txt does not list fails its stage.
#
# Env: RACKHUB_BUILD_DIR (build), RACKHUB_ASAN_BUILD_DIR (build-asan),
# RACKHUB_TSAN_BUILD_DIR (build-tsan), RACKHUB_JOBS (nproc),
# RACKHUB_NO_BOOTSTRAP=1 (packages already installed; tests/stress.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

full=0
if [ "${1:-}" = --full ]; then
  full=1
  shift
fi
[ "${RACKHUB_NO_BOOTSTRAP:-0}" = 1 ] || ./deploy/bootstrap.sh

if [ -n "${RACKHUB_STAGES:-}" ]; then
  stages=" $RACKHUB_STAGES "
elif [ $full = 1 ]; then
  stages=" build tests asan tsan fuzz rdma systemd "
else
  stages=" build tests "
fi
want() { [[ "$stages" == *" $1 "* ]]; }
jobs=${RACKHUB_JOBS:-$(nproc)}
build=${RACKHUB_BUILD_DIR:-build}
build_asan=${RACKHUB_ASAN_BUILD_DIR:-build-asan}
build_tsan=${RACKHUB_TSAN_BUILD_DIR:-build-tsan}
ctest_args=(--output-on-failure -j"$jobs" "$@")
# A label that selects nothing is a broken stage (not with a user's filter).
[ $# -gt 0 ] || ctest_args+=(--no-tests=error)
# ccache when installed (deploy/bootstrap.sh installs it), never required.
# Paths below the checkout are hashed relative to it and the build
# directory's path not at all, so a fresh clone elsewhere (CI, /tmp) hits the
# Release objects of an earlier one. Not the unity batches of the sanitizer
# builds: CMake's generated batch sources include each file by its absolute
# path (relative ones need CMake 3.31's UNITY_BUILD_RELOCATABLE; Debian 12
# has 3.25), so those hit only in the same checkout.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$repo} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
if [ $full = 1 ]; then
  # The VM stages must really run: a VM that cannot boot fails them.
  export RACKHUB_REQUIRE_RDMA=1 RACKHUB_REQUIRE_SYSTEMD_VM=1
fi
# Sanitizer reports fail the process that has them (tests and the rackhubd
# they start); TSan's known reports from uninstrumented libraries and UBSan's
# one vptr report inside Boost are suppressed with a comment per entry
# (tests/sanitizers/).
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$repo/tests/sanitizers/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$repo/tests/sanitizers/tsan.supp"

work=$(mktemp -d /tmp/rackhub-run.XXXXXX)
trap 'rm -rf "$work"' EXIT
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
  summary+=("$(printf '%-10s %5ss  %s' "$name" "$(( $(date +%s) - start ))" \
    "$([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")")")
  [ $rc -eq 0 ] || failed+=("$name")
  # Name the failed tests here too: a CI log is often read from its tail.
  local dir log
  for dir in "$build" "$build_asan" "$build_tsan"; do
    log=$dir/Testing/Temporary/LastTestsFailed.log
    if [ $rc -ne 0 ] && [ -s "$log" ] && [ "$log" -nt "$stage_marker" ]; then
      summary+=("           failed in $dir: $(cut -d: -f2- "$log" | tr '\n' ' ')")
      # ... and the first assertions that failed (GoogleTest's "Failure"
      # lines and the lines that follow them), from CTest's full log.
      local details
      details=$(grep -A4 -E ': Failure$|^\[  FAILED  \]' "$dir/Testing/Temporary/LastTest.log" \
        2>/dev/null | cut -c1-200 | head -40 || true)
      [ -z "$details" ] || summary+=("$(sed 's/^/           | /' <<<"$details")")
    fi
  done
  if [ -s "$work/skips.$name" ]; then
    summary+=("$(sed 's/^/           /' "$work/skips.$name")")
  fi
  rm -f "$stage_marker"
}

# The skips of the last CTest run in DIR whose output is in file OUT, one per
# line: ENTRY<TAB>CASE<TAB>REASON. CASE is a GoogleTest Suite.Name (from the
# "[rackhub-skip]" lines in CTest's LastTest.log), or "-" for an entry CTest
# reports "Skipped" (exit 77) that names no case, e.g. a Python suite (its
# reason: its "SKIPPED: ..." line). LastTest.log says "Test Passed." even for
# a skipped entry, so those come from CTest's own list in OUT.
skips_of() {
  awk -v out="$2" '
    BEGIN {
      while ((getline line < out) > 0) {
        if (match(line, /^[ \t]*[0-9]+ - [^ ]+ \(Skipped\)/)) {
          split(substr(line, RSTART, RLENGTH), f, " - ")
          sub(/ \(Skipped\).*/, "", f[2]); skipped_entry[f[2]] = 1
        }
      }
    }
    /^[0-9]+\/[0-9]+ Test: / { entry = $3; next }
    /^\[rackhub-skip\] / {
      line = substr($0, 16); i = index(line, ": ")
      print entry "\t" substr(line, 1, i - 1) "\t" substr(line, i + 2); cases[entry]++; next
    }
    /^SKIPPED: / { if (!(entry in why)) why[entry] = substr($0, 10); next }
    END {
      for (e in skipped_entry)
        if (!(e in cases)) print e "\t-\t" (e in why ? why[e] : "exit 77, no reason printed")
    }
  ' "$1/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u
}
# Whether tests/allowed-skips.txt allows skip ENTRY CASE (glob patterns).
allowed() {
  local e c rest
  while read -r e c rest; do
    [[ -z "$e" || "$e" == \#* ]] && continue
    # shellcheck disable=SC2053  # the patterns are globs
    [[ "$1" == $e && "$2" == $c ]] && return 0
  done < "$repo/tests/allowed-skips.txt"
  return 1
}
# ctest_stage NAME DIR CTEST_ARGS...: CTest in DIR, then its skips (listed in
# the summary; with --full, a skip not allowed fails the stage).
ctest_stage() {
  local name=$1 dir=$2 rc=0 unexpected=0 entry case why
  shift 2
  ctest --test-dir "$dir" "$@" 2>&1 | tee "$work/ctest.$name" || rc=${PIPESTATUS[0]}
  while IFS=$'\t' read -r entry case why; do
    if allowed "$entry" "$case"; then
      echo "skipped   $entry $case: $why" >> "$work/skips.$name"
    else
      echo "SKIPPED   $entry $case: $why  (not in tests/allowed-skips.txt)" >> "$work/skips.$name"
      unexpected=$((unexpected + 1))
    fi
  done < <(skips_of "$dir" "$work/ctest.$name")
  if [ -s "$work/skips.$name" ]; then
    echo "---- $name: skipped tests"
    cat "$work/skips.$name"
  fi
  if [ $full = 1 ] && [ $unexpected -gt 0 ]; then
    echo "$name: $unexpected skip(s) not in tests/allowed-skips.txt: failing (--full)" >&2
    [ $rc -ne 0 ] || rc=1
  fi
  return $rc
}

build_release() {
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}"
  cmake --build "$build" -j"$jobs"
}
tests_release() {
  ctest_stage tests "$build" -LE rdma_device --timeout 600 "${ctest_args[@]}"
}

# The sanitizer builds are unity builds (CMake batches 16 sources of a
# target into one translation unit): half the compiler time of separate
# sources, since gRPC's, Asio's and our headers are parsed once a batch.
# The Release build stays one unit per source, which is what a developer
# rebuilds and what shows a missing #include.
unity=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16)

# One clang build serves both: the sanitized test subset and the fuzzers
# (RACKHUB_FUZZ=ON instruments every library for both).
asan_build() {
  cmake -S . -B "$build_asan" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DRACKHUB_FUZZ=ON "${unity[@]}" "${launcher[@]}"
  local targets=()
  want asan && targets+=(asan_tests)
  want fuzz && targets+=(fuzzers)
  cmake --build "$build_asan" -j"$jobs" --target "${targets[@]}"
}
asan() {
  ctest_stage asan "$build_asan" -L asan --timeout 900 "${ctest_args[@]}"
}

tsan() {
  cmake -S . -B "$build_tsan" -DCMAKE_BUILD_TYPE=Release -DRACKHUB_SANITIZE=thread \
    "${unity[@]}" "${launcher[@]}"
  cmake --build "$build_tsan" -j"$jobs" --target tsan_tests
  ctest_stage tsan "$build_tsan" -L tsan --timeout 900 "${ctest_args[@]}"
}

fuzz() {
  fuzz/run.sh --build "$build_asan" --seconds "${RACKHUB_FUZZ_SECONDS:-20}"
}

# The RDMA tests (label `rdma`) on a real verbs device: natively, or in a
# Soft-RoCE VM when this host has none. With --full (RACKHUB_REQUIRE_RDMA=1)
# a VM that cannot boot, or any RDMA test that skips, fails the stage.
rdma() {
  tests/rdma/run.sh "$build" "$@"
}

# The .deb (or install tree) of build/ in a VM booted with systemd as PID 1:
# start after READY, stop, config errors, watchdog restarts, hardening score.
systemd_vm() {
  tests/systemd/run.sh "$build"
}

run_start=$(date +%s)
want build && stage build build_release
if want tests; then
  if [[ " ${failed[*]} " == *" build "* ]]; then
    failed+=(tests) && summary+=("tests      skipped (build failed)")
  else
    stage tests tests_release
  fi
fi
if want asan || want fuzz; then
  stage asan-build asan_build
  if [[ " ${failed[*]} " == *" asan-build "* ]]; then
    want asan && failed+=(asan) && summary+=("asan       skipped (build failed)")
    want fuzz && failed+=(fuzz) && summary+=("fuzz       skipped (build failed)")
  else
    want asan && stage asan asan
  fi
fi
want tsan && stage tsan tsan
if want fuzz && [[ " ${failed[*]} " != *" asan-build "* ]]; then stage fuzz fuzz; fi
want rdma && stage rdma rdma "$@"
want systemd && stage systemd systemd_vm

echo "================ summary ($([ $full = 1 ] && echo full || echo quick) level," \
  "$(( $(date +%s) - run_start )) s) ================"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "tests/run.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "tests/run.sh: every stage passed"
