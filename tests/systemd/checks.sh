#!/bin/bash
# tests/systemd/checks.sh BUILD_DIR [DEB]
#
# Runs inside the throwaway VM booted with systemd as PID 1 (tests/systemd/
# run.sh), as root, in the repository. Installs rackhub, then checks the
# rackhubd unit under the real systemd:
#   install   DEB with dpkg -i when given; otherwise (loudly) the install tree:
#             `cmake --install BUILD_DIR --prefix /usr` when the build has
#             install rules, else BUILD_DIR/bin + deploy/ copied by hand
#   ready     `systemctl start` returns after READY=1: the unit is active and
#             rackhubctl answers at once, with no retry
#   stop      with a tenant and a key: `systemctl stop` drains, rackhubd exits
#             0 within TimeoutStopSec; they are still there after a start
#   config    a broken config fails the start (rackhubd exits 78), and the
#             unit is not restarted (RestartPreventExitStatus=78)
#   watchdog  one lane thread frozen (freeze_thread.c, ptrace): rackhubd stops
#             feeding the watchdog, systemd aborts it (Result=watchdog) and
#             restarts it, with the tenant and key still there
#   security  `systemd-analyze security rackhubd`, printed between the lines
#             RACKHUB_SECURITY_BEGIN and RACKHUB_SECURITY_END; its overall
#             exposure must not exceed RACKHUB_MAX_EXPOSURE (default below,
#             the bound; README.md and docs/running.md state the measured
#             score, 2.2)
# Every check prints what it verified ("ok: ...") or why it failed
# ("FAIL: ..."). Exit status: 0 every check passed; 1 a check failed (the
# first failure ends the run, with rackhubd's journal); 2 usage error.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [DEB]" >&2; exit 2; }
build=$1
deb=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
max_exposure=${RACKHUB_MAX_EXPOSURE:-2.5}
config=/etc/rackhub/rackhubd.toml
tenant=systemd-check
key=weights

# Each line starts with the VM's uptime in seconds (the stage's timing).
up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "[$(up)] $*"; }
ok() { say "ok: $*"; }
journal_tail() {
  echo "---- journalctl -u rackhubd (last 40 lines)"
  journalctl -u rackhubd --no-pager -n 40 -o short-monotonic
}
# fail: the checks after this one cannot run. fail_on: they still can; the
# run goes on and exits 1 at the end.
fail() { say "FAIL: $*"; journal_tail; exit 1; }
failed_checks=()
fail_on() { say "FAIL: $*"; journal_tail; failed_checks+=("$1"); }
# props NAME...: one `systemctl show` (each call costs seconds under TCG);
# sets P_NAME for each property.
props() {
  local k v
  while IFS='=' read -r k v; do printf -v "P_$k" '%s' "$v"; done \
    < <(systemctl show rackhubd -p "$(IFS=,; echo "$*")")
}
ctl() { rackhubctl --timeout 20 "$@"; }
# wait_for SECONDS CMD...: true as soon as CMD succeeds, false after SECONDS
wait_for() {
  local end=$((SECONDS + $1))
  shift
  until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.5; done
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

say "== systemd $(systemctl --version | head -1 | cut -d' ' -f2) as PID 1: $(systemd-analyze time 2>/dev/null | head -1)"

# ------------------------------------------------------------------ install
if [ -n "$deb" ]; then
  say "== install: dpkg -i $deb"
  # man-db's trigger would rebuild the whole man index, minutes under TCG
  rm -f /var/lib/man-db/auto-update
  DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" | grep -v '^(Reading database' \
    || fail "dpkg -i $deb failed"
  ok "the .deb installed: $(dpkg-query -W -f='${Package} ${Version}' rackhub 2>/dev/null)"
elif grep -qs rackhubd "$build"/cmake_install.cmake "$build"/*/cmake_install.cmake; then
  say "== install: NO .deb in $build; FALLING BACK to the install tree (cmake --install --prefix /usr)"
  cmake --install "$build" --prefix /usr >/dev/null || fail "cmake --install $build failed"
  ok "the install tree installed under /usr"
else
  say "== install: NO .deb and NO install rules in $build; FALLING BACK to copying $build/bin and deploy/"
  # (both link rackhub statically: librackhub.so is for trainers)
  install -m 755 "$build/bin/rackhubd" "$build/bin/rackhubctl" /usr/bin/
  install -D -m 644 "$repo/deploy/rackhubd.toml" "$config"
  sed 's#/usr/local/bin/rackhubd#/usr/bin/rackhubd#g' "$repo/deploy/rackhubd.service" \
    > /etc/systemd/system/rackhubd.service
  ok "copied the binaries to /usr/bin and the unit to /etc/systemd/system"
fi
# The state starts empty: the VM sees the host's /var/lib, where a rackhubd
# may have run (systemd would also fail to move a plain /var/lib/rackhub to
# /var/lib/private/rackhub for DynamicUser: EXDEV across the overlay's layers).
rm -rf /var/lib/rackhub /var/lib/private/rackhub
# A drop-in for the VM, two additions to the unit as installed:
# - TimeoutStartSec: under TCG on a busy host the start takes
#   up to ~20 s (loading gRPC's libraries is emulated), past the unit's
#   30 s. The start timeout is not what is checked here.
# - ExecStopPost (privileged, '+') appends how each run of rackhubd ended:
#   systemd forgets an inactive unit's exit status (the unit is unloaded), so
#   `systemctl show` after a clean stop cannot tell exit 0 from anything else.
mkdir -p /run/systemd/system/rackhubd.service.d
cat > /run/systemd/system/rackhubd.service.d/vm-checks.conf <<'EOF'
[Service]
TimeoutStartSec=300s
ExecStopPost=+/bin/sh -c 'echo "$SERVICE_RESULT $EXIT_CODE $EXIT_STATUS" >> /run/rackhubd-exits'
EOF
last_exit() { tail -n 1 /run/rackhubd-exits 2>/dev/null; }
systemctl daemon-reload
props FragmentPath ExecStart Type WatchdogUSec TimeoutStopUSec Restart RestartPreventExitStatus ActiveEnterTimestamp
[ -n "$P_FragmentPath" ] || fail "systemd does not know rackhubd.service after the install"
[ -s "$config" ] || fail "$config was not installed"
command -v rackhubctl >/dev/null || fail "rackhubctl is not on PATH after the install"
ok "unit $P_FragmentPath ($(grep -o 'path=[^ ;]*' <<<"$P_ExecStart")), config $config, $(command -v rackhubctl)"
[ "$P_Type" = notify ] || fail "Type is '$P_Type', not notify"
ok "Type=notify, WatchdogUSec=$P_WatchdogUSec, TimeoutStopUSec=$P_TimeoutStopUSec, Restart=$P_Restart, RestartPreventExitStatus=$P_RestartPreventExitStatus"
[ -z "$P_ActiveEnterTimestamp" ] || fail "rackhubd was started by the install (should not be here)"

# ------------------------------------------------------------------ ready
say "== ready: systemctl start returns only after READY=1"
t=$(now)
systemctl start rackhubd || fail "systemctl start rackhubd failed"
echo "   systemctl start returned after $(elapsed "$t") s"
props ActiveState StatusText ExecMainStartTimestampMonotonic ActiveEnterTimestampMonotonic WatchdogUSec
[ "$P_ActiveState" = active ] || fail "not active right after start: $P_ActiveState"
[[ "$P_StatusText" == serving:* ]] || fail "StatusText is '$P_StatusText', not the 'serving: ...' sent with READY=1"
ctl tenant list >/dev/null || fail "rackhubctl did not answer right after systemctl start returned (exit $?)"
[ "$P_ActiveEnterTimestampMonotonic" -gt "$P_ExecMainStartTimestampMonotonic" ] \
  || fail "active ($P_ActiveEnterTimestampMonotonic us) not after exec ($P_ExecMainStartTimestampMonotonic us)"
ok "active with StatusText '$P_StatusText' (sent with READY=1), $(( (P_ActiveEnterTimestampMonotonic - P_ExecMainStartTimestampMonotonic) / 1000 )) ms after exec; WatchdogUSec=$P_WatchdogUSec; rackhubctl answered on the first try"

# ------------------------------------------------------------------ stop
say "== stop: drains and exits 0 within TimeoutStopSec"
ctl tenant create "$tenant" --workers 1 >/dev/null || fail "tenant create failed"
ctl key create "$tenant" "$key" --elements 4096 >/dev/null || fail "key create failed"
ok "created tenant $tenant and key $key"
props MainPID
pid=$P_MainPID
timeout_s=$(awk '/^[0-9]+s$/ { print $1 + 0 }' <<<"$P_TimeoutStopUSec")
[ -n "$timeout_s" ] || fail "cannot read TimeoutStopUSec '$P_TimeoutStopUSec'"
t=$(now)
systemctl stop rackhubd || fail "systemctl stop failed"
took=$(elapsed "$t")
[ "$(last_exit)" = "success exited 0" ] \
  || fail "rackhubd ($pid) ended as '$(last_exit)' (SERVICE_RESULT EXIT_CODE EXIT_STATUS; want 'success exited 0')"
awk -v s="$took" -v l="$timeout_s" 'BEGIN { exit !(s < l) }' || fail "stop took $took s, not within TimeoutStopSec ($timeout_s s)"
journalctl -u rackhubd -o cat --no-pager | grep -q "draining" || fail "no 'draining' line from rackhubd in the journal"
ok "rackhubd ($pid) drained and exited 0 in $took s (TimeoutStopSec ${timeout_s}s): '$(last_exit)'"

# ------------------------------------------------------------------ config
say "== config: a broken config fails the start with 78, no restart loop"
cp "$config" /tmp/rackhubd.toml.good
sed -i 's/^log_level = .*/log_level = "loud"/' "$config"
grep -q '^log_level = "loud"' "$config" || fail "could not break $config"
if systemctl start rackhubd; then fail "systemctl start succeeded with log_level = \"loud\""; fi
[[ "$(last_exit)" == *" exited 78" ]] \
  || fail "rackhubd did not exit 78 on a bad config: '$(last_exit)' (SERVICE_RESULT EXIT_CODE EXIT_STATUS)"
journalctl -u rackhubd -o cat --no-pager | grep -q 'log_level' || fail "the journal does not name the bad field log_level"
sleep 6  # RestartSec=2s: a restart would have begun by now
props ActiveState NRestarts Result
if [ "$P_ActiveState" = failed ] && [ "$P_NRestarts" = 0 ]; then
  ok "start failed: rackhubd exited 78 naming log_level, Result=$P_Result; 6 s later still failed, NRestarts=0"
else
  # systemd applies RestartPreventExitStatus= to the main process only
  # (systemd.service(5); systemd issue #11868): the unit must not add a
  # failing ExecStartPre=.
  fail_on config "6 s after the failed start: ActiveState=$P_ActiveState NRestarts=$P_NRestarts" \
    "(want failed, 0): a restart loop. RestartPreventExitStatus=78 does not cover ExecStartPre=;" \
    "the unit must leave the config check to ExecStart (which exits 78 too) or ignore ExecStartPre's status ('-')"
  systemctl stop rackhubd
fi
cp /tmp/rackhubd.toml.good "$config"
systemctl reset-failed rackhubd
systemctl start rackhubd || fail "systemctl start failed with the config restored"
ctl tenant get "$tenant" >/dev/null || fail "tenant $tenant is gone after stop + start"
ctl key get "$tenant" "$key" >/dev/null || fail "key $key is gone after stop + start"
ok "config restored: started again, tenant $tenant and key $key survived the stop"

# ------------------------------------------------------------------ watchdog
say "== watchdog: a frozen lane thread gets rackhubd aborted and restarted"
freeze=${FREEZE_THREAD:-}
if [ -z "$freeze" ]; then
  freeze=/tmp/freeze_thread
  cc -O2 -Wall -Werror -o "$freeze" "$here/freeze_thread.c" || fail "cannot compile freeze_thread.c"
fi
props MainPID NRestarts
pid=$P_MainPID
restarts=$P_NRestarts
grep -h . /proc/"$pid"/task/*/comm | grep -q '^rackhub-lane0' || fail "rackhubd ($pid) has no thread rackhub-lane0*"
since=$(date +%s)
t=$(now)
timeout 150 "$freeze" "$pid" rackhub-lane0 > /tmp/freeze.out 2>&1 &
freezer=$!
wait_for 10 grep -q '^frozen' /tmp/freeze.out || fail "freeze_thread did not stop lane 0: $(cat /tmp/freeze.out)"
tid=$(awk '/^frozen/ { print $2 }' /tmp/freeze.out)
[ "$(awk '{ print $3 }' /proc/"$pid"/task/"$tid"/stat)" = t ] || fail "thread $tid is not in tracing stop"
[ "$(awk '{ print $3 }' /proc/"$pid"/stat)" != t ] || fail "the main thread of rackhubd stopped too"
ok "froze thread $tid ($(cat /proc/"$pid"/task/"$tid"/comm)) of rackhubd ($pid) (state t); its main thread runs on"
restarted() {
  props NRestarts ActiveState MainPID
  [ "$P_NRestarts" -gt "$restarts" ] && [ "$P_ActiveState" = active ] && [ "$P_MainPID" != "$pid" ]
}
wait_for 150 restarted || fail "no restart within 150 s of the freeze (ActiveState=$P_ActiveState, NRestarts=$P_NRestarts)"
took=$(elapsed "$t")
wait "$freezer"; freeze_rc=$?
log=$(journalctl -u rackhubd -o cat --no-pager --since "@$since")
grep -q "a lane stopped ticking" <<<"$log" || fail "rackhubd did not log that a lane stopped ticking"
grep -q "Watchdog timeout" <<<"$log" || fail "systemd logged no watchdog timeout"
grep -q "Failed with result 'watchdog'" <<<"$log" || fail "the unit did not fail with result 'watchdog'"
grep -Eq "code=(dumped|killed), status=6/ABRT" <<<"$log" || fail "rackhubd ($pid) was not ended by SIGABRT"
grep -Eq "^watchdog (dumped|killed) ABRT$" /run/rackhubd-exits \
  || fail "no 'watchdog dumped|killed ABRT' end in ExecStopPost's record: $(tr '\n' ';' < /run/rackhubd-exits)"
[ "$freeze_rc" = 0 ] || fail "freeze_thread exited $freeze_rc: $(cat /tmp/freeze.out)"
ok "rackhubd ($pid) withheld the watchdog, was aborted (SIGABRT, Result=watchdog) and restarted as $P_MainPID (NRestarts=$P_NRestarts) $took s after the freeze; freeze_thread: $(tail -1 /tmp/freeze.out)"
ctl tenant list | grep -q "$tenant" || fail "tenant $tenant missing from 'tenant list' after the watchdog restart"
ctl key get "$tenant" "$key" | grep -q "$key" || fail "key $key missing after the watchdog restart"
ok "after the watchdog restart: tenant $tenant and key $key are there"
systemctl stop rackhubd
[ "$(last_exit)" = "success exited 0" ] || fail "the restarted rackhubd ended as '$(last_exit)' on stop"
ok "the restarted rackhubd stopped with exit 0"

# ------------------------------------------------------------------ security
say "== security: systemd-analyze security rackhubd"
echo RACKHUB_SECURITY_BEGIN
systemd-analyze security --no-pager rackhubd.service | tee /tmp/security.txt
echo RACKHUB_SECURITY_END
score=$(sed -n 's/.*Overall exposure level for rackhubd.service: \([0-9.]*\).*/\1/p' /tmp/security.txt)
[ -n "$score" ] || fail "no overall exposure level in the systemd-analyze output"
awk -v s="$score" -v m="$max_exposure" 'BEGIN { exit !(s <= m) }' \
  || fail "overall exposure $score is above $max_exposure (README.md and docs/running.md state the unit's score: update the unit or them)"
ok "overall exposure $score (at most $max_exposure): $(grep -o 'Overall exposure level.*' /tmp/security.txt)"
if [ ${#failed_checks[@]} -gt 0 ]; then
  say "FAILED checks: ${failed_checks[*]} (see FAIL above)"
  exit 1
fi
echo "RACKHUB_SYSTEMD_CHECKS_PASSED"
