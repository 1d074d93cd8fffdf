#!/usr/bin/env bash
# The rackhub demo: sets up (deploy/bootstrap.sh), builds, and trains a small
# CNN on real data, the 1797 handwritten-digit images scikit-learn ships in
# python3-sklearn (no download), with 3 data-parallel PyTorch workers whose
# gradients are averaged by a rackhub hub (client/examples/digits_cnn.py,
# Horovod-style rackhub.torch). rackhub-run starts a private rackhubd on
# loopback, creates the tenant with rackhubctl, runs the workers and stops
# everything at the end. Rank 0 prints a table per epoch, then trains the same
# model in one process without rackhub and prints both held-out accuracies.
# Extra arguments go to digits_cnn.py (e.g. --epochs 5). BUILD_DIR (default:
# build) picks the build tree; deploy/demo-mlp.sh is the C++ example.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
workers=3
./deploy/bootstrap.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target rackhubd rackhubctl rackhub_python
if [ ! -x "$build/bin/rackhub-run" ]; then
  echo "demo: $build/bin/rackhub-run was not generated (RACKHUB_BUILD_PYTHON=OFF in $build?)"
  exit 1
fi

log=$(mktemp /tmp/rackhub-demo.XXXXXX)
trap 'rm -f "$log"' EXIT
echo
echo "\$ $build/bin/rackhub-run -n $workers python3 client/examples/digits_cnn.py${*:+ $*}"
start_ms=$(( $(date +%s%N) / 1000000 ))
status=0
"$build/bin/rackhub-run" -n "$workers" python3 client/examples/digits_cnn.py "$@" 2>&1 \
  | tee "$log" || status=$?
ms=$(( $(date +%s%N) / 1000000 - start_ms ))
if [ "$status" -ne 0 ]; then
  echo "demo: rackhub-run failed (exit code $status); the output above says which rank and why"
  exit 1
fi
result=$(sed -n 's/^\[0\] \(held-out accuracy: .*\)$/\1/p' "$log" | tail -n 1)
if [ -z "$result" ]; then
  echo "demo: rank 0 printed no held-out accuracy"
  exit 1
fi
echo
printf '== %s\n== rackhub-run took %d.%d s (hub, tenant, %d workers, then the one-process run)\n' \
  "$result" $((ms / 1000)) $((ms % 1000 / 100)) "$workers"
