#!/usr/bin/env bash
# Multi-rack benchmark under a real bottleneck: racks as network namespaces,
# cross-rack links shaped with `tc tbf`, hierarchical vs. flat exchange.
#
#   rh-rack0 (hub 0 + W workers) --rk0==sp0-- rh-spine --sp1==rk1-- rh-rack1 (hub 1 + W workers)
#                                  shaped         (router)      shaped
#
# Rack r is namespace rh-rack<r> holding veth `rk` = 10.77.<r>.2/24; the spine
# namespace routes between its ends sp<r> = 10.77.<r>.1/24. Each cross-rack
# link is shaped in both directions (egress of rk in the rack, egress of sp<r>
# in the spine). Intra-rack traffic (workers <-> their hub) stays inside the
# rack namespace (local address: loopback speed).
#
#   hierarchical: one hub per rack; only hub-to-hub traffic (rack sums out,
#                 parameters back) crosses the shaped links.
#   flat:         one hub, in rack 0; the workers of the other racks push and
#                 pull the whole model across the shaped links.
#
# Both run the same training traffic (rackhub-bench, every iteration verified
# bit for bit), interleaved for --rounds rounds per link rate. Prints the
# medians of the per-round median iteration times, the ratio hier/flat, the
# hub-link bytes the hubs count and the bytes that really crossed the shaped
# links (veth counters). Needs root, `ip netns` and `tc` with tbf; otherwise
# prints "SKIPPED: ..." and exits 0. Namespaces are removed on exit.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/multirack_netns.sh [options]

  --build DIR        build directory with bin/rackhubd and bin/rackhub-bench [build]
  --racks R          racks (namespaces rh-rack0..R-1)                     [2]
  --workers W        workers per rack                                      [4]
  --bytes SIZE       model size, fp32 bytes (rackhub-bench --bytes)        [16MiB]
  --iterations I     timed iterations per run (+2 warm-up)                 [5]
  --rounds N         interleaved [hierarchical, flat] rounds per rate      [3]
  --rates "R1 R2 .." cross-rack link rates (tc units: 1gbit, 300mbit; "none"
                     = unshaped veth, shows the CPU-bound floor)          [1gbit]
  --dtype fp32|bf16  wire dtype                                            [fp32]
  --lanes N          lanes per hub (0 = one per core)                      [0]
  --prefix P         namespace name prefix                                 [rh-]
  --json FILE        also write every run's rackhub-bench JSON (one a line)
  --etcd             run etcd in rack 0's namespace; the hubs keep their
                     registry there and find each other through it (no
                     per-hub setup: docs/cluster.md)
  -h, --help
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="$here/../build"
racks=2 workers=4 bytes=16MiB iterations=5 rounds=3 rates="1gbit" dtype=fp32 lanes=0
prefix=rh- json_out="" use_etcd=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --racks) racks=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --iterations) iterations=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --lanes) lanes=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --json) json_out=$2; shift 2 ;;
    --etcd) use_etcd=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "multirack_netns.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if ! [ "$racks" -ge 2 ] 2>/dev/null || [ "$racks" -gt 200 ]; then
  echo "multirack_netns.sh: --racks must be 2..200" >&2
  exit 2
fi

me=multirack_netns.sh
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3) || { echo "$me: needs python3" >&2; exit 2; }
# shellcheck source=bench/netns_lib.sh
. "$here/netns_lib.sh"
netns_require
netns_bench rackhub-bench

spine="${prefix}spine"
rack_ns() { echo "${prefix}rack$1"; }
trap netns_cleanup EXIT
trap 'exit 130' INT TERM

netns_add "$spine"
ip netns exec "$spine" sysctl -qw net.ipv4.ip_forward=1

for rate in $rates; do
  [ "$rate" = none ] || tbf_args "$rate" >/dev/null || exit 2
done

addrs=()
for r in $(seq 0 $((racks - 1))); do
  ns=$(rack_ns "$r")
  netns_add "$ns"
  ip link add "rhk$$x$r" netns "$ns" type veth peer name "sp$r" netns "$spine"
  ip -n "$ns" link set "rhk$$x$r" name rk
  ip -n "$ns" addr add "10.77.$r.2/24" dev rk
  ip -n "$ns" link set rk up
  ip -n "$spine" addr add "10.77.$r.1/24" dev "sp$r"
  ip -n "$spine" link set "sp$r" up
  ip -n "$ns" route add default via "10.77.$r.1"
  addrs+=("10.77.$r.2")
done
if ! add_tbf "$(rack_ns 0)" rk 1gbit 2>/dev/null; then
  netns_skip "tc cannot attach a tbf qdisc here (sch_tbf missing from the kernel?)"
fi
ip netns exec "$(rack_ns 0)" tc qdisc del dev rk root

# Shapes every cross-rack link (both directions) to $1, or removes shaping ("none").
shape() {
  local r ns
  for r in $(seq 0 $((racks - 1))); do
    ns=$(rack_ns "$r")
    ip netns exec "$ns" tc qdisc del dev rk root 2>/dev/null || true
    ip netns exec "$spine" tc qdisc del dev "sp$r" root 2>/dev/null || true
    if [ "$1" != none ]; then
      add_tbf "$ns" rk "$1"
      add_tbf "$spine" "sp$r" "$1"
    fi
  done
}

# Bytes sent + received by every rack over its shaped link so far (the
# spine's view: sp<r> tx = into rack r, rx = out of rack r).
link_bytes() {
  local r tx rx
  for r in $(seq 0 $((racks - 1))); do
    tx=$(ip netns exec "$spine" cat "/sys/class/net/sp$r/statistics/tx_bytes")
    rx=$(ip netns exec "$spine" cat "/sys/class/net/sp$r/statistics/rx_bytes")
    echo "$r $tx $rx"
  done
}

rack_addrs=$(IFS=,; echo "${addrs[*]}")
tmp=$(mktemp -d)
created_tmp=$tmp
trap 'netns_cleanup; rm -rf "$created_tmp"' EXIT

etcd_args=()
if [ "$use_etcd" = 1 ]; then
  [ -x /usr/bin/etcd ] || { echo "multirack_netns.sh: --etcd needs Debian's etcd-server" >&2; exit 2; }
  # One member in rack 0 (ended with the namespace by cleanup).
  ip netns exec "$(rack_ns 0)" /usr/bin/etcd --name bench --data-dir "$tmp/etcd" \
    --listen-client-urls http://10.77.0.2:2379 --advertise-client-urls http://10.77.0.2:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster bench=http://127.0.0.1:2380 --log-level error >"$tmp/etcd.log" 2>&1 &
  for _ in $(seq 1 100); do
    ip netns exec "$(rack_ns 0)" "$python" -c 'import socket; socket.create_connection(("10.77.0.2", 2379), 0.2)' \
      2>/dev/null && break
    sleep 0.1
  done
  etcd_args=(--etcd 10.77.0.2:2379)
  echo "  etcd at 10.77.0.2:2379 (rack 0's namespace): the tenant is created once"
fi
runs="$tmp/runs.txt"
: >"$runs"

echo "multirack_netns: $racks racks x $workers workers, $bytes $dtype model, $iterations iterations (+2 warm-up), $rounds rounds per rate"
echo "  namespaces $spine $(for r in $(seq 0 $((racks - 1))); do printf '%s ' "$(rack_ns "$r")"; done)"
echo "  rackhub-bench $bench"
for rate in $rates; do
  shape "$rate"
  for round in $(seq 1 "$rounds"); do
    for topo in hierarchical flat; do
      before=$(link_bytes)
      # In the background + wait, so that INT/TERM interrupt at once.
      ip netns exec "$(rack_ns 0)" "$bench" --racks "$racks" --workers "$workers" \
        --bytes "$bytes" --iterations "$iterations" --dtype "$dtype" --lanes "$lanes" \
        --topology "$topo" --rack-addrs "$rack_addrs" --netns-prefix "${prefix}rack" \
        "${etcd_args[@]}" --json >"$tmp/out.json" &
      if ! wait $!; then
        echo "multirack_netns.sh: rackhub-bench failed ($topo, rate $rate, round $round)" >&2
        exit 1
      fi
      out=$(cat "$tmp/out.json")
      after=$(link_bytes)
      line=$("$python" - "$rate" "$round" "$topo" "$out" "$before" "$after" <<'EOF'
import json, sys
rate, rnd, topo, out, before, after = sys.argv[1:]
d = json.loads(out)
b = {l.split()[0]: list(map(int, l.split()[1:])) for l in before.splitlines()}
a = {l.split()[0]: list(map(int, l.split()[1:])) for l in after.splitlines()}
per_link = {r: [a[r][0] - b[r][0], a[r][1] - b[r][1]] for r in a}  # [into rack, out of rack]
d.update(rate=rate, round=int(rnd), link_bytes=per_link)
print(json.dumps(d, separators=(",", ":")))
EOF
)
      echo "$line" >>"$runs"
      "$python" -c '
import json, sys
d = json.loads(sys.argv[1])
its = d["iterations"] + 2
worst = max(max(v) for v in d["link_bytes"].values()) / its
print("  rate %-8s round %d %-12s median %9.1f ms  verified %-5s  busiest link direction %6.1f MiB/iteration" %
      (d["rate"], d["round"], d["topology"], d["median_ms"], str(d["verified"]).lower(), worst / 2**20))
' "$line"
    done
  done
done
[ -n "$json_out" ] && cp "$runs" "$json_out"

"$python" - "$runs" "$racks" "$workers" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
R, W = int(sys.argv[2]), int(sys.argv[3])
M = runs[0]["bytes"] * (1 if runs[0]["dtype"] == "fp32" else 0.5)
# Bytes per iteration on the busiest direction of the busiest shaped link:
# flat: rack 0's link carries the pushes and pulls of the (R-1)*W remote workers;
# hierarchical: each hub sends (R-1)/R of the rack sums and (R-1)/R * M of
# parameters to the R-1 others (rack sums are fp32 whatever the wire dtype).
flat_an = (R - 1) * W * M
sums = runs[0]["bytes"] * (R - 1) / R
hier_an = sums + M * (R - 1) / R
print()
print("| link rate | hierarchical ms | flat ms | hier/flat | target <= 0.35 | hub-link bytes/it (counted) | busiest link MiB/it, hier | busiest link MiB/it, flat | round medians, hier | round medians, flat |")
print("|---|---:|---:|---:|---|---:|---:|---:|---|---|")
for rate in dict.fromkeys(r["rate"] for r in runs):
    rs = [r for r in runs if r["rate"] == rate]
    med, busiest, rounds = {}, {}, {}
    for t in ("hierarchical", "flat"):
        x = [r for r in rs if r["topology"] == t]
        rounds[t] = [r["median_ms"] for r in x]
        med[t] = statistics.median(rounds[t])
        busiest[t] = statistics.median(max(max(v) for v in r["link_bytes"].values()) / (r["iterations"] + 2) for r in x)
    ratio = med["hierarchical"] / med["flat"]
    ihb = statistics.median(r["interhub_bytes_per_iteration"] for r in rs if r["topology"] == "hierarchical")
    ok = all(r["verified"] for r in rs)
    print("| %s | %.1f | %.1f | %.3f | %s | %.0f | %.1f | %.1f | %s | %s |" % (
        rate, med["hierarchical"], med["flat"], ratio, "n/a (unshaped)" if rate == "none" else "met" if ratio <= 0.35 else "NOT met", ihb,
        busiest["hierarchical"] / 2**20, busiest["flat"] / 2**20,
        " ".join("%.0f" % v for v in rounds["hierarchical"]), " ".join("%.0f" % v for v in rounds["flat"])))
    if not ok:
        print("  WARNING: some run was not verified bit for bit")
digests = {r["digest"] for r in runs}
print()
print("analytic bytes per iteration on the busiest shaped link direction: hierarchical %.1f MiB, flat %.1f MiB (ratio %.3f)" %
      (hier_an / 2**20, flat_an / 2**20, hier_an / flat_an))
print("every run verified bit for bit: %s; final-parameter digests equal across all runs: %s" %
      (str(all(r["verified"] for r in runs)).lower(), str(len(digests) == 1).lower()))
EOF
