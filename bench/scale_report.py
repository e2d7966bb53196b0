"""docs/benchmarks.md's "Scale" section and docs/benchmarks_scale.png from bench/scale.py runs.

    .venv/bin/python bench/scale_report.py bench/results/scale-<run>.json [more runs] \\
        [--before bench/results/scale-<before>.json [more]]

The section is the page's last (bench/report.py keeps it when it renders the rest). Several
results files make one set of runs: a later file's run of an arm and size stands for an
earlier one's. With `--before`, the runs before a fix: set beside the main ones.
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402

DOC = report.DOC
PLOT = REPO / "docs" / "benchmarks_scale.png"
PLOT_NAME = "benchmarks_scale.png"

# Issue 25's targets.
ASSEMBLY_RATIO = 3.0  # assembly at 64 x 8 over 1 x 8
TEARDOWN_S = 5.0
LOG_RATE = 10000.0
LOG_DELAY_S = 2.0
IDLE_CPU_PCT = 5.0


class Runs:
    """The runs of one or more results files (a later file's run of an arm, size and
    failure stands for an earlier one's)."""

    def __init__(self, datas):
        self.datas = datas
        self.data = datas[0]
        latest = {}
        for data in datas:
            for r in data["runs"]:
                latest[(r["arm"], r["size"], bool(r.get("fail")))] = r
        self.runs = list(latest.values())
        self.nproc = self.data["config"]["nproc"]

    def get(self, arm, size, fail=False):
        return next((r for r in self.runs if r["arm"] == arm and r["size"] == size
                     and bool(r.get("fail")) == fail), None)

    def sizes(self, arm, fail=False):
        return sorted({r["size"] for r in self.runs
                       if r["arm"] == arm and bool(r.get("fail")) == fail})

    def value(self, arm, size, path, fail=False):
        r = self.get(arm, size, fail)
        for key in path.split("."):
            if not isinstance(r, dict):
                return None
            r = r.get(key)
        return r


def fmt(value, spec="%.2f"):
    return "-" if value is None else spec % value


def node0_cpu(runs, size):
    """Node 0's CPU over the idle window, % of one core: its task and its pump."""
    cpu = runs.value("ours", size, "idle.cpu_pct")
    if not cpu:
        return None
    return (cpu.get("task") or 0) + (cpu.get("pump") or 0)


def fit(points):
    """Least-squares line (slope, intercept) through [(x, y)]."""
    points = [(x, y) for x, y in points if y is not None]
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def teardown_all(runs, size):
    return runs.value("ours", size, "teardown_all_s", fail=True)


def targets(runs):
    rows = []
    sizes = runs.sizes("ours")
    big = max(sizes) if sizes else None

    def add(what, measured, limit, ok, spec="%.2f"):
        rows.append((what, fmt(measured, spec), limit,
                     "-" if ok is None else ("met" if ok else "**missed**")))

    a1, ab = runs.value("ours", 1, "assembly_s"), runs.value("ours", big, "assembly_s")
    ratio = ab / a1 if a1 and ab else None
    add("assembly, %d x %d over 1 x %d" % (big, runs.nproc, runs.nproc), ratio,
        "<= %g" % ASSEMBLY_RATIO, None if ratio is None else ratio <= ASSEMBLY_RATIO)
    tr = runs.get("torchrun", big)
    if tr is not None and tr.get("assembly_s") is None and ab is not None:
        rows.append(("assembly at %d x %d, ours against torchrun's" % (big, runs.nproc),
                     "%.2f s; torchrun: no worker in %.0f s" % (ab, tr["wall_s"]),
                     "ours <= torchrun's", "met" if ab < tr["wall_s"] else "**missed**"))
    else:
        tr = tr and tr.get("assembly_s")
        add("assembly at %d x %d, ours over torchrun's (s / s)" % (big, runs.nproc),
            ab / tr if ab and tr else None, "<= 1", None if not (ab and tr) else ab <= tr)
    for size in runs.sizes("torchrun"):
        if size == big or runs.value("torchrun", size, "assembly_s") is None:
            continue
        ours, theirs = runs.value("ours", size, "assembly_s"), runs.value(
            "torchrun", size, "assembly_s")
        add("... at %d x %d (s / s)" % (size, runs.nproc), ours / theirs if ours and theirs
            else None, "-", None)
    td = teardown_all(runs, big)
    named = runs.value("ours", big, "report_names_rank", fail=True)
    left = runs.value("ours", big, "left_after_120s", fail=True)
    add("teardown at %d x %d: failing rank's raise to every process gone (s)" % (
        big, runs.nproc), td, "< %g" % TEARDOWN_S, None if td is None else td < TEARDOWN_S)
    rows.append(("... the report names the failing rank and its node; processes left",
                 "%s; %s" % ("yes" if named else "no", fmt(left, "%d")), "yes; 0",
                 "met" if named and not left else "**missed**"))
    for arm, label in (("ours", "local path"), ("store", "store path")):
        size = big if arm == "ours" else max(runs.sizes("store") or [0]) and big
        logs = runs.get(arm, size)
        if logs is None:
            continue
        lg = logs.get("logs", logs) if arm == "ours" else logs
        add("logs at %d x %d, %s: lines lost of %s" % (size, runs.nproc, label,
                                                       lg.get("lines_expected")),
            lg.get("lines_lost"), "0", lg.get("lines_lost") == 0, "%d")
        add("logs at %d x %d, %s: worst delay (s)" % (size, runs.nproc, label),
            lg.get("delay_max_s"), "< %g" % LOG_DELAY_S,
            None if lg.get("delay_max_s") is None else lg["delay_max_s"] < LOG_DELAY_S)
        if arm == "ours":
            add("... leaving out each rank's last lines, which Metaflow's runtime holds (s)",
                lg.get("delay_max_steady_s"), "< %g" % LOG_DELAY_S,
                None if lg.get("delay_max_steady_s") is None
                else lg["delay_max_steady_s"] < LOG_DELAY_S)
        add("logs at %d x %d, %s: lines delivered a second" % (size, runs.nproc, label),
            lg.get("delivered_per_s"), ">= %g" % LOG_RATE, None, "%.0f")
    cpu = node0_cpu(runs, big)
    add("idle control plane at %d nodes: node 0's CPU (%% of one core)" % big, cpu,
        "< %g" % IDLE_CPU_PCT, None if cpu is None else cpu < IDLE_CPU_PCT, "%.1f")
    return rows


def size_table(runs):
    rows = []
    for size in runs.sizes("ours"):
        n = runs.nproc
        logs = runs.value("ours", size, "logs") or {}
        store = runs.get("store", size) or {}
        idle = runs.value("ours", size, "idle") or {}
        rows.append((
            "%d x %d" % (size, n),
            fmt(runs.value("ours", size, "assembly_s")),
            fmt(runs.value("ours", size, "last_checkin_s")),
            fmt(runs.value("torchrun", size, "assembly_s")),
            fmt(runs.value("ours", size, "gather_s"), "%.3f"),
            "%s / %s / %s" % (fmt(logs.get("delivered_per_s"), "%.0f"),
                              fmt(logs.get("lines_lost"), "%d"),
                              fmt(logs.get("delay_max_steady_s"))
                              + " (%s)" % fmt(logs.get("delay_max_s"))),
            "%s / %s / %s" % (fmt(store.get("delivered_per_s"), "%.0f"),
                              fmt(store.get("lines_lost"), "%d"),
                              fmt(store.get("delay_max_s"))) if store else "-",
            "%s / %s / %s" % (fmt(runs.value("ours", size, "detected_s", True)),
                              fmt(runs.value("ours", size, "teardown_members_s", True)),
                              fmt(teardown_all(runs, size))),
            fmt(runs.value("ours", size, "report_s", True)),
            fmt(node0_cpu(runs, size), "%.1f"),
            fmt(idle.get("requests_per_s"), "%.0f"),
            fmt(idle.get("connections"), "%d"),
            fmt((runs.value("ours", size, "pss_assembled_mb") or 0) / 1024 or None, "%.1f"),
        ))
    return report.table(
        ["nodes x ranks", "assembly (s)", "last check-in (s)", "torchrun assembly (s)",
         "gather (s)", "logs, local: lines/s / lost / worst delay steady (at the end) (s)",
         "logs, store: lines/s / lost / worst delay (s)",
         "teardown: detected / members gone / every process gone (s)", "report (s)",
         "idle: node 0 CPU (%)", "idle: store requests/s", "store connections",
         "gang PSS (GiB)"], rows)


def torchrun_table(runs):
    rows = []
    for size in runs.sizes("torchrun"):
        ok, bad = runs.get("torchrun", size), runs.get("torchrun", size, True)
        ours = runs.get("ours", size)
        if ok and ok.get("assembly_s") is None:
            rows.append(("%d x %d" % (size, runs.nproc), fmt(ours and ours.get("assembly_s")),
                         "no worker in its body after %.0f s (%s of %d)" % (
                             ok["wall_s"], ok.get("workers_in", "none"), ok["world"]),
                         "-", "-", "-", "-"))
            continue
        rows.append((
            "%d x %d" % (size, runs.nproc),
            fmt(ours and ours.get("assembly_s")), fmt(ok and ok.get("assembly_s")),
            fmt(ok and ok.get("last_checkin_s")),
            fmt(bad and bad.get("teardown_failed_node_s")),
            "%s (%s left at %ss)" % (fmt(bad.get("teardown_all_s")), bad.get("left_at_cap"),
                                     fmt(bad.get("teardown_cap_s"), "%g"))
            if bad and bad.get("teardown_all_s") is None else fmt(bad and bad.get(
                "teardown_all_s")),
            fmt((ok or {}).get("pss_assembled_mb", 0) / 1024 or None, "%.1f"),
        ))
    return report.table(
        ["nodes x ranks", "ours: assembly (s)", "torchrun: assembly (s)",
         "torchrun: last node's workers started (s)",
         "torchrun: failed node's processes gone (s)", "torchrun: every process gone (s)",
         "torchrun PSS (GiB)"], rows)


def store_table(runs):
    rows = []
    for size in runs.sizes("store"):
        r = runs.get("store", size)
        rows.append((
            "%d (%d shipping)" % (size, r.get("shipping_nodes", size - 1)),
            fmt(r.get("rate_offered"), "%.0f"), fmt(r.get("delivered_per_s"), "%.0f"),
            fmt(r.get("lines_lost"), "%d"), fmt(r.get("lines_reordered"), "%d"),
            "%s / %s / %s" % (fmt(r.get("delay_p50_s")), fmt(r.get("delay_p99_s")),
                              fmt(r.get("delay_max_s"))),
            fmt(r.get("logging", {}).get("requests_per_s"), "%.0f"),
            fmt(per_line(r), "%.2f"),
            fmt(r.get("logging", {}).get("cpu_pct", {}).get("all"), "%.1f"),
            fmt(r.get("idle", {}).get("requests_per_s"), "%.0f"),
        ))
    return report.table(
        ["nodes", "lines/s written", "lines/s delivered", "lost", "reordered",
         "delay p50 / p99 / worst (s)", "store requests/s while logging",
         "requests a line", "node 0 CPU while logging (%)", "store requests/s idle"], rows)


def per_line(r, what="requests_per_s"):
    """The store's requests (or bytes received, `what`="bytes_in_per_s") per line written,
    over the burst (while every shipper is connected: ss counts live connections only)."""
    rate = r.get("logging", {}).get(what)
    lines = r.get("written_per_s")
    return rate / lines if rate and lines else None


def plot(runs, path, before=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), dpi=100)
    sizes = runs.sizes("ours")

    def series(ax, r, arm, key, label, style, fail=False, scale=1.0):
        xs = [s for s in r.sizes(arm, fail) if r.value(arm, s, key, fail) is not None]
        ax.plot(xs, [r.value(arm, s, key, fail) * scale for s in xs], style, label=label)

    ax = axes[0][0]
    series(ax, runs, "ours", "assembly_s", "@torch_distributed: every rank in its body", "o-")
    series(ax, runs, "ours", "last_checkin_s", "@torch_distributed: last node checked in", "o:")
    series(ax, runs, "torchrun", "assembly_s", "torchrun c10d: every worker in its body", "s-")
    ax.set_title("Assembly (s from task / agents start)")
    ax = axes[0][1]
    for r, tag, style in ((before, " (before)", "x--"), (runs, "", "o-")):
        if r is None:
            continue
        xs = [s for s in r.sizes("ours") if node0_cpu(r, s) is not None]
        ax.plot(xs, [node0_cpu(r, s) for s in xs], style, label="node 0 CPU, %% of a core%s"
                % tag)
    ax.axhline(IDLE_CPU_PCT, color="grey", linestyle=":", label="target")
    ax2 = ax.twinx()
    for r, tag, style in ((before, " (before)", "x--"), (runs, "", "^-")):
        if r is None:
            continue
        xs = [s for s in r.sizes("ours") if r.value("ours", s, "idle.requests_per_s")]
        ax2.plot(xs, [r.value("ours", s, "idle.requests_per_s") for s in xs], style,
                 color="tab:red", label="store requests/s%s" % tag)
    ax2.set_ylabel("store requests/s", color="tab:red")
    ax2.legend(loc="center left", fontsize=8)
    ax.set_title("Idle gang: node 0's cost (heartbeats and polling)")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[1][0]
    for r, tag, style in ((before, " (before)", "+--"), (runs, "", "o-")):
        if r is None:
            continue
        xs = [s for s in r.sizes("ours") if r.value("ours", s, "logs.delay_max_steady_s")
              is not None]
        ax.plot(xs, [r.value("ours", s, "logs.delay_max_steady_s") for s in xs], style,
                label="local path, steady%s" % tag)
    for r, tag, style in ((before, " (before)", "x--"), (runs, "", "s-")):
        if r is None:
            continue
        xs = r.sizes("store")
        ax.plot(xs, [r.value("store", s, "delay_max_s") for s in xs], style,
                label="store path (remote backends)%s" % tag)
    ax.axhline(LOG_DELAY_S, color="grey", linestyle=":", label="target")
    ax.set_title("Logs at %d lines/s: worst delay (s)" % LOG_RATE)
    ax = axes[1][1]
    series(ax, runs, "ours", "detected_s", "node 0 saw it", "o:", fail=True)
    series(ax, runs, "ours", "teardown_members_s", "every rank and agent gone", "o--", fail=True)
    series(ax, runs, "ours", "teardown_all_s", "every process gone (task included)", "o-",
           fail=True)
    series(ax, runs, "ours", "report_s", "report naming the rank in the log", "d-", fail=True)
    ax.axhline(TEARDOWN_S, color="grey", linestyle=":", label="target")
    ax.set_title("Teardown after the last rank raises (s)")
    for ax in (axes[0][0], axes[1][0], axes[1][1]):
        ax.legend(fontsize=8)
    for row in axes:
        for ax in row:
            ax.set_xlabel("nodes (x %d ranks)" % runs.nproc)
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def machine_line(runs):
    m = runs.data["machine"]
    loads = [r.get("load_before", "").split()[0] for r in runs.runs if r.get("load_before")]
    loads = sorted(float(x) for x in loads)
    return ("%s, %d cores, %s GiB; Python %s, torch %s, Metaflow %s. 1-min load average "
            "before the runs: %s (median %s, highest %s); `uptime` before: \"%s\"." % (
                m["cpu"], m["cores"], m["memory_gb"], m["python"], m["torch"], m["metaflow"],
                "%.2f-%.2f" % (loads[0], loads[-1]) if loads else "?",
                "%.2f" % loads[len(loads) // 2] if loads else "?",
                "%.2f" % loads[-1] if loads else "?", m["uptime_before"]))


def render(datas, sources, befores=(), before_sources=(), fdlimit=None, fdlimit_source=None,
           asides=()):
    """The section. `asides`: [(name, results, path)] of runs the notes quote apart (their
    figures prefixed with the name), such as a paired check."""
    runs = Runs(datas)
    data = runs.data
    prior = Runs(list(befores)) if befores else None
    out = [report.SCALE_START, "", "## Scale: 1 to %d nodes of %d ranks (issue 25)" % (
        max(runs.sizes("ours") or [0]), runs.nproc), ""]
    out.append(
        "What the gang adds runs through node 0: one TCPStore that every rank and node agent "
        "talks to, every node's heartbeats, check-ins, `gather`, failure reports and teardown, "
        "and on remote backends every remote rank's log lines. This section measures how "
        "that scales, with gangs of emulated nodes on one machine (`bench/scale.py`; the flow "
        "is `bench/flows/scale_gang.py`, its body `bench/flows/scale_body.py`).")
    out += ["", "```"] + [d["command"] for d in datas] + ["```", ""]
    out.append("Results: %s." % "; ".join(
        "`%s` (run started %s, took %.0f s%s)" % (
            src, d["started"], d["duration_s"],
            ", **--quick: not for publication**" if d.get("quick") else "")
        for src, d in zip(sources, datas)))
    if before_sources:
        out.append("Before the fix: %s." % "; ".join(
            "`%s` (run started %s)" % (src, d["started"])
            for src, d in zip(before_sources, befores)))
    if fdlimit_source:
        out.append("Open-file limit probe: `%s`." % fdlimit_source)
    for name, _, source in asides:
        out.append("Aside, `%s`: `%s`." % (name, source))
    out += ["", "Machine: %s" % machine_line(runs), ""]
    for d in datas:
        if d.get("note"):
            out += [d["note"], ""]
    out.append(
        "**What each figure measures.** The `ours` figures are `python flow.py run` of a gang "
        "of N emulated nodes x %d ranks: node 0 is the Metaflow task, nodes 1..N-1 are node "
        "agents (spin-step processes of their own, as locally always), every rank is forked "
        "(the start method fork, Linux's default) from a process that imported "
        "`torch.distributed` with the flow, so no rank imports torch itself: the cheapest "
        "member start on the product's real path. The body forms no process group "
        "(`METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK=off`): every rank gathers its arrival "
        "time onto rank 0, idles %g s (heartbeats and polling alone), prints %g lines a second "
        "across the gang for %g s, then calls `current.torch_distributed.gather(rank)` at one "
        "wall time; in the failing run, the last rank of the last node raises instead. Locally "
        "node agents pipe their ranks' output to node 0's pump, so **the local log figures "
        "measure the pipes, the pumps and Metaflow's runtime, not the store**; heartbeats, "
        "check-ins, gather, failure reports and the abort do go through the store. The "
        "**store log figures** measure the remote backends' path (each node's pump ships "
        "through a `LogShipper` into node 0's store, a `LogReceiver` in node 0's task copies "
        "into the task's log) with the product's own classes and N-1 remote nodes, each a "
        "process with its %d ranks and its pump (`bench/scale_storelogs.py`); a real AWS Batch "
        "emulation (`tests/emulation/`) runs a Metaflow task and a container's worth of "
        "processes per node, too heavy for 64 nodes on this machine." % (
            runs.nproc, data["config"]["idle_s"], data["config"]["rate"],
            data["config"]["log_s"], runs.nproc))
    out.append("")
    out.append(
        "Times: assembly is from the creation of node 0's task process to the last rank "
        "entering its body (torchrun: from starting its N agents to the last worker entering "
        "its body); the last check-in is the last node agent's join as the gang's record has "
        "it. Logs: a line's delay is from the rank's write to Metaflow's timestamp on it in "
        "the task's stored log (the store path: to node 0's log pipe, as read); *steady* "
        "leaves out the lines written in the burst's last 0.5 s (see \"the end of a burst\" "
        "below). Teardown: from the failing rank's raise to node 0 recording the abort "
        "(*detected*), to every rank, agent and pump gone, to every process gone with node 0's "
        "task, and to the line of the task's log that names the rank. Idle: node 0's task and "
        "its pump, CPU seconds over the idle window; store requests are the kernel's count of "
        "request segments the store's server-side connections received (`ss -ti`), "
        "connections those established. Memory: PSS of every process below the Metaflow "
        "runtime, once the gang is assembled.")
    out += ["", "![scale curves](%s)" % PLOT_NAME, ""]
    out += ["### Targets", "", report.table(["target (issue 25)", "measured", "target", ""],
                                             targets(runs)), ""]
    out += ["### Every size", "", size_table(runs), ""]
    skipped = [s for d in datas for s in d.get("skipped") or []]
    if skipped:
        out.append("Not run: %s." % "; ".join("%s at %d nodes (%s)" % (s["arm"], s["size"],
                                                                        s["why"])
                                              for s in skipped))
        out.append("")
    out += ["### Against torchrun", "", torchrun_table(runs), ""]
    out.append(
        "torchrun's worker imports nothing (the cheapest a torchrun launch gets); each of "
        "its agents imports torch and runs the c10d rendezvous. When a worker fails, torchrun "
        "stops that node's workers; the other nodes' workers run on, and their agents, once "
        "their own workers are done, wait in torch.distributed.elastic's exit barrier (300 s by "
        "default) for the failed node: nothing stops the gang. The bench stops watching after "
        "the cap and kills what is left.")
    out += ["", "### The store's log path (remote backends)", "", store_table(runs), ""]
    out += analysis(runs, prior, fdlimit, fdlimit_source, asides)
    out.append(report.SCALE_END)
    return "\n".join(out)


def analysis(runs, prior, fdlimit=None, fdlimit_source=None, asides=()):
    """The diagnosis and the estimates beyond 64 nodes, from the measured figures: the prose
    lives in scale_notes.md beside this script, with {placeholders} filled from the runs."""
    notes = (HERE / "scale_notes.md")
    if not notes.exists():
        return []
    text = notes.read_text().format(**figures(runs, prior, fdlimit, fdlimit_source, asides))
    return [text.rstrip("\n"), ""]


def figures(runs, prior, fdlimit=None, fdlimit_source=None, asides=()):
    """Every number the notes quote, by name: `<what>_<size>` of the main runs, the same with
    `before_` of the runs before the fix, the estimates beyond the measured sizes, and the
    open-file limit's probe (bench/scale_fdlimit.py)."""
    f = {}
    for tag, r in (("", runs), ("before_", prior)):
        if r is not None:
            f.update(_measured(r, tag))
    f.update(_estimates(runs))
    for name, data, _ in asides:
        f.update(_measured(Runs([data]), name + "_"))
    fdlimit = fdlimit or {}
    f.update(fdlimit_file=fdlimit_source or "-", fdlimit_limit=fdlimit.get("limit", "-"),
             fdlimit_clients=fdlimit.get("clients", "-"),
             fdlimit_connected=fdlimit.get("connected", "-"))
    return f


def _measured(r, tag):
    f = {}

    def put(name, value, spec="%.2f"):
        f[tag + name] = fmt(value, spec)

    for s in r.sizes("ours"):
        put("idle_req_%d" % s, r.value("ours", s, "idle.requests_per_s"), "%.0f")
        put("idle_cpu_%d" % s, node0_cpu(r, s), "%.1f")
        put("idle_agents_cpu_%d" % s, r.value("ours", s, "idle.cpu_pct.agents"), "%.1f")
        put("conn_%d" % s, r.value("ours", s, "idle.connections"), "%d")
        put("assembly_%d" % s, r.value("ours", s, "assembly_s"))
        put("checkin_%d" % s, r.value("ours", s, "last_checkin_s"))
        put("agent_start_%d" % s, r.value("ours", s, "agent_start_median_s"))
        put("gather_%d" % s, r.value("ours", s, "gather_s"), "%.3f")
        put("local_rate_%d" % s, r.value("ours", s, "logs.delivered_per_s"), "%.0f")
        put("local_steady_%d" % s, r.value("ours", s, "logs.delay_max_steady_s"))
        put("local_max_%d" % s, r.value("ours", s, "logs.delay_max_s"))
        put("local_lost_%d" % s, r.value("ours", s, "logs.lines_lost"), "%d")
        put("logging_agents_cpu_%d" % s, r.value("ours", s, "logging.cpu_pct.agents"), "%.1f")
        put("logging_runtime_cpu_%d" % s,
            r.value("ours", s, "logging.cpu_pct.metaflow_runtime"), "%.1f")
        put("pss_%d" % s, (r.value("ours", s, "pss_assembled_mb") or 0) / 1024 or None, "%.1f")
        for key in ("detected_s", "teardown_members_s", "teardown_all_s", "report_s",
                    "gang_ended_s"):
            put("%s_%d" % (key.replace("_s", "").replace("teardown_", ""), s),
                r.value("ours", s, key, True))
        ended, said = r.value("ours", s, "gang_ended_s", True), r.value("ours", s, "report_s",
                                                                      True)
        put("task_end_%d" % s, said - ended if said is not None and ended is not None else None)
        put("nocard_report_%d" % s, r.value("nocard", s, "report_s", True))
        put("nocard_all_%d" % s, r.value("nocard", s, "teardown_all_s", True))
    # every run, repeated sizes too: (size, how long after the last rank in its body the last
    # node checked in)
    lags = [(run["size"], run["last_checkin_s"] - run["assembly_s"])
            for data in r.datas for run in data["runs"]
            if run["arm"] == "ours" and run.get("last_checkin_s") is not None
            and run.get("assembly_s") is not None]
    late = [x for _, x in lags if x > 1.0]
    put("checkin_lag_max", max(late or [x for _, x in lags] or [None]))
    f[tag + "checkin_lag_runs"] = "%d of %d" % (len(late), len(lags))
    put("checkin_lag_min_late", min(late, default=None))
    put("checkin_lag_on_time", max((x for _, x in lags if x <= 1.0), default=None), "%.3f")
    late_sizes = sorted({size for size, x in lags if x > 1.0})
    f[tag + "checkin_late_sizes"] = " and ".join(
        "%d x %d" % (size, r.nproc) for size in late_sizes) or "none"
    f[tag + "checkin_on_time_sizes"] = " or ".join(
        "%d x %d" % (size, r.nproc) for size in sorted({size for size, _ in lags})
        if size not in late_sizes) or "none"
    pumps = [r.value("ours", s, "logging.cpu_pct.pump") for s in r.sizes("ours")]
    pumps = [p for p in pumps if p is not None]
    put("pump_cpu_min", min(pumps) if pumps else None, "%.0f")
    put("pump_cpu_max", max(pumps) if pumps else None, "%.0f")
    for s in r.sizes("torchrun"):
        put("tr_assembly_%d" % s, r.value("torchrun", s, "assembly_s"))
        put("tr_wall_%d" % s, r.value("torchrun", s, "wall_s"), "%.0f")
        put("tr_node_gone_%d" % s, r.value("torchrun", s, "teardown_failed_node_s", True))
        put("tr_all_%d" % s, r.value("torchrun", s, "teardown_all_s", True))
        put("tr_left_%d" % s, r.value("torchrun", s, "left_at_cap", True), "%d")
    for s in r.sizes("store"):
        st = r.get("store", s)
        put("store_rate_%d" % s, st.get("delivered_per_s"), "%.0f")
        put("store_written_%d" % s, st.get("written_per_s"), "%.0f")
        put("store_delay_%d" % s, st.get("delay_max_s"))
        put("store_p99_%d" % s, st.get("delay_p99_s"))
        put("store_lost_%d" % s, st.get("lines_lost"), "%d")
        put("store_per_line_%d" % s, per_line(st), "%.1f")
        put("store_idle_req_%d" % s, st.get("idle", {}).get("requests_per_s"), "%.0f")
        put("store_cpu_%d" % s, st.get("logging", {}).get("cpu_pct", {}).get("all"), "%.1f")
    line = fit([(s, r.value("ours", s, "idle.requests_per_s")) for s in r.sizes("ours")])
    put("req_per_node", line and line[0], "%.0f")
    line = fit([(s, node0_cpu(r, s)) for s in r.sizes("ours")])
    put("cpu_per_node", line and line[0], "%.2f")
    return f


def _estimates(r):
    """Beyond the measured sizes: straight lines through the measured ones."""
    f = {}
    big = max(r.sizes("ours") or [1])
    n = r.nproc
    conn = r.value("ours", big, "idle.connections")
    extra = conn - (big * n + big - 1) if conn is not None else 0
    req = fit([(s, r.value("ours", s, "idle.requests_per_s")) for s in r.sizes("ours")])
    cpu = fit([(s, node0_cpu(r, s)) for s in r.sizes("ours")])
    gather = fit([(s * n, r.value("ours", s, "gather_s")) for s in r.sizes("ours")])
    per_line_bytes = [per_line(r.get("store", s), "bytes_in_per_s") for s in r.sizes("store")]
    per_line_bytes = [b for b in per_line_bytes if b]
    f["conn_extra"] = "%d" % extra
    f["bytes_per_line"] = fmt(max(per_line_bytes) if per_line_bytes else None, "%.0f")
    for nodes in (256, 1000):
        world = nodes * n
        f["conn_est_%d" % nodes] = "%d" % (world + nodes - 1 + extra)
        f["idle_req_est_%d" % nodes] = fmt(req and req[0] * nodes + req[1], "%.0f")
        f["idle_cpu_est_%d" % nodes] = fmt(cpu and cpu[0] * nodes + cpu[1], "%.0f")
        f["gather_est_%d" % nodes] = fmt(gather and gather[0] * world + gather[1], "%.1f")
        f["log_mb_%d" % nodes] = fmt(max(per_line_bytes) * LOG_RATE / 1e6
                                     if per_line_bytes else None, "%.1f")
    return f


def write_docs(datas, sources, befores=(), before_sources=(), fdlimit=None,
               fdlimit_source=None, asides=()):
    plot(Runs(datas), PLOT, Runs(list(befores)) if befores else None)
    page = DOC.read_text()
    DOC.write_text(report.replace_section(
        page, report.SCALE_START, report.SCALE_END,
        render(datas, sources, befores, before_sources, fdlimit, fdlimit_source, asides)))
    return [DOC, PLOT]


def load(paths):
    """(results, their paths relative to the repository)."""
    paths = [Path(p).resolve() for p in paths]
    return [json.loads(p.read_text()) for p in paths], [str(p.relative_to(REPO)) for p in paths]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--before", nargs="*", default=[],
                        help="the results of the runs before a fix")
    parser.add_argument("--fdlimit", help="a bench/scale_fdlimit.py result")
    parser.add_argument("--aside", action="append", default=[], metavar="NAME=RESULTS",
                        help="runs the notes quote apart as NAME_<figure>")
    args = parser.parse_args(argv)
    datas, sources = load(args.results)
    befores, before_sources = load(args.before)
    fdlimit, fdlimit_source = load([args.fdlimit]) if args.fdlimit else ([None], [None])
    asides = []
    for item in args.aside:
        name, path = item.split("=", 1)
        (data,), (source,) = load([path])
        asides.append((name, data, source))
    for written in write_docs(datas, sources, befores, before_sources, fdlimit[0],
                              fdlimit_source[0], asides):
        print("wrote", written)


if __name__ == "__main__":
    main()
