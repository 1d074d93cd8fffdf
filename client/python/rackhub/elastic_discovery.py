"""rackhub-run --host-discovery-script CMD (Horovod's option): the slot count
an elastic job follows (docs/elastic.md, "Host discovery").

CMD runs through the shell every --discovery-interval seconds; it prints
one line per host, `HOSTNAME:SLOTS` (or `HOSTNAME`, one slot; blank lines
are skipped). The launcher starts local processes only, so every host must
be this machine: localhost, an address of 127.0.0.0/8, [::1], or this host's
name (socket.gethostname(), socket.getfqdn()); the slots of its lines add
up. discover() returns that count or an error text naming the problem (the
command failed or timed out, a line that is not HOSTNAME:SLOTS, a host that
is not this one); the supervisor (elastic_run.py) then logs the error and
keeps the job's size.

Thread use: the supervisor's thread.
"""
import ipaddress
import re
import socket
import subprocess

_LINE = re.compile(r"^(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9._\-]+)(?::(\d+))?$")


def local_names():
    """The names that mean this machine."""
    names = {"localhost", "localhost.localdomain", "ip6-localhost"}
    for f in (socket.gethostname, socket.getfqdn):
        try:
            names.add(f().lower())
        except OSError:
            pass
    return names


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
    total = 0
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
        total += int(m.group(2) or 1)
    if total == 0:
        return None, "no HOSTNAME:SLOTS line"
    return total, None


def discover(cmd, timeout):
    """Runs `cmd` once: (slots, None) or (None, problem)."""
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"{cmd!r} did not finish within {timeout:g} s"
    except OSError as e:
        return None, f"{cmd!r} could not run: {e}"
    if r.returncode != 0:
        err = " ".join(r.stderr.split())[-200:]
        return None, f"{cmd!r} exited with code {r.returncode}" + (f": {err}" if err else "")
    return parse(r.stdout)
