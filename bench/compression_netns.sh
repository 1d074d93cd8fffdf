#!/usr/bin/env bash
# Top-k compression over a shaped link: rackhub-compression-bench --scenario
# topk with the hub and the workers in two network namespaces joined by a
# veth pair shaped with `tc tbf` (both directions, or with --directions up only
# workers -> hub), then (for comparison) the same run on plain loopback.
# --optimizer sum-only declares the keys sum-only (top-k replies sparse).
#
#   <prefix>wk (the bench: W worker threads, TCP)  wv ===== hv  <prefix>hub (rackhubd)
#                 10.78.0.2                          shaped       10.78.0.1
#
# The workers are forced onto TCP (--transport tcp: shared memory must not
# be used across namespaces). The bench counts the hub's bytes_in/bytes_out
# and the tx + rx bytes of `wv` (what really crossed the shaped link).
# Needs root, `ip netns` and tc with tbf (tc netem is not needed); otherwise
# prints "SKIPPED: ..." and exits 0. The namespaces (and any process left in
# them) are removed on exit, also on failure or Ctrl-C. Same harness as
# bench/multirack_netns.sh.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/compression_netns.sh [options] [-- more rackhub-compression-bench options]

  --build DIR        build directory with bin/rackhubd and bin/rackhub-compression-bench [build]
  --rates "R1 R2 .." link rates (tc units: 1gbit, 300mbit; "none" = unshaped veth)      [1gbit]
  --sizes LIST       key sizes, fp32 bytes, comma-separated                              [64MiB]
  --ratios LIST      top-k ratios, 0 = dense                                    [0,0.01,0.001]
  --workers W        worker threads                                                        [2]
  --iterations I     timed steps per variant and round                                     [5]
  --warmup N         untimed steps before them                                             [1]
  --rounds N         interleaved rounds                                                    [3]
  --lanes N          hub lanes                                                             [2]
  --directions D     both: shape workers->hub and hub->workers; up: only workers->hub
                     (an asymmetric link: the pushes are the bottleneck)              [both]
  --optimizer O      the keys' optimizer: sgd (dense parameter replies) or sum-only (the
                     reply is the averaged gradient, sparse for top-k keys)            [sgd]
  --no-loopback      skip the comparison run on plain loopback
  --prefix P         namespace name prefix                                              [rhc-]
  -h, --help
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="$here/../build"
rates="1gbit" sizes=64MiB ratios=0,0.01,0.001 workers=2 iterations=5 warmup=1 rounds=3 lanes=2
loopback=1 prefix=rhc- directions=both optimizer=sgd
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --ratios) ratios=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --iterations) iterations=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --lanes) lanes=$2; shift 2 ;;
    --directions) directions=$2; shift 2 ;;
    --optimizer) optimizer=$2; shift 2 ;;
    --no-loopback) loopback=0; shift ;;
    --prefix) prefix=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compression_netns.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$directions" in
  both|up) ;;
  *) echo "compression_netns.sh: --directions must be both or up" >&2; exit 2 ;;
esac
case "$optimizer" in
  sgd|sum-only) ;;
  *) echo "compression_netns.sh: --optimizer must be sgd or sum-only" >&2; exit 2 ;;
esac

me=compression_netns.sh
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3) || { echo "$me: needs python3" >&2; exit 2; }
# shellcheck source=bench/netns_lib.sh
. "$here/netns_lib.sh"
netns_require
netns_bench rackhub-compression-bench

hubns="${prefix}hub" wkns="${prefix}wk"
trap netns_cleanup EXIT
trap 'exit 130' INT TERM

netns_add "$hubns"
netns_add "$wkns"
ip link add "rhcw$$" netns "$wkns" type veth peer name "rhch$$" netns "$hubns"
ip -n "$wkns" link set "rhcw$$" name wv
ip -n "$hubns" link set "rhch$$" name hv
ip -n "$wkns" addr add 10.78.0.2/24 dev wv
ip -n "$hubns" addr add 10.78.0.1/24 dev hv
ip -n "$wkns" link set wv up
ip -n "$hubns" link set hv up

for rate in $rates; do
  [ "$rate" = none ] || tbf_args "$rate" >/dev/null || exit 2
done

# Shapes the link to $1: the egress of wv (workers -> hub) and, unless $2
# is "up", of hv (hub -> workers); "none" removes the shaping.
shape() {
  ip netns exec "$wkns" tc qdisc del dev wv root 2>/dev/null || true
  ip netns exec "$hubns" tc qdisc del dev hv root 2>/dev/null || true
  add_tbf "$wkns" wv "$1" || return 1
  [ "$2" = up ] || add_tbf "$hubns" hv "$1"
}
shape 1gbit both 2>/dev/null || netns_skip "tc cannot attach a tbf qdisc here (sch_tbf missing from the kernel?)"
shape none both

common=(--scenario topk --transport tcp --sizes "$sizes" --ratios "$ratios" --workers "$workers"
        --iterations "$iterations" --warmup "$warmup" --rounds "$rounds" --lanes "$lanes"
        --optimizer "$optimizer")
echo "compression_netns: namespaces $wkns (bench, 10.78.0.2) and $hubns (rackhubd, 10.78.0.1), veth wv<->hv"
echo "  $bench"
for rate in $rates; do
  shape "$rate" "$directions"
  echo
  how=unshaped
  [ "$rate" = none ] || how="tbf $(tbf_args "$rate") on wv$([ "$directions" = up ] || echo " and hv")"
  echo "=== link $rate ($how)"
  echo "+ ip netns exec $wkns $bench ${common[*]} --hub-netns $hubns --hub-host 10.78.0.1 --link-dev wv ${extra[*]}"
  # In the background + wait, so that INT/TERM interrupt at once.
  ip netns exec "$wkns" "$bench" "${common[@]}" --hub-netns "$hubns" --hub-host 10.78.0.1 \
    --link-dev wv "${extra[@]}" &
  wait $! || { echo "compression_netns.sh: the bench failed (link $rate)" >&2; exit 1; }
  ip netns exec "$wkns" tc -s qdisc show dev wv | sed 's/^/  wv qdisc: /' | head -3
done
if [ "$loopback" = 1 ]; then
  echo
  echo "=== plain loopback (no namespaces, unshaped)"
  echo "+ $bench ${common[*]} ${extra[*]}"
  "$bench" "${common[@]}" "${extra[@]}" &
  wait $! || { echo "compression_netns.sh: the bench failed (loopback)" >&2; exit 1; }
fi
