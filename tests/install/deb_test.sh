#!/bin/bash
# tests/install/deb_test.sh BUILD_DIR SOURCE_DIR   (CTest: deb_test)
#
# `cpack -G DEB` of BUILD_DIR into a scratch directory, then checks the .deb
# without installing it on this host:
#   control  dpkg-deb -I: package rackhub, the project's version, Depends from
#            dpkg-shlibdeps (libprotobuf, libgrpc++, ...) plus python3 3.11,
#            conffiles = /etc/rackhub/rackhubd.toml, maintainer scripts that
#            only run ldconfig (the unit is installed, not enabled or started)
#   content  dpkg-deb -c: everything under /usr and /etc, nothing under
#            /usr/local; the unit's ExecStart is /usr/bin/rackhubd
#   works    unpacked (dpkg-deb -x): its rackhubd serves a real hub and a
#            program built with pkg-config against the unpacked tree pushes
#            and pulls through its librackhub.so
# Exit 0: every check passed; 1: a check failed.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/rackhub-deb-test.XXXXXX)
# shellcheck source=lib.sh
. "$src/tests/install/lib.sh"
trap 'stop_hub; rm -rf "$work"' EXIT

cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/out" > "$work/cpack.log" 2>&1 \
  || { cat "$work/cpack.log"; fail "cpack -G DEB failed"; }
deb=$(find "$work/out" -maxdepth 1 -name 'rackhub_*.deb' -print -quit)
[ -n "$deb" ] || { cat "$work/cpack.log"; fail "cpack made no rackhub_*.deb"; }
arch=$(dpkg --print-architecture)
[ "$(basename "$deb")" = "rackhub_0.1.0_$arch.deb" ] || fail "the .deb is named $(basename "$deb")"
ok "cpack -G DEB made $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"

# ------------------------------------------------------------------ control
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = rackhub ] || fail "Package is '$(field Package)'"
[ "$(field Version)" = 0.1.0 ] || fail "Version is '$(field Version)'"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture is '$(field Architecture)'"
[ -n "$(field Maintainer)" ] || fail "no Maintainer"
depends=$(field Depends)
for d in libprotobuf32 'libgrpc++1.51' libc6 libstdc++6 libsystemd0 libibverbs1 'python3 (>= 3.11)' 'python3 (<< 3.12)'; do
  [[ "$depends" == *"$d"* ]] || fail "Depends lacks $d: $depends"
done
dpkg-deb -e "$deb" "$work/control"
[ "$(cat "$work/control/conffiles")" = /etc/rackhub/rackhubd.toml ] \
  || fail "conffiles is '$(cat "$work/control/conffiles" 2>/dev/null)'"
# Maintainer scripts: only CPack's ldconfig calls (postinst, postrm); nothing
# enables or starts the unit.
for s in preinst prerm; do
  [ ! -e "$work/control/$s" ] || fail "the .deb has a $s script"
done
for s in postinst postrm; do
  [ -e "$work/control/$s" ] || continue
  other=$(grep -v -e '^#!/bin/sh$' -e '^set -e$' -e '^if \[ "\$1" = "[a-z]*" \]; then$' \
          -e '^[[:space:]]*ldconfig$' -e '^fi$' -e '^$' "$work/control/$s" || true)
  [ -z "$other" ] || fail "the .deb's $s does more than ldconfig: $other"
done
ok "control: Package rackhub 0.1.0, no maintainer script but ldconfig, conffiles /etc/rackhub/rackhubd.toml, Depends: $depends"

# ------------------------------------------------------------------ content
dpkg-deb -c "$deb" | awk '{ print $6 }' > "$work/content"
for f in ./usr/bin/rackhubd ./usr/bin/rackhubctl ./usr/bin/rackhub-run \
    ./usr/lib/systemd/system/rackhubd.service ./etc/rackhub/rackhubd.toml \
    ./usr/include/rackhub/client/client.h ./usr/include/rackhub/client/rackhub_c.h \
    ./usr/share/man/man8/rackhubd.8 ./usr/share/man/man1/rackhubctl.1 \
    ./usr/lib/python3/dist-packages/rackhub/__init__.py \
    ./usr/lib/python3/dist-packages/rackhub/torch/__init__.py \
    ./usr/lib/python3/dist-packages/rackhub/torch/optimizer.py \
    ./usr/lib/python3/dist-packages/rackhub/torch/embedding.py; do
  grep -qx "$f" "$work/content" || fail "the .deb lacks $f"
done
grep -q '/librackhub\.so\.0\.1\.0$' "$work/content" || fail "the .deb lacks librackhub.so.0.1.0"
grep -q '/cmake/rackhub/rackhubConfig\.cmake$' "$work/content" || fail "the .deb lacks rackhubConfig.cmake"
grep -q '/pkgconfig/rackhub\.pc$' "$work/content" || fail "the .deb lacks rackhub.pc"
grep -q '/dist-packages/rackhub/_core\..*\.so$' "$work/content" || fail "the .deb lacks rackhub/_core"
outside=$(grep -v -e '^\./usr/' -e '^\./etc/' -e '^\./$' "$work/content" || true)
[ -z "$outside" ] || fail "the .deb installs outside /usr and /etc: $outside"
! grep -q '^\./usr/local' "$work/content" || fail "the .deb installs into /usr/local"
ok "content: $(wc -l < "$work/content") entries under /usr and /etc"

# ------------------------------------------------------------------ works
root=$work/x
dpkg-deb -x "$deb" "$root"
grep -qx 'ExecStart=/usr/bin/rackhubd --config /etc/rackhub/rackhubd.toml' \
  "$root/usr/lib/systemd/system/rackhubd.service" || fail "the .deb's unit has another ExecStart"
cmp -s "$root/etc/rackhub/rackhubd.toml" "$src/deploy/rackhubd.toml" || fail "the .deb's config differs"
so=$(find "$root/usr" -name librackhub.so.0 -print -quit)
libdir=$(dirname "$so")
start_hub "$root/usr/bin"
build_with_pkg_config "$libdir/pkgconfig" "$work/pc"
expect_lib_from "$work/pc/consumer_c" "$libdir" LD_LIBRARY_PATH="$libdir"
run_consumer "$root/usr/bin" "$work/pc/consumer_c" LD_LIBRARY_PATH="$libdir"
ok "the unpacked .deb's rackhubd and librackhub.so work"
echo "deb_test: every check passed"
