#!/usr/bin/env bash
# The full kill loops of issue 11 / docs/durability.md: the hub killed with
# SIGKILL at 100 random points (half of them during checkpoint writes), and
# one of three workers of a 4M-element key killed at 100 random points, and
# the worker replacement loops of issue 26 (rank 1 killed, fresh processes
# checked value by value, over shared memory and TCP) 100 times each, each
# followed by the checks of tests/durability/kill_loop_test.cc and
# replacement_loop_test.cc. CI runs the same tests with 20 trials of each
# (ctest -R durability_loop_test) and 5 of the replacement loops (ctest -R
# worker_replacement_loop_test).
#
# --cross-rack: instead, the cross-rack recovery loops of issue 31
# (tests/durability/cross_rack_recovery_test.cc: hub link cuts on 2 and 3
# racks, one lane's link on hubs of 2 lanes, a straggler, worker kill -9 on
# one rack, every step checked against the reference) with TRIALS times
# CI's rounds (default 10: 200 link cuts on 2 racks, 100 on 3, 100 one-lane
# cuts, 30 stragglers, 60 worker kills).
#
# --checkpoints: instead, the cluster checkpoint hub kill -9 loop of issue 31
# (tests/durability/cluster_checkpoint_test.cc, HubKill9LoopTwoRacks: a
# random hub of 2 racks, or every hub, killed and restarted; the restore point
# and every step checked) for TRIALS rounds (default 100; CI runs 20).
#
# Usage: tests/durability/kill_loops.sh [--cross-rack|--checkpoints] [BUILD_DIR] [TRIALS]
#   BUILD_DIR defaults to build/, TRIALS to 100 (--cross-rack: 10).
#   RACKHUB_KILL_SEED=N replays the random points of an earlier run (each run
#   prints its seed).
set -euo pipefail
cd "$(dirname "$0")/../.."
cross_rack=0
checkpoints=0
if [ "${1:-}" = "--cross-rack" ]; then
  cross_rack=1
  shift
elif [ "${1:-}" = "--checkpoints" ]; then
  checkpoints=1
  shift
fi
build="${1:-build}"
if [ "$checkpoints" = 1 ]; then
  if [ ! -x "$build/tests/cluster_checkpoint_test" ]; then
    echo "kill_loops.sh: $build/tests/cluster_checkpoint_test is not built (cmake --build $build)" >&2
    exit 2
  fi
  export RACKHUB_CKPT_ROUNDS="${2:-100}"
  exec "$build/tests/cluster_checkpoint_test" --gtest_filter='ClusterCheckpoint.HubKill9LoopTwoRacks'
fi
if [ "$cross_rack" = 1 ]; then
  if [ ! -x "$build/tests/cross_rack_recovery_test" ]; then
    echo "kill_loops.sh: $build/tests/cross_rack_recovery_test is not built (cmake --build $build)" >&2
    exit 2
  fi
  export RACKHUB_XRACK_ROUNDS="${2:-10}"
  exec "$build/tests/cross_rack_recovery_test"
fi
trials="${2:-100}"
for t in durability_loop_test worker_replacement_loop_test; do
  if [ ! -x "$build/tests/$t" ]; then
    echo "kill_loops.sh: $build/tests/$t is not built (cmake --build $build)" >&2
    exit 2
  fi
done
export RACKHUB_KILL_TRIALS="$trials"
export RACKHUB_KILL_ELEMENTS="${RACKHUB_KILL_ELEMENTS:-4194304}"
"$build/tests/durability_loop_test"
exec "$build/tests/worker_replacement_loop_test"
