# Shared by install_test.sh and deb_test.sh (sourced): a real rackhubd from an
# installed tree on ephemeral loopback ports, tenants made with that tree's
# rackhubctl, and the out-of-tree consumers of consumer/ built against it.
# Every helper fails the test (exit 1) with a message saying what went wrong.
# Callers set: work (a scratch directory removed at exit), src (the source tree).

fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

hub_pid=""
stop_hub() {
  if [ -n "$hub_pid" ] && kill -0 "$hub_pid" 2>/dev/null; then
    kill -TERM "$hub_pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$hub_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$hub_pid" 2>/dev/null
    wait "$hub_pid" 2>/dev/null
  fi
  hub_pid=""
}

# start_hub BINDIR: rackhubd --in-memory from BINDIR; sets admin, data, admin_token.
start_hub() {
  local bin=$1 ready=$work/hub.ready
  admin_token=$work/admin.token
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$admin_token"
  rm -f "$ready"
  # Every port from the kernel: install_test and deb_test run at once under
  # `ctest -j` (the default metrics port 7704 made one of them fail).
  "$bin/rackhubd" --in-memory --admin-listen 127.0.0.1:0 --data-listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --transport tcp --lanes 2 --no-pin-lanes --admin-token-file "$admin_token" \
    --ready-file "$ready" > "$work/rackhubd.log" 2>&1 &
  hub_pid=$!
  for _ in $(seq 200); do
    if [ -f "$ready" ] && grep -q '^data ' "$ready" && grep -q '^admin ' "$ready"; then
      admin=$(awk '$1 == "admin" { print $2 }' "$ready")
      data=$(awk '$1 == "data" { print $2 }' "$ready")
      ok "rackhubd from $bin serves admin $admin, data $data"
      return 0
    fi
    kill -0 "$hub_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$work/rackhubd.log" >&2
  fail "rackhubd from $bin did not start"
}

# create_tenant BINDIR NAME: a one-worker tenant; prints its data-plane token.
create_tenant() {
  local out
  out=$("$1/rackhubctl" --admin "$admin" --token-file "$admin_token" --json \
    tenant create "$2" --workers 1) || fail "rackhubctl tenant create $2 failed"
  /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])' <<< "$out" \
    || fail "no token in: $out"
}

# run_consumer BINDIR EXE [ENV=VALUE...]: runs EXE as rank 0 of a new tenant.
run_consumer() {
  local bin=$1 exe=$2 name token
  shift 2
  name=$(basename "$exe" | tr '_' '-')-$RANDOM
  token=$(create_tenant "$bin" "$name")
  env "$@" "$exe" "$data" "$name" "$token" || fail "$exe against the hub failed"
}

# expect_lib_from EXE DIR [ENV=VALUE...]: EXE loads librackhub.so.0 from DIR.
expect_lib_from() {
  local exe=$1 dir=$2 got
  shift 2
  got=$(env "$@" ldd "$exe" | awk '$1 == "librackhub.so.0" { print $3 }')
  [ "$(dirname "$got")" = "$dir" ] \
    || fail "$exe loads librackhub.so.0 from '$got', not from $dir"
}

# build_with_pkg_config PCDIR OUTDIR: compiles consumer.c (C11) and
# consumer.cc (C++20) with the compiler and `pkg-config --cflags --libs rackhub`
# only, PKG_CONFIG_LIBDIR limited to PCDIR (nothing else is found).
build_with_pkg_config() {
  local pc=$1 out=$2 flags
  mkdir -p "$out"
  flags=$(PKG_CONFIG_LIBDIR="$pc" PKG_CONFIG_PATH= pkg-config --cflags --libs rackhub) \
    || fail "pkg-config does not find rackhub in $pc"
  [ "$(PKG_CONFIG_LIBDIR="$pc" PKG_CONFIG_PATH= pkg-config --modversion rackhub)" = 0.1.0 ] \
    || fail "rackhub.pc has another version"
  # shellcheck disable=SC2086  # flags are words
  cc -std=c11 -Wall -Wextra -Werror "$src/tests/install/consumer/consumer.c" $flags \
    -o "$out/consumer_c" || fail "consumer.c does not build with pkg-config flags '$flags'"
  # shellcheck disable=SC2086
  c++ -std=c++20 -Wall -Wextra -Werror "$src/tests/install/consumer/consumer.cc" $flags \
    -o "$out/consumer_cxx" || fail "consumer.cc does not build with pkg-config flags '$flags'"
  ok "consumer.c and consumer.cc built with: $flags"
}
