#!/usr/bin/env bash
# The 25M-parameter MLP (bench/torch/bench_mlp.py: 1024-4096-4096-1024) on a
# rack on one machine: the hub and each of W workers in a network namespace of
# its own on one bridge, every node's link shaped with `tc tbf` in both
# directions (bench/netns_lib.sh's netns_rack, the same rack as
# bench/rack_netns.sh). Trained through the PyTorch plugin
# (rackhub.torch.DistributedOptimizer over TCP, one process per worker
# namespace) against torch DDP with the gloo backend on the same namespaces and
# links, modes interleaved round by round; after the last round every mode's
# parameters are checked against a single-process reference (bench_mlp.py
# --check); the CPU use of the hub, the ranks and the machine is printed, with
# the link bounds beside:
#
#   S    = the model's gradient bytes (fp32, 4 bytes a parameter)
#   S/L  = one model over a worker link (a parameter server's bound with a
#          hub link of W*L)
#   ring = 2(W-1)/W * S/L (what ring all-reduce must move over each link)
#
# Needs root, `ip netns`, veth, bridges and tc with tbf; otherwise prints
# "SKIPPED: ..." and exits 0. Needs /usr/bin/python3 with torch (exit 77 and
# "SKIPPED: ..." without it). Namespaces (and processes left in them) are
# removed on exit, also on failure or Ctrl-C. Exit 1 when a run or a check
# failed.
set -euo pipefail
me=torch_netns.sh

usage() {
  cat <<'EOF'
usage: bench/torch_netns.sh [options] [-- more bench_mlp.py options]

  --build DIR         build directory with bin/rackhubd, bin/rackhubctl, python/   [build]
  --workers W         workers, one namespace each                                  [2]
  --worker-rate L     each worker's link (tc units: 1gbit, 500mbit)             [1gbit]
  --hub-rate H        the hub's link; "auto" = W*L                               [auto]
  --modes M           bench_mlp.py modes              [rackhub,rackhub-sumonly,ddp-gloo]
  --steps N           timed steps per run                                         [10]
  --warmup N          untimed steps first                                          [2]
  --rounds N          interleaved rounds of all modes                              [3]
  --batch N           samples per rank and step                                   [32]
  --lanes N           hub lanes                                                    [2]
  --congestion-control CC  TCP congestion control in every namespace: cubic (Linux's
                      default), bbr, reno, ...; "host" = the host's own      [cubic]
  --prefix P          namespace name prefix                                      [rkt-]
  -h, --help
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="$here/../build"
workers=2 worker_rate=1gbit hub_rate=auto modes=rackhub,rackhub-sumonly,ddp-gloo steps=10
warmup=2 rounds=3 batch=32 lanes=2 prefix=rkt-
congestion=cubic
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --worker-rate) worker_rate=$2; shift 2 ;;
    --hub-rate) hub_rate=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --lanes) lanes=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --congestion-control) congestion=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$me: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$workers" in
  ''|*[!0-9]*) echo "$me: --workers must be a number in [1, 200]" >&2; exit 2 ;;
esac
[ "$workers" -ge 1 ] && [ "$workers" -le 200 ] ||
  { echo "$me: --workers must be a number in [1, 200]" >&2; exit 2; }

python=/usr/bin/python3
# shellcheck source=bench/netns_lib.sh
. "$here/netns_lib.sh"
[ -x "$python" ] && "$python" -c 'import torch' 2>/dev/null ||
  { echo "SKIPPED: $python cannot import torch (install python3-torch)"; exit 77; }

lbytes=$(rate_bytes "$worker_rate") || exit 2
if [ "$hub_rate" = auto ]; then
  hub_rate="$(( lbytes * 8 * workers / 1000000 ))mbit"
fi
hbytes=$(rate_bytes "$hub_rate") || exit 2

netns_require
netns_bench rackhubctl
[ -d "$build/python/rackhub" ] ||
  { echo "$me: $build/python/rackhub not built (cmake --build $build --target rackhub_python)" >&2; exit 2; }

trap netns_cleanup EXIT
trap 'exit 130' INT TERM
netns_rack "$prefix" "$workers" "$worker_rate" "$hub_rate"
netns_congestion "$congestion"

echo "$me: $workers workers at $worker_rate each ($lbytes B/s), hub at $hub_rate ($hbytes B/s),"
echo "  namespaces ${prefix}w0..$((workers - 1)), $hubns, bridge br0 in $sw; $(nproc) cores;"
echo "  TCP congestion control $(ip netns exec "$hubns" sysctl -n net.ipv4.tcp_congestion_control)"
echo "  load at the start: $(uptime)"
args=("$here/torch/bench_mlp.py" --build "$build" --world "$workers" --modes "$modes"
      --steps "$steps" --warmup "$warmup" --rounds "$rounds" --batch "$batch" --lanes "$lanes"
      --netns-prefix "$prefix" --hub-host 10.79.0.1 --master-addr 10.79.0.11 --ifname eth0
      --transport tcp --json)
echo "+ $python ${args[*]} ${extra[*]}"
out=$(mktemp)
set +e
"$python" "${args[@]}" "${extra[@]}" >"$out"
rc=$?
set -e
summary=$(cat "$out")
rm -f "$out"
[ -n "$summary" ] && [ "${summary:0:1}" = "{" ] ||
  { echo "$me: bench_mlp.py failed (exit $rc): $summary" >&2; exit 1; }
"$python" - "$summary" "$workers" "$lbytes" "$hbytes" <<'EOF'
import json, sys
r = json.loads(sys.argv[1])
w, lb, hb = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
wire = 4 * r["params"]
sl = wire / lb * 1e3
ps = max(sl, w * wire / hb * 1e3)
ring = 2 * (w - 1) / w * sl
print(f"  model {r['model']}, {r['params']} parameters, {wire / 2**20:.1f} MiB of fp32 gradient, "
      f"batch {r['batch_per_rank']}/rank, {r['threads_per_rank']} thread(s)/rank, "
      f"transport {r['transport']}")
print(f"  bounds: S/L {sl:.1f} ms, PS max(S/L, W*S/H) {ps:.1f} ms, ring 2(W-1)/W*S/L {ring:.1f} ms")
ratio = r.get("ratio_to_ddp_gloo", {})
for m, ms in r["median_ms_per_step"].items():
    c = r["cpu"][m]
    hub = "" if c["hub_cores"] is None else f", hub {c['hub_cores']:.2f} cores"
    print(f"  {m:16s} {ms:9.1f} ms/step = {ms / sl:.3f} x S/L"
          + (f" = {ratio[m]:.3f} x ddp-gloo" if m in ratio else "")
          + f"   (rounds {r['per_round_ms'][m]}; ranks' CPU "
          + " ".join("%.0f%%" % (100 * x) for x in c["rank_cpu_share"])
          + f"{hub}, machine {100 * c['machine_busy']:.0f}% busy)")
for m, c in r["param_checks"].items():
    print(f"  params, {m}: max |diff| from the single-process reference {c['max_abs_diff']:.3g} "
          f"(allowed {c['allowed']:.3g}): {'ok' if c['ok'] else 'FAIL'}")
print(f"  checks passed: {str(r['checks_passed']).lower()}")
EOF
[ $rc -eq 0 ] || { echo "$me: bench_mlp.py exited with $rc" >&2; exit 1; }
