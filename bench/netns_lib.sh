# Shared by the benchmarks that build networks of namespaces (sourced, not
# run): bench/rack_netns.sh, bench/torch_netns.sh. Needs $python (an interpreter) and $me (the
# calling script's name, for messages) set by the caller.
#
#   netns_skip MSG           prints "SKIPPED: MSG" and exits 0 (no root, no tc, ...)
#   netns_require            skips unless run as root with ip and tc
#   netns_bench NAME         makes $build absolute and sets $bench to $build/bin/NAME;
#                            exits 2 unless NAME and rackhubd are built there
#   netns_add NAME           creates namespace NAME (lo up), removed at exit with
#                            every process still in it; fails if it exists (the
#                            first one: skips when namespaces cannot be made)
#   tbf_args RATE            "rate R burst B latency 100ms" for tc (burst: 2 ms of
#                            line rate, at least 128 KiB: GSO-sized packets)
#   add_tbf NS DEV RATE      shapes DEV's egress in NS to RATE ("none": unshaped)
#   rate_bytes RATE          RATE in bytes per second
#   netns_rack PREFIX W L H  a rack on one machine: namespaces PREFIXsw (bridge br0,
#                            10.79.0.254), PREFIXhub0 (10.79.0.1, link H) and
#                            PREFIXw0..W-1 (10.79.0.11+r, links L), every link
#                            shaped both ways; sets $sw and $hubns
#   netns_congestion CC      TCP congestion control CC in every namespace made so
#                            far ("host": leave what they inherited from the host)
#   cpu_sample               "idle total" jiffies of the whole machine (/proc/stat)

netns_created=()

netns_skip() { echo "SKIPPED: $*"; exit 0; }

netns_require() {
  [ "$(id -u)" = 0 ] || netns_skip "needs root (network namespaces, veth, tc); run as root"
  command -v ip >/dev/null || netns_skip "'ip' (iproute2) not found"
  command -v tc >/dev/null || netns_skip "'tc' (iproute2) not found"
}

netns_bench() {
  local b dir
  dir=$(cd "$build" 2>/dev/null && pwd) || { echo "$me: no build directory '$build' (--build)" >&2; exit 2; }
  build=$dir
  bench="$build/bin/$1"
  for b in "$bench" "$build/bin/rackhubd"; do
    [ -x "$b" ] || { echo "$me: $b not built (cmake --build $build --target rackhubd $1)" >&2; exit 2; }
  done
}

netns_cleanup() {
  local ns pids
  netns_cc_put_back
  # Processes still inside our namespaces (an interrupted bench and its
  # hub) are ours: end them by pid, then remove the namespaces.
  for ns in "${netns_created[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086  # one pid a word
    [ -z "$pids" ] || kill $pids 2>/dev/null || true
  done
  [ ${#netns_created[@]} -eq 0 ] || sleep 0.5
  for ns in "${netns_created[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

netns_add() {
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; then
    echo "$me: namespace $1 already exists (another run? remove it with: ip netns del $1)" >&2
    exit 1
  fi
  if ! ip netns add "$1" 2>/dev/null; then
    [ ${#netns_created[@]} -eq 0 ] &&
      netns_skip "cannot create network namespaces here ('ip netns add' failed: no CAP_SYS_ADMIN or no netns support)"
    echo "$me: 'ip netns add $1' failed" >&2
    exit 1
  fi
  netns_created+=("$1")
  ip -n "$1" link set lo up
}

rate_bytes() {
  "$python" - "$1" "$me" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)(bit|bps)", sys.argv[1].lower())
if not m:
    sys.exit("%s: rate '%s' is not like 1gbit or 300mbit" % (sys.argv[2], sys.argv[1]))
v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
print(int(v / 8 if m.group(3) == "bit" else v))
EOF
}

tbf_args() {
  local b
  b=$(rate_bytes "$1") || return 1
  echo "rate $1 burst $(( b / 500 > 131072 ? b / 500 : 131072 )) latency 100ms"
}

add_tbf() {
  local args
  [ "$3" = none ] && return 0
  args=$(tbf_args "$3") || return 1
  read -ra args <<<"$args"
  ip netns exec "$1" tc qdisc add dev "$2" root tbf "${args[@]}"
}

# plug_rack_port NS PORT IP RATE: NS's eth0 (IP) on $sw's bridge through port
# PORT, the link shaped to RATE both ways (eth0's egress in NS, PORT's egress
# on the switch).
plug_rack_port() {
  ip link add "rkn$$" netns "$1" type veth peer name "rks$$" netns "$sw"
  ip -n "$1" link set "rkn$$" name eth0
  ip -n "$sw" link set "rks$$" name "$2"
  ip -n "$1" addr add "$3/24" dev eth0
  ip -n "$1" link set eth0 up
  ip -n "$sw" link set "$2" master br0
  ip -n "$sw" link set "$2" up
  add_tbf "$1" eth0 "$4" || netns_skip "tc cannot attach a tbf qdisc here (sch_tbf missing from the kernel?)"
  add_tbf "$sw" "$2" "$4"
}

netns_rack() {
  local w
  sw="${1}sw" hubns="${1}hub0"
  netns_add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" addr add 10.79.0.254/24 dev br0
  ip -n "$sw" link set br0 up
  netns_add "$hubns"
  plug_rack_port "$hubns" hub0 10.79.0.1 "$4"
  for w in $(seq 0 $(($2 - 1))); do
    netns_add "${1}w$w"
    plug_rack_port "${1}w$w" "w$w" "10.79.0.$((11 + w))" "$3"
  done
}

# A namespace other than the host's may only choose an algorithm the host
# lists in net.ipv4.tcp_allowed_congestion_control: CC is added to that list
# while the namespaces take it, then the list is put back (under a lock, so
# that two benchmarks starting at once do not undo each other's addition;
# netns_cleanup puts it back too if the script is interrupted meanwhile).
# Where the host's list cannot be changed, every namespace keeps what it
# inherited, with a warning (the scripts print what is in use).
netns_cc_sys=/proc/sys/net/ipv4
netns_cc_restore=""

netns_congestion() {
  local cc=$1 ns allowed ok=1 lock=/run done_ns=() host_cc
  [ "$cc" = host ] && return 0
  if ! grep -qw -- "$cc" "$netns_cc_sys/tcp_available_congestion_control"; then
    modprobe "tcp_$cc" 2>/dev/null || true
    grep -qw -- "$cc" "$netns_cc_sys/tcp_available_congestion_control" || {
      echo "$me: congestion control '$cc' is not available here ($netns_cc_sys/tcp_available_congestion_control: $(cat "$netns_cc_sys/tcp_available_congestion_control"))" >&2
      exit 2
    }
  fi
  [ -w "$lock" ] || lock=${TMPDIR:-/tmp}
  exec 9>>"$lock/rackhub-netns-congestion.lock"
  flock 9
  allowed=$(cat "$netns_cc_sys/tcp_allowed_congestion_control")
  host_cc=$(cat "$netns_cc_sys/tcp_congestion_control")
  if ! grep -qw -- "$cc" <<<"$allowed"; then
    netns_cc_restore=$allowed
    echo "$allowed $cc" 2>/dev/null >"$netns_cc_sys/tcp_allowed_congestion_control" || ok=0
  fi
  if [ $ok = 1 ]; then
    for ns in "${netns_created[@]}"; do
      if ip netns exec "$ns" sh -c "echo $cc > $netns_cc_sys/tcp_congestion_control" 2>/dev/null; then
        done_ns+=("$ns")
      else
        ok=0
        break
      fi
    done
  fi
  if [ $ok = 0 ]; then  # all or none: back to what they inherited
    for ns in "${done_ns[@]}"; do
      ip netns exec "$ns" sh -c "echo $host_cc > $netns_cc_sys/tcp_congestion_control" 2>/dev/null || true
    done
  fi
  netns_cc_put_back
  flock -u 9
  exec 9>&-
  [ $ok = 1 ] ||
    echo "$me: WARNING: cannot set congestion control '$cc' in the namespaces; they keep the host's" >&2
}

# Puts the host's allowed list back if netns_congestion changed it.
netns_cc_put_back() {
  [ -n "$netns_cc_restore" ] || return 0
  echo "$netns_cc_restore" 2>/dev/null >"$netns_cc_sys/tcp_allowed_congestion_control" ||
    echo "$me: WARNING: could not restore the host's net.ipv4.tcp_allowed_congestion_control to '$netns_cc_restore'" >&2
  netns_cc_restore=""
}

cpu_sample() { awk '/^cpu /{ idle = $5 + $6; total = 0; for (i = 2; i <= NF; i++) total += $i; print idle, total }' /proc/stat; }
