"""What bench/scale.py and bench/scale_storelogs.py read of running processes and of the store.

- CPU: user + system seconds of a process (all its threads), from /proc through psutil.
- The store's requests: the kernel's count of data segments each of the store's server-side
  connections received (`ss -ti`, data_segs_in). Every request of torch's TCPStore client is
  one write of one buffer, hence one segment on loopback (a TCPStore `get` is two requests,
  wait then get); a few pipelined `set`s can share a segment, so this counts at most the
  requests. Connections: the established server-side sockets of the store's port.
- Memory: PSS (proportional set size, /proc/<pid>/smaps_rollup): pages shared after a fork
  are counted once across the processes that share them.
"""

import os
import re
import statistics
import subprocess
import sys
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "flows"))
import work  # noqa: E402  (bench/flows/work.py: the clock every launcher's times are on)

_SEGS = re.compile(r"data_segs_in:(\d+)")
_BYTES = re.compile(r"bytes_received:(\d+)")


def store_counters(port):
    """(connections, data segments received, bytes received) of the store's port, or Nones."""
    if not port:
        return None, None, None
    try:
        out = subprocess.run(["ss", "-tinH", "state", "established", "( sport = :%d )" % port],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None, None
    segs = [int(x) for x in _SEGS.findall(out)]
    return len(segs), sum(segs), sum(int(x) for x in _BYTES.findall(out))


def cpu_seconds(pid):
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return t.user + t.system


def snapshot(pids, port):
    """CPU seconds of each of `pids`, and the store's counters, now."""
    conns, segs, nbytes = store_counters(port)
    return dict(t=time.time(), cpu={pid: cpu_seconds(pid) for pid in pids},
                connections=conns, segs=segs, bytes=nbytes)


def rates(a, b, groups=None):
    """Between snapshots `a` and `b`: CPU as % of one core (each group of pids, {name: pids};
    all of them by default), store requests and bytes a second, connections at `b`."""
    span = b["t"] - a["t"]
    groups = groups or {"all": list(a["cpu"])}
    cpu = {}
    for name, pids in groups.items():
        used = [b["cpu"][p] - a["cpu"][p] for p in pids
                if a["cpu"].get(p) is not None and b["cpu"].get(p) is not None]
        cpu[name] = round(100.0 * sum(used) / span, 2) if span > 0 else None
    out = dict(window_s=round(span, 3), cpu_pct=cpu, connections=b["connections"])
    if a["segs"] is not None and b["segs"] is not None:
        out["requests_per_s"] = round((b["segs"] - a["segs"]) / span, 1)
        out["bytes_in_per_s"] = round((b["bytes"] - a["bytes"]) / span, 1)
    return out


def pss_bytes(pid):
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def created(pid):
    """When process `pid` was created (time.time() scale; flows/work.py's reading of /proc),
    or None once it is gone."""
    try:
        return work.created(pid)
    except psutil.NoSuchProcess:
        return None


def alive(pid):
    """True while `pid` runs (a zombie has ended)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100.0 * (len(values) - 1))))]


def line_stats(expected, delivered, reordered, unexpected, lines, window, tail_s=0.5):
    """The logs' figures from `lines`, [(time written, time delivered)] of every line that
    arrived, for a burst written over `window` [start, end]: loss, order, delays (s), and
    rates. The steady figures leave out the lines written in the burst's last `tail_s` s: a
    reader that stops at the end of a burst (Metaflow's local runtime, see
    docs/benchmarks.md, "Scale") holds those until the task's next output."""
    start, end = window
    delays = [at - written for written, at in lines]
    steady = [(w, at) for w, at in lines if w < end - tail_s]
    steady_delays = [at - w for w, at in steady]
    out = dict(
        lines_expected=expected, lines_delivered=delivered, lines_lost=expected - delivered,
        lines_reordered=reordered, lines_unexpected=unexpected,
        delay_p50_s=_r(statistics.median(delays)) if delays else None,
        delay_p99_s=_r(percentile(delays, 99)),
        delay_max_s=_r(max(delays)) if delays else None,
        delay_max_steady_s=_r(max(steady_delays)) if steady_delays else None)
    if lines:
        last_written = max(w for w, _ in lines)
        out["written_per_s"] = round(len(lines) / (last_written - start), 1) \
            if last_written > start else None
    if steady:
        last = max(at for _, at in steady)
        out["delivered_per_s"] = round(len(steady) / (last - start), 1) if last > start else None
    return out


def _r(value):
    return None if value is None else round(value, 4)
