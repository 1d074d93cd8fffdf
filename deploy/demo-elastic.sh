#!/usr/bin/env bash
# The elastic demo (docs/elastic.md): sets up, builds, starts a hub on
# loopback in a temporary directory, creates an elastic tenant with
# rackhubctl (start quorum 4, min 2, max 8) and runs the Horovod Elastic
# example (client/examples/horovod_elastic.py) with rackhub-run --min-np 2
# --max-np 8 (--max-restarts 0: the killed rank is not replaced by the
# launcher, the two added later take hub ranks 1 and 4). After the first epoch it kills one rank with SIGKILL, once the
# survivors have finished an epoch it adds two ranks (rackhub-run --add 2),
# and prints the membership of every epoch (the example's "size" and the
# hub's view, rackhubctl tenant get). Leaves nothing running.
# BUILD_DIR (default: build) picks the build tree; RACKHUB_DEMO_NO_BUILD=1
# skips the setup and the build (the test, tests/python/test_elastic_demo.py).
# EPOCHS (default 40) epochs of the example.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
if [ "${RACKHUB_DEMO_NO_BUILD:-0}" != 1 ]; then
  ./deploy/bootstrap.sh
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j"$(nproc)" --target rackhubd rackhubctl rackhub_python \
    rackhub_python_package
fi
epochs=${EPOCHS:-40}

work=$(mktemp -d /tmp/rackhub-demo-elastic.XXXXXX)
hub_pid=""
run_pid=""
cleanup() {
  if [ -n "$run_pid" ]; then kill -TERM "$run_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true; fi
  if [ -n "$hub_pid" ]; then kill -TERM "$hub_pid" 2>/dev/null || true; wait "$hub_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Waits (bounded) until the job's output has a line matching $1.
wait_line() {
  for _ in $(seq 1 1200); do
    if grep -qE "$1" "$work/job.log"; then return 0; fi
    if ! kill -0 "$run_pid" 2>/dev/null; then break; fi
    sleep 0.05
  done
  cat "$work/job.log"; echo "demo: no line matching '$1'"; exit 1
}

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/admin.token"
echo "== starting rackhubd"
"$build/bin/rackhubd" --admin-listen 127.0.0.1:0 --data-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --admin-token-file "$work/admin.token" --ready-file "$work/ready" --lanes 2 \
  --straggler-timeout-ms 60000 --state-dir "$work/state" 2> "$work/rackhubd.log" &
hub_pid=$!
for _ in $(seq 1 200); do [ -s "$work/ready" ] && break; sleep 0.05; done
[ -s "$work/ready" ] || { cat "$work/rackhubd.log"; echo "rackhubd did not start"; exit 1; }
admin=$(awk '$1=="admin"{print $2}' "$work/ready")
data=$(awk '$1=="data"{print $2}' "$work/ready")
ctl() { "$build/bin/rackhubctl" --admin "$admin" --token-file "$work/admin.token" "$@"; }

echo "\$ rackhubctl tenant create job --workers 4 --elastic --min-workers 2 --max-workers 8 --chunk-bytes 1MiB"
ctl tenant create job --workers 4 --elastic --min-workers 2 --max-workers 8 --chunk-bytes 1MiB \
  > "$work/tenant.txt"
sed -n 's/^data-plane token: *\([^[:space:]]*\).*$/\1/p' "$work/tenant.txt" > "$work/tenant.token"
[ -s "$work/tenant.token" ] || { cat "$work/tenant.txt"; echo "no data-plane token"; exit 1; }
echo

echo "\$ rackhub-run -n 4 --min-np 2 --max-np 8 --max-restarts 0 python3 client/examples/horovod_elastic.py --epochs $epochs"
"$build/bin/rackhub-run" --hub "$data" --tenant job --token-file "$work/tenant.token" \
  -n 4 --min-np 2 --max-np 8 --max-restarts 0 --job-dir "$work/job" \
  python3 client/examples/horovod_elastic.py --epochs "$epochs" > "$work/job.log" 2>&1 &
run_pid=$!
membership() { ctl tenant get job | grep -iE "membership|members" | head -2 | sed 's/^/   hub: /'; }

wait_line '^\[0\] epoch 1: size 4 '
grep -E '^\[0\] epoch ' "$work/job.log"
membership
victim=$(cat "$work/job/pid-1")
echo "== kill -9 rank 1 (pid $victim)"
kill -KILL "$victim"
wait_line '^\[0\] epoch [0-9]+: size 3 '
grep -E '^\[0\] epoch ' "$work/job.log" | tail -n 1
membership
echo "\$ rackhub-run --add 2 --job $work/job"
"$build/bin/rackhub-run" --add 2 --job "$work/job"
wait_line '^\[0\] epoch [0-9]+: size 5 '
set +e
wait "$run_pid"
code=$?
set -e
run_pid=""
echo
echo "== membership per epoch (rank 0 of the example):"
grep -E '^\[0\] epoch ' "$work/job.log" | sed 's/^\[0\] /   /'
grep -E 'rackhub-run: ' "$work/job.log" | sed 's/^/   /'
membership
[ "$code" = 0 ] || { cat "$work/job.log"; echo "demo: rackhub-run exited with $code"; exit 1; }
echo "demo: done (the job went on through the kill and the joins)"
