#!/usr/bin/env bash
# The rackhub demo: sets up, builds, starts a hub on loopback and walks
# through the admin API with rackhubctl. Leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/bootstrap.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target rackhubd rackhubctl

work=$(mktemp -d /tmp/rackhub-demo.XXXXXX)
hub_pid=""
cleanup() {
  if [ -n "$hub_pid" ]; then kill -TERM "$hub_pid" 2>/dev/null || true; wait "$hub_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/admin.token"
echo "== starting rackhubd (admin token in $work/admin.token)"
build/bin/rackhubd --admin-listen 127.0.0.1:0 --data-listen 127.0.0.1:0 \
  --admin-token-file "$work/admin.token" --ready-file "$work/ready" 2> "$work/rackhubd.log" &
hub_pid=$!
for _ in $(seq 1 200); do [ -s "$work/ready" ] && break; sleep 0.05; done
[ -s "$work/ready" ] || { cat "$work/rackhubd.log"; echo "rackhubd did not start"; exit 1; }
admin=$(awk '$1=="admin"{print $2}' "$work/ready")
ctl() { echo "\$ rackhubctl $*"; build/bin/rackhubctl --admin "$admin" --token-file "$work/admin.token" "$@"; echo; }

ctl tenant create mnist-job --workers 2 --optimizer momentum --lr 0.05 --momentum 0.9 --max-keys 8
ctl key create mnist-job fc1.weight --elements 100000
ctl key create mnist-job fc1.bias --elements 256 --optimizer adam --lr 0.001
ctl key list mnist-job
ctl key get mnist-job fc1.weight
ctl key set-optimizer mnist-job fc1.weight --lr 0.01
ctl stats
echo "== a refused request (quota) =="
ctl tenant update-quotas mnist-job --max-keys 2
set +e
ctl key create mnist-job third --elements 10
echo "(exit code $?)"
set -e
ctl tenant list
echo "== rackhubd log =="
cat "$work/rackhubd.log"
