"""rackhub-run --host-discovery-script CMD (Horovod's option): the slot count
an elastic job follows (docs/elastic.md, "Host discovery").

CMD runs through the shell every --discovery-interval seconds; it prints
one line per host, `HOSTNAME:SLOTS` (or `HOSTNAME`, one slot; blank lines
are skipped). As in Horovod, a host named on several lines counts once,
with its last line's slots. The launcher starts local processes only, so
every host must be this machine: localhost, an address of 127.0.0.0/8,
[::1], or this host's name (socket.gethostname(), socket.getfqdn()); the
slots of the distinct names add up. discover() returns that count or an
error text naming the problem (the command failed or timed out, a line that
is not HOSTNAME:SLOTS, a host that is not this one); the supervisor
(elastic_run.py) then logs the error and keeps the job's size. The command
runs in a session of its own: on a timeout its whole process group is
killed, so a hanging script leaves nothing behind.

Thread use: any one thread at a time (the supervisor runs it on a thread
of its own, so a slow script never delays restarts or joins).
"""
import ipaddress
import os
import re
import socket
import signal
import subprocess

_LINE = re.compile(r"^(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9._\-]+)(?::(\d+))?$")


_NAMES = None


def local_names():
    """The names that mean this machine (looked up once: getfqdn() may wait
    for DNS)."""
    global _NAMES
    if _NAMES is None:
        names = {"localhost", "localhost.localdomain", "ip6-localhost"}
        for f in (socket.gethostname, socket.getfqdn):
            try:
                names.add(f().lower())
            except OSError:
                pass
        _NAMES = names
    return _NAMES


def _is_local(host, names):
    h = host.strip("[]").lower()
    if h in names:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def parse(text, names=None):
    """The slot count of the script's output `text`, or (None, problem)."""
    names = local_names() if names is None else names
    slots = {}  # host name -> slots of its last line
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m or (m.group(2) is not None and int(m.group(2)) < 1):
            return None, (f"line {no} {line[:80]!r}: not HOSTNAME:SLOTS (SLOTS a positive "
                          f"integer)")
        host = m.group(1)
        if not _is_local(host, names):
            return None, (f"line {no}: host {host!r} is not this machine (rackhub-run starts "
                          f"local processes only: localhost, 127.0.0.1 or "
                          f"{socket.gethostname()})")
        slots[host.lower()] = int(m.group(2) or 1)
    total = sum(slots.values())
    if total == 0:
        return None, "no HOSTNAME:SLOTS line"
    return total, None


def discover(cmd, timeout):
    """Runs `cmd` once: (slots, None) or (None, problem)."""
    try:
        p = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    except OSError as e:
        return None, f"{cmd!r} could not run: {e}"
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the script and everything it started
        except ProcessLookupError:
            pass
        p.communicate()
        return None, f"{cmd!r} did not finish within {timeout:g} s"
    if p.returncode != 0:
        err = " ".join(err.split())[-200:]
        return None, f"{cmd!r} exited with code {p.returncode}" + (f": {err}" if err else "")
    return parse(out)
