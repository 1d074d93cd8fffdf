#!/bin/bash
# tests/install/install_test.sh BUILD_DIR SOURCE_DIR   (CTest: install_test)
#
# `cmake --install BUILD_DIR --prefix /usr` into a scratch DESTDIR, then checks
# the installed tree as a user of it would see it:
#   tree     every file where docs/packaging.md says (binaries, unit, config,
#            headers, librackhub.so.0 with its SONAME, CMake package, rackhub.pc,
#            man pages, Python package); the unit's ExecStart is /usr/bin/rackhubd
#            with /etc/rackhub/rackhubd.toml; no installed header includes a
#            non-public header; librackhub.so exports only the public API; no
#            installed program has a RUNPATH into the build tree
#   consume  the out-of-tree consumer/ built with find_package(rackhub) and,
#            separately, with pkg-config and the compiler alone, each run
#            against a real rackhubd started from the installed tree (push,
#            pull, values checked); the Python package imported from the tree
#            does the same; the installed rackhub-run launcher finds it
# Exit 0: every check passed; 1: a check failed (the message says which).
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/rackhub-install-test.XXXXXX)
# shellcheck source=lib.sh
. "$src/tests/install/lib.sh"
trap 'stop_hub; rm -rf "$work"' EXIT

dest=$work/root
usr=$dest/usr
DESTDIR=$dest cmake --install "$build" --prefix /usr > "$work/install.log" 2>&1 \
  || { cat "$work/install.log"; fail "cmake --install $build failed"; }
ok "cmake --install $build --prefix /usr with DESTDIR=$dest"

# ------------------------------------------------------------------ tree
so=$(find "$usr" -name librackhub.so.0 -print -quit)
[ -n "$so" ] || fail "no librackhub.so.0 under $usr"
libdir=$(dirname "$so")
for f in "$usr/bin/rackhubd" "$usr/bin/rackhubctl" "$usr/bin/rackhub-run"; do
  [ -x "$f" ] || fail "$f is missing or not executable"
done
for f in "$libdir/librackhub.so" "$libdir/librackhub.so.0.1.0" \
    "$usr/include/rackhub/client/client.h" "$usr/include/rackhub/client/rackhub_c.h" \
    "$libdir/cmake/rackhub/rackhubConfig.cmake" "$libdir/cmake/rackhub/rackhubConfigVersion.cmake" \
    "$libdir/cmake/rackhub/rackhubTargets.cmake" "$libdir/pkgconfig/rackhub.pc" \
    "$usr/share/man/man8/rackhubd.8" "$usr/share/man/man1/rackhubctl.1" \
    "$usr/lib/systemd/system/rackhubd.service" "$dest/etc/rackhub/rackhubd.toml"; do
  [ -e "$f" ] || fail "$f was not installed"
done
[ "$(readlink "$libdir/librackhub.so")" = librackhub.so.0 ] || fail "librackhub.so is not a link to .so.0"
[ "$(readlink "$libdir/librackhub.so.0")" = librackhub.so.0.1.0 ] || fail "librackhub.so.0 is not a link to .so.0.1.0"
readelf -d "$so" | grep -q 'Library soname: \[librackhub.so.0\]' || fail "$so has no SONAME librackhub.so.0"
[ ! -e "$usr/include/rackhub/client/testing.h" ] || fail "the test seam testing.h was installed"
[ ! -e "$usr/include/rackhub/net" ] || fail "net/ headers were installed"
cmp -s "$dest/etc/rackhub/rackhubd.toml" "$src/deploy/rackhubd.toml" \
  || fail "/etc/rackhub/rackhubd.toml differs from deploy/rackhubd.toml"
ok "tree: binaries, $libdir/librackhub.so.0.1.0 (SONAME librackhub.so.0), headers, CMake package, rackhub.pc, man pages, unit, config"

unit=$usr/lib/systemd/system/rackhubd.service
grep -qx 'ExecStart=/usr/bin/rackhubd --config /etc/rackhub/rackhubd.toml' "$unit" \
  || fail "$unit: ExecStart is '$(grep '^ExecStart=' "$unit")'"
! grep -q '^ExecStartPre=' "$unit" \
  || fail "$unit: has an ExecStartPre= (its failure would bypass RestartPreventExitStatus=78)"
! grep -q /usr/local "$unit" || fail "$unit still names /usr/local"
# Everything but the rewritten paths and the leading comment is deploy/rackhubd.service.
diff <(sed -n '/^\[Unit\]/,$p' "$src/deploy/rackhubd.service" | sed 's#/usr/local/bin/rackhubd #/usr/bin/rackhubd #') \
     <(sed -n '/^\[Unit\]/,$p' "$unit") || fail "$unit differs from deploy/rackhubd.service beyond ExecStart*"
ok "unit: ExecStart=/usr/bin/rackhubd --config /etc/rackhub/rackhubd.toml"

# Installed headers include only standard headers and each other.
bad=$(grep -h '^#include' "$usr"/include/rackhub/client/*.h | grep -v '^#include <[a-z_./]*>$' \
      | grep -v '^#include "rackhub/client/' || true)
[ -z "$bad" ] || fail "installed headers include non-public headers: $bad"
# librackhub.so exports the C ABI and rackhub::client's public API only.
exported=$(nm -DC --defined-only "$so" | awk '{ $1 = ""; $2 = ""; sub(/^ +/, ""); print }')
leaked=$(grep -v -e '^rackhub_' -e '^rackhub::client::' <<< "$exported" || true)
[ -z "$leaked" ] || fail "librackhub.so exports more than its API: $(head -5 <<< "$leaked")"
internals=$(grep -e '^rackhub::client::Client::Impl::' -e '^rackhub::client::internal::' <<< "$exported" || true)
[ -z "$internals" ] || fail "librackhub.so exports internals: $(head -3 <<< "$internals")"
grep -q '^rackhub::client::Client::Connect' <<< "$exported" || fail "librackhub.so does not export Client::Connect"
grep -q '^rackhub_push_pull$' <<< "$exported" || fail "librackhub.so does not export rackhub_push_pull"
ok "headers are self-contained; librackhub.so exports $(wc -l <<< "$exported") public symbols only"

for f in "$usr/bin/rackhubd" "$usr/bin/rackhubctl" "$so" \
    $(find "$usr/lib/python3/dist-packages/rackhub" -name '_core*.so'); do
  rp=$(readelf -d "$f" | grep -E 'RUNPATH|RPATH' || true)
  [[ "$rp" != *"$build"* ]] || fail "$f has a RUNPATH into the build tree: $rp"
done
"$usr/bin/rackhubd" --version | grep -q '^rackhubd 0.1.0' || fail "installed rackhubd --version"
"$usr/bin/rackhubctl" --version > /dev/null || fail "installed rackhubctl --version"
ok "installed binaries run and have no RUNPATH into $build"

if command -v groff > /dev/null; then
  for m in "$usr/share/man/man8/rackhubd.8" "$usr/share/man/man1/rackhubctl.1"; do
    warnings=$(LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$m" 2>&1)
    [ -z "$warnings" ] || fail "groff warns about $m: $warnings"
  done
  ok "man pages format without groff warnings"
fi

# ------------------------------------------------------------------ consume
start_hub "$usr/bin"

cmake -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$usr" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF > "$work/consumer.log" 2>&1 \
  || { cat "$work/consumer.log"; fail "the consumer does not configure with find_package(rackhub)"; }
grep -q "rackhub 0.1.0 from $libdir/cmake/rackhub" "$work/consumer.log" \
  || fail "find_package found another rackhub: $(grep rackhub_consumer "$work/consumer.log")"
cmake --build "$work/consumer" > "$work/consumer-build.log" 2>&1 \
  || { cat "$work/consumer-build.log"; fail "the consumer does not build against rackhub::client"; }
expect_lib_from "$work/consumer/consumer_cxx" "$libdir"
run_consumer "$usr/bin" "$work/consumer/consumer_cxx"
ok "find_package(rackhub) consumer (C++ API) built against $libdir and ran against the hub"

build_with_pkg_config "$libdir/pkgconfig" "$work/pc"
for exe in "$work/pc/consumer_c" "$work/pc/consumer_cxx"; do
  expect_lib_from "$exe" "$libdir" LD_LIBRARY_PATH="$libdir"
  run_consumer "$usr/bin" "$exe" LD_LIBRARY_PATH="$libdir"
done
ok "pkg-config consumers (C ABI, C++ API) ran against the hub"

pydir=$usr/lib/python3/dist-packages
token=$(create_tenant "$usr/bin" python-consumer)
PYTHONPATH=$pydir /usr/bin/python3 - "$data" "$token" "$pydir" <<'PY' || fail "the installed Python package failed"
import array, sys
hub, token, pydir = sys.argv[1:]
import rackhub
assert rackhub.__file__.startswith(pydir), f"imported {rackhub.__file__}, not from {pydir}"
c = rackhub.Client(hub, "python-consumer", token, 0, op_timeout=20.0)
key = c.declare_key("consumer-py", 4, optimizer={"type": "sgd", "lr": 0.5})
grad = array.array("f", [2, -2, 4, 0])  # any buffer of float32
out = array.array("f", [0] * 4)
c.wait(c.push_pull(key, grad, out))
assert list(out) == [-1.0, 1.0, -2.0, 0.0], list(out)
c.close()
print("python: ok")
PY
PYTHONPATH= "$usr/bin/rackhub-run" --help > "$work/run-help.txt" 2>&1 \
  || { cat "$work/run-help.txt"; fail "the installed rackhub-run does not find its package"; }
ok "the Python package from $pydir pushed and pulled; rackhub-run --help works"
echo "install_test: every check passed"
