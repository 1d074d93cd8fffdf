#!/usr/bin/env bash
# fuzz/run.sh: runs the libFuzzer targets of fuzz/ one after the other, each
# from its checked-in seed corpus (fuzz/corpus/<target>/, read only: what the
# fuzzer adds goes to a temporary directory), and prints one line per target
# with its executions and exec/s.
#
#   fuzz/run.sh [--build DIR] [--seconds N] [--runs N] [--max-seconds S] [TARGET...]
#
#   --build DIR     the RACKHUB_FUZZ=ON build (default: build-fuzz)
#   --seconds N     run each target for N seconds (tests/run.sh: 20)
#   --runs N        run each target for N executions (fuzz/run_long.sh: 10 M),
#                   at most --max-seconds S (default: no limit)
#   TARGET...       some targets only (default: every one)
#
# Exits non-zero if any target finds something (crash, leak, timeout, UB, a
# broken contract): the reproducer is kept in DIR/fuzz-artifacts/<target>/
# and the last lines of its log are printed. SUMMARY=FILE appends the table
# (markdown) to FILE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$here/../build-fuzz
seconds=""
runs=""
max_seconds=0
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --max-seconds) max_seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "fuzz/run.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ -z "$seconds" ] && [ -z "$runs" ]; then seconds=20; fi
[ ${#targets[@]} -gt 0 ] || targets=(frame_fuzz frame_stream_fuzz control_fuzz config_fuzz
                                     checkpoint_fuzz hub_lane_fuzz)
build=$(cd "$build" && pwd)

# Per-target libFuzzer options. hub_lane_fuzz: a real hub per process, up to
# 64 operations per input, and a per-input time limit above its own 10 s
# liveness checks.
options() {
  case $1 in
    hub_lane_fuzz) echo "-max_len=513 -timeout=60" ;;
    *) echo "-timeout=30" ;;
  esac
}

work=$(mktemp -d /tmp/rackhub-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=()
table="| target | executions | exec/s | seconds | result |
|---|---:|---:|---:|---|"
for t in "${targets[@]}"; do
  bin=$build/fuzz/$t
  if [ ! -x "$bin" ]; then
    echo "fuzz/run.sh: $bin is not built (cmake --build $build --target fuzzers)" >&2
    exit 2
  fi
  mkdir -p "$work/$t" "$build/fuzz-artifacts/$t"
  limit=()
  if [ -n "$runs" ]; then
    limit=(-runs="$runs")
    [ "$max_seconds" -gt 0 ] && limit+=(-max_total_time="$max_seconds")
  else
    limit=(-max_total_time="$seconds")
  fi
  log=$work/$t.log
  start=$(date +%s)
  set +e
  # shellcheck disable=SC2046  # options() is a word list on purpose
  "$bin" "${limit[@]}" $(options "$t") -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-artifacts/$t/" "$work/$t" "$here/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if [ $rc -eq 0 ]; then result="nothing found"; else result="FOUND (exit $rc)"; fi
  printf 'fuzz: %-18s %12s executions %8s exec/s %6s s  %s\n' "$t" "${execs:-?}" "${rate:-?}" \
    "$elapsed" "$result"
  table+="
| $t | ${execs:-?} | ${rate:-?} | $elapsed | $result |"
  if [ $rc -ne 0 ]; then
    failed+=("$t")
    echo "---- $t: last lines of its log (reproducer in $build/fuzz-artifacts/$t/) ----"
    grep -v '^\[libprotobuf' "$log" | tail -40
  fi
done
if [ -n "${SUMMARY:-}" ]; then printf '%s\n' "$table" >>"$SUMMARY"; fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FOUND something in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, nothing found"
