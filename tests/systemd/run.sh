#!/usr/bin/env bash
# tests/systemd/run.sh [BUILD_DIR]
#
# Checks the rackhubd systemd unit under a real systemd: boots a throwaway
# QEMU VM (tests/rdma/rxe-vm.sh with RXE_VM_INIT=systemd: Debian's kernel,
# this host's root filesystem read-only with a tmpfs overlay, systemd as
# PID 1) that installs rackhub and runs tests/systemd/checks.sh (start after
# READY, stop exits 0, a broken config exits 78 without a restart loop, a
# frozen lane makes the watchdog restart the daemon with its state,
# `systemd-analyze security`).
#
# Input: BUILD_DIR (default build/) from the release stage. What is installed
# in the VM, in this order: the newest BUILD_DIR/rackhub_*.deb (made first
# with `cpack -G DEB` in BUILD_DIR when the build has a CPack configuration
# and install rules for rackhubd, and the .deb is missing or older than
# bin/rackhubd); otherwise, said loudly,
# the install tree (see checks.sh).
# Output: the checks' lines; BUILD_DIR/systemd-security.txt (the
# `systemd-analyze security rackhubd` table).
# Env: RXE_VM_TIMEOUT (s, default 420), RACKHUB_REQUIRE_SYSTEMD_VM=1 (a skip
# fails), RXE_VM_DEBUG=1 (guest console and timings).
# Exit status: 0 every check passed, or SKIPPED (printed as
# "SYSTEMD VM TESTS SKIPPED: <reason>") when the VM cannot be set up or boot;
# 1 a check failed or BUILD_DIR has no rackhubd; 124 the VM timed out.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)

skip() {
  echo "=================================================================="
  echo "SYSTEMD VM TESTS SKIPPED: $*"
  echo "=================================================================="
  [ "${RACKHUB_REQUIRE_SYSTEMD_VM:-0}" = 1 ] && exit 1
  exit 0
}

[ -x "$build/bin/rackhubd" ] && [ -x "$build/bin/rackhubctl" ] \
  || { echo "systemd: no rackhubd/rackhubctl in $build/bin: run the release stage first" >&2; exit 1; }
[ -x /lib/systemd/systemd ] || skip "this host has no /lib/systemd/systemd (the VM boots the host's root filesystem)"
if ! command -v qemu-system-x86_64 >/dev/null && [ "$(id -u)" -ne 0 ]; then
  skip "qemu-system-x86 is not installed (the VM harness installs it only as root)"
fi

# The package: made from this build when it can be.
newest_deb() { ls -t "$build"/rackhub_*.deb 2>/dev/null | head -1 || true; }
deb=$(newest_deb)
if [ -f "$build/CPackConfig.cmake" ] && grep -qs rackhubd "$build"/*/cmake_install.cmake \
   && { [ -z "$deb" ] || [ "$deb" -ot "$build/bin/rackhubd" ]; }; then
  echo "systemd: packaging this build: (cd $build && cpack -G DEB)"
  (cd "$build" && cpack -G DEB) || { echo "systemd: cpack -G DEB failed" >&2; exit 1; }
  deb=$(newest_deb)
fi
if [ -n "$deb" ]; then
  echo "systemd: installing $deb in the VM"
else
  echo "=================================================================="
  echo "systemd: NO rackhub_*.deb in $build (no CPack configuration yet):"
  echo "systemd: the VM installs the install tree instead (see checks.sh)"
  echo "=================================================================="
fi

tmp=$(mktemp -d /var/tmp/rackhub-systemd-vm.XXXXXX)  # the guest empties /tmp at boot
trap 'rm -rf "$tmp"' EXIT
# Built here: the guest would compile it under TCG emulation, seconds slower.
cc -O2 -Wall -Werror -o "$tmp/freeze_thread" "$here/freeze_thread.c"
export FREEZE_THREAD=$tmp/freeze_thread
export RXE_VM_INIT=systemd
export RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-420}

cd "$repo"
start=$(date +%s)
set +e
cmd="echo RACKHUB_SYSTEMD_VM_STARTED; $(printf '%q ' "$here/checks.sh" "$build" $deb)"
"$repo/tests/rdma/rxe-vm.sh" "$cmd" 2>&1 | tee "$tmp/log"
rc=${PIPESTATUS[0]}
set -e
if ! grep -q RACKHUB_SYSTEMD_VM_STARTED "$tmp/log"; then
  skip "the VM with systemd as PID 1 could not be set up or did not boot (exit $rc; see the messages above)"
fi
sed -n '/^RACKHUB_SECURITY_BEGIN/,/^RACKHUB_SECURITY_END/p' "$tmp/log" | sed '1d;$d' > "$build/systemd-security.txt"
case $rc in
  0) grep -q RACKHUB_SYSTEMD_CHECKS_PASSED "$tmp/log" || { echo "systemd: checks.sh exited 0 without finishing" >&2; exit 1; }
     echo "systemd: every systemd check passed in the VM ($(( $(date +%s) - start )) s;" \
          "security table in $build/systemd-security.txt)" ;;
  124) echo "systemd: the VM timed out (RXE_VM_TIMEOUT=$RXE_VM_TIMEOUT s)" >&2 ;;
  *) echo "systemd: systemd checks failed in the VM (exit $rc)" >&2 ;;
esac
exit $rc
