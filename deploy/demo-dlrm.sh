#!/usr/bin/env bash
# The DLRM demo: sets up (deploy/bootstrap.sh), builds, and trains a
# DLRM-style click model (embedding tables + bottom/top MLPs, dot
# interactions) on synthetic clicks drawn from a known ground-truth model,
# with 2 PyTorch workers through a rackhub hub: the embedding tables are
# row-sparse hub keys (nn.Embedding/EmbeddingBag(sparse=True), row-wise
# AdaGrad on the hub, the next batch's rows prefetched with each step's
# reply), the dense layers go through DistributedOptimizer's usual path
# (tests/python/dlrm_demo.py, dlrm_model.py). rackhub-run starts a private
# rackhubd on loopback, creates the tenant, runs the workers and stops
# everything. Rank 0 prints loss and held-out AUC per epoch, then trains the
# same model in one process and prints both AUCs and the Bayes-optimal one.
# WORKERS (default 2) sets the workers; extra arguments go to dlrm_demo.py
# (e.g. --no-prefetch). BUILD_DIR (default: build) picks the build tree.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
workers=${WORKERS:-2}
./deploy/bootstrap.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target rackhubd rackhubctl rackhub_python
if [ ! -x "$build/bin/rackhub-run" ]; then
  echo "demo-dlrm: $build/bin/rackhub-run was not generated (RACKHUB_BUILD_PYTHON=OFF in $build?)"
  exit 1
fi

log=$(mktemp /tmp/rackhub-demo-dlrm.XXXXXX)
trap 'rm -f "$log"' EXIT
echo
echo "\$ $build/bin/rackhub-run -n $workers python3 tests/python/dlrm_demo.py${*:+ $*}"
start_ms=$(( $(date +%s%N) / 1000000 ))
status=0
"$build/bin/rackhub-run" -n "$workers" python3 tests/python/dlrm_demo.py "$@" 2>&1 \
  | tee "$log" || status=$?
ms=$(( $(date +%s%N) / 1000000 - start_ms ))
result=$(sed -n 's/^\[0\] \(held-out AUC: .*\)$/\1/p' "$log" | tail -n 1)
if [ "$status" -ne 0 ]; then
  echo "demo-dlrm: rackhub-run failed (exit code $status)${result:+: $result}; the output above says which rank and why"
  exit 1
fi
if [ -z "$result" ]; then
  echo "demo-dlrm: rank 0 printed no held-out AUC"
  exit 1
fi
echo
printf '== %s\n== rackhub-run took %d.%d s (hub, tenant, %d workers, then the one-process run)\n' \
  "$result" $((ms / 1000)) $((ms % 1000 / 100)) "$workers"
