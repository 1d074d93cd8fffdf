#!/usr/bin/env bash
# The C++ example (deploy/demo.sh is the main demo, a CNN through the PyTorch
# plugin): sets up, builds, starts a hub on loopback, creates a tenant with
# rackhubctl, and trains a small MLP on synthetic data with three data-parallel
# workers (rackhub-train-demo, client/examples/train_mlp.cc, on librackhub's
# C++ API) whose parameters and optimizer live on the hub. Then shows the
# hub's view (rackhubctl stats, key list). Leaves nothing running.
# BUILD_DIR (default: build) picks the build tree.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
./deploy/bootstrap.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target rackhubd rackhubctl rackhub-train-demo

workers=3
work=$(mktemp -d /tmp/rackhub-demo.XXXXXX)
hub_pid=""
worker_pids=()
cleanup() {
  for pid in "${worker_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  if [ -n "$hub_pid" ]; then kill -TERM "$hub_pid" 2>/dev/null || true; wait "$hub_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/admin.token"
echo "== starting rackhubd (admin token in $work/admin.token)"
"$build/bin/rackhubd" --admin-listen 127.0.0.1:0 --data-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --admin-token-file "$work/admin.token" --ready-file "$work/ready" \
  --state-dir "$work/state" 2> "$work/rackhubd.log" &
hub_pid=$!
for _ in $(seq 1 200); do [ -s "$work/ready" ] && break; sleep 0.05; done
[ -s "$work/ready" ] || { cat "$work/rackhubd.log"; echo "rackhubd did not start"; exit 1; }
admin=$(awk '$1=="admin"{print $2}' "$work/ready")
data=$(awk '$1=="data"{print $2}' "$work/ready")
echo "   admin API on $admin, data plane on $data"
echo
ctl() { "$build/bin/rackhubctl" --admin "$admin" --token-file "$work/admin.token" "$@"; }

echo "\$ rackhubctl tenant create mlp-demo --workers $workers --optimizer momentum --lr 0.05 --momentum 0.9"
ctl tenant create mlp-demo --workers "$workers" --optimizer momentum --lr 0.05 --momentum 0.9 \
  > "$work/tenant.txt"
# The data-plane token is shown once, on a line of its own: keep it in a file
# for the workers, and do not echo it.
sed -n 's/^data-plane token: *\([^[:space:]]*\).*$/\1/p' "$work/tenant.txt" > "$work/tenant.token"
[ -s "$work/tenant.token" ] || { cat "$work/tenant.txt"; echo "no data-plane token in the output"; exit 1; }
sed 's/^data-plane token: .*$/data-plane token: (saved to the workers'"'"' token file)/' "$work/tenant.txt"
echo

echo "== training: $workers workers (rank 0 below; ranks 1-$((workers - 1)) log to files)"
start_ms=$(( $(date +%s%N) / 1000000 ))
for rank in $(seq 0 $((workers - 1))); do
  args=(--hub "$data" --tenant mlp-demo --token-file "$work/tenant.token"
        --rank "$rank" --workers "$workers" --epochs 8 --batch 64 --optimizer momentum)
  if [ "$rank" -eq 0 ]; then
    "$build/bin/rackhub-train-demo" "${args[@]}" &
  else
    "$build/bin/rackhub-train-demo" "${args[@]}" > "$work/rank$rank.log" 2>&1 &
  fi
  worker_pids+=($!)
done
# Wait for every worker; the first one to fail stops the others (a worker
# that never connects would otherwise leave its peers waiting for it).
failed="" status=0 done_pid=""
pending=("${worker_pids[@]}")
while [ ${#pending[@]} -gt 0 ]; do
  wait -n -p done_pid "${pending[@]}" || status=$?
  for rank in "${!worker_pids[@]}"; do
    if [ "${worker_pids[$rank]}" = "$done_pid" ]; then failed=$rank; fi
  done
  [ "$status" -eq 0 ] || break
  remaining=()
  for pid in "${pending[@]}"; do [ "$pid" = "$done_pid" ] || remaining+=("$pid"); done
  pending=("${remaining[@]}")
done
if [ "$status" -ne 0 ]; then
  echo "rank ${failed:-?} failed (exit code $status); stopping the other workers"
  for pid in "${worker_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait "${worker_pids[@]}" 2>/dev/null || true
  worker_pids=()
  for rank in $(seq 1 $((workers - 1))); do
    echo "== rank $rank log"; cat "$work/rank$rank.log"
  done
  echo "== rackhubd log"; cat "$work/rackhubd.log"
  exit 1
fi
worker_pids=()
ms=$(( $(date +%s%N) / 1000000 - start_ms ))
printf '== training took %d.%02d s\n\n' $((ms / 1000)) $((ms % 1000 / 10))

echo "\$ rackhubctl stats"
ctl stats
echo
echo "\$ rackhubctl key list mlp-demo"
ctl key list mlp-demo
echo
echo "== stopping rackhubd"
