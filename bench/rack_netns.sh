#!/usr/bin/env bash
# A rack on one machine: the hub and each of W workers in a network namespace
# of its own, all on one bridge, every node's link shaped with `tc tbf` in
# both directions. rackhub (TCP: shared memory must not bypass the links)
# against gloo all_reduce (torch.distributed, one rank per worker namespace)
# on the same links, interleaved rounds (rackhub-bench --compare gloo), every
# value verified, with the link bounds printed beside:
#
#          rk-w0 (10.79.0.11) --L--+
#          rk-w1 (10.79.0.12) --L--+-- br0 in rk-sw --H-- rk-hub0 (rackhubd, 10.79.0.1)
#          ...                --L--+   (rackhub-bench runs here, 10.79.0.254)
#
#   S    = bytes of one model on the wire (fp32: --bytes; 16-bit: half)
#   S/L  = one model over a worker link: the bound of a parameter server
#          whose hub link is wide enough (every worker sends S and gets S back)
#   PS   = max(S/L, W*S/H): the hub link carries W models each way
#   ring = 2(W-1)/W * S/L: what ring all-reduce must move over each worker link
#
# Needs root, `ip netns`, veth, bridges and tc with tbf (netem is not used);
# otherwise prints "SKIPPED: ..." and exits 0. Namespaces (and processes left
# in them) are removed on exit, also on failure or Ctrl-C.
set -euo pipefail
me=rack_netns.sh

usage() {
  cat <<'EOF'
usage: bench/rack_netns.sh [options] [-- more rackhub-bench options]

  --build DIR         build directory with bin/rackhubd and bin/rackhub-bench   [build]
  --workers W         workers, one namespace each                                  [4]
  --worker-rate L     each worker's link (tc units: 1gbit, 500mbit)             [1gbit]
  --hub-rate H        the hub's link; "auto" = W*L (a hub with W NICs' worth)    [auto]
  --bytes SIZE        model size in fp32 bytes                                  [64MiB]
  --keys K            keys the model is split into                                 [4]
  --profile P         even | resnet50 (ResNet-50's 161 tensors; sets bytes, keys) [even]
  --gloo-bucket-mib B  with --profile resnet50: gloo all_reduces each tensor (0) or
                      DDP-style buckets of at most B MiB, last tensor first      [0]
  --dtype D           fp32 | bf16 (gloo: fp16 when torch's gloo lacks bf16)      [fp32]
  --optimizer O       the hub's optimizer: sum-only, sgd, adam, ...          [sum-only]
  --iterations I      timed iterations per run                                     [5]
  --warmup N          untimed (verified) iterations first                          [1]
  --rounds N          interleaved [rackhub, gloo] rounds                           [3]
  --lanes N           hub lanes (0 = one per core)                                 [0]
  --json FILE         append rackhub-bench's JSON result (one line) to FILE
  --congestion-control CC  TCP congestion control in every namespace: cubic (Linux's
                      default), bbr, reno, ...; "host" = the host's own      [cubic]
  --prefix P          namespace name prefix                                      [rk-]
  -h, --help
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="$here/../build"
workers=4 worker_rate=1gbit hub_rate=auto bytes=64MiB keys=4 profile=even dtype=fp32
optimizer=sum-only iterations=5 warmup=1 rounds=3 lanes=0 json="" prefix=rk- bucket_mib=0
congestion=cubic
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --worker-rate) worker_rate=$2; shift 2 ;;
    --hub-rate) hub_rate=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --gloo-bucket-mib) bucket_mib=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --optimizer) optimizer=$2; shift 2 ;;
    --iterations) iterations=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --lanes) lanes=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
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
[ -x "$python" ] || python=$(command -v python3) || { echo "$me: needs python3" >&2; exit 2; }
# shellcheck source=bench/netns_lib.sh
. "$here/netns_lib.sh"

lbytes=$(rate_bytes "$worker_rate") || exit 2
if [ "$hub_rate" = auto ]; then
  hub_rate="$(( lbytes * 8 * workers / 1000000 ))mbit"
fi
hbytes=$(rate_bytes "$hub_rate") || exit 2

netns_require
netns_bench rackhub-bench

trap netns_cleanup EXIT
trap 'exit 130' INT TERM

netns_rack "$prefix" "$workers" "$worker_rate" "$hub_rate"
netns_congestion "$congestion"

echo "$me: $workers workers at $worker_rate each ($lbytes B/s), hub at $hub_rate ($hbytes B/s),"
echo "  namespaces ${prefix}w0..$((workers - 1)), $hubns, bridge br0 in $sw; $(nproc) cores;"
echo "  TCP congestion control $(ip netns exec "$hubns" sysctl -n net.ipv4.tcp_congestion_control)"
args=(--workers "$workers" --bytes "$bytes" --keys "$keys" --profile "$profile" --dtype "$dtype"
      --optimizer "$optimizer" --iterations "$iterations" --warmup "$warmup" --rounds "$rounds"
      --lanes "$lanes" --transport tcp --hub-netns-prefix "${prefix}hub" --rack-addrs 10.79.0.1
      --netns-per-worker "${prefix}w" --compare gloo --gloo-master-addr 10.79.0.11
      --gloo-ifname eth0 --gloo-bucket-mib "$bucket_mib" --json)
echo "+ ip netns exec $sw $bench ${args[*]} ${extra[*]}"
out=$(mktemp)
before=$(cpu_sample)
set +e
ip netns exec "$sw" "$bench" "${args[@]}" "${extra[@]}" >"$out"
rc=$?
set -e
after=$(cpu_sample)
line=$(tail -n 1 "$out")
rm -f "$out"
[ -z "$json" ] || echo "$line" >>"$json"
[ $rc -eq 0 ] || { echo "$me: rackhub-bench failed (exit $rc): $line" >&2; exit 1; }
"$python" - "$line" "$workers" "$lbytes" "$hbytes" "$before" "$after" <<'EOF'
import json, sys
r = json.loads(sys.argv[1])
w, lb, hb = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
i0, t0 = map(float, sys.argv[5].split())
i1, t1 = map(float, sys.argv[6].split())
wire = r["bytes"] if r["dtype"] == "fp32" else r["bytes"] // 2
sl = wire / lb * 1e3
ps = max(sl, w * wire / hb * 1e3)
ring = 2 * (w - 1) / w * sl
rh, gl = r["median_ms"], r.get("gloo_median_ms")
print(f"  model {r['bytes'] / 2**20:.1f} MiB ({r['keys']} keys), {wire / 2**20:.1f} MiB on the wire "
      f"({r['dtype']}), optimizer {r['optimizer']}, verified: {r['verified']}")
if r.get("profile", "even") != "even":
    b = r["gloo_bucket_mib"]
    print(f"  profile {r['profile']}: rackhub one key per tensor; gloo "
          + ("one all_reduce per tensor" if b == 0 else f"DDP-style buckets of <= {b} MiB"))
print(f"  bounds: S/L {sl:.1f} ms, PS max(S/L, W*S/H) {ps:.1f} ms, ring 2(W-1)/W*S/L {ring:.1f} ms")
print(f"  rackhub {rh:.1f} ms = {rh / sl:.3f} x S/L = {rh / ps:.3f} x PS bound"
      f"   (round medians {r['round_median_ms']})")
if gl:
    print(f"  gloo    {gl:.1f} ms = {gl / sl:.3f} x S/L = {gl / ring:.3f} x ring bound"
          f"   (round medians {r['gloo_round_median_ms']}, {r['gloo_dtype']})")
    print(f"  rackhub / gloo = {r['ratio_to_gloo']:.3f}")
else:
    print(f"  gloo: {r.get('gloo_error')}")
busy = 1 - (i1 - i0) / (t1 - t0)
print(f"  machine CPU busy over the whole run: {busy * 100:.0f} % of all cores; "
      f"hub CPU {r['hub_cpu_s_per_gb']:.3f} s per GB of gradient")
EOF
