"""docs/benchmarks.md and its plot from one bench/run.py results file.

    .venv/bin/python bench/report.py bench/results/<file>.json
"""

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
PLOT = REPO / "docs" / "benchmarks_launch.png"

NAMES = {"single": "one process (floor)", "torchrun": "torchrun --standalone",
         "parallel": "@parallel", "ours_fork": "@torch_distributed fork",
         "ours_exec": "@torch_distributed exec",
         "ours_preload": "@torch_distributed fork, torch imported before the fork",
         "ours_nodes": "@torch_distributed fork, one process per emulated node"}
ORDER = ["single", "torchrun", "parallel", "ours_fork", "ours_exec", "ours_preload", "ours_nodes"]
# A run of the launch part alone (`--only launch`) writes this section of the page and leaves
# the rest, which comes from a full run, as it is.
SECTION_START = "<!-- world_size section: bench/report.py, from a `bench/run.py --only launch` run -->"
SECTION_END = "<!-- end of the world_size section -->"
# bench/scale_report.py writes the page's "Scale" section (issue 25), from a bench/scale.py run.
SCALE_START = "<!-- scale section: bench/scale_report.py, from a `bench/scale.py` run -->"
SCALE_END = "<!-- end of the scale section -->"
# The sections other runs write, kept (in this order, at the end of the page) when this
# script renders the rest.
# The paired before/after launch of exec'd gangs when rank 0 became a spin-step of its own
# (issue 22), from bench/results/ab-exec-rank0-*.json.
EXEC_START = "<!-- exec rank 0 section: from a paired before/after launch run (issue 22) -->"
EXEC_END = "<!-- end of the exec rank 0 section -->"
# What the seal of torch's own rendezvous adds to init_process_group (issue 37), from
# bench/rendezvous_seal.py's bench/results/seal-*.json.
SEAL_START = "<!-- seal section: from a bench/rendezvous_seal.py run (issue 37) -->"
SEAL_END = "<!-- end of the seal section -->"
# The gang's card drawn by the task instead of a `card create` process (issue 41, point 4),
# from bench/card_draw.py's bench/results/card-*.json and bench/ab_launch.py's ab-*.json.
CARD_START = "<!-- card section: from bench/card_draw.py and bench/ab_launch.py runs (issue 41) -->"
CARD_END = "<!-- end of the card section -->"
# How long the gang takes to name its straggler (issue 41, point 1), from
# bench/straggler_detect.py's bench/results/straggler-*.json.
STRAGGLER_START = "<!-- straggler section: from a bench/straggler_detect.py run (issue 41) -->"
STRAGGLER_END = "<!-- end of the straggler section -->"
# What reading a rank's Flight Recorder for the hang report costs (issue 41, point 5), from
# bench/probe_cost.py's bench/results/probe-*.json.
HISTORY_START = "<!-- flight recorder section: from a bench/probe_cost.py run (issue 41) -->"
HISTORY_END = "<!-- end of the flight recorder section -->"
KEPT = ((SECTION_START, SECTION_END), (SCALE_START, SCALE_END), (EXEC_START, EXEC_END),
        (SEAL_START, SEAL_END), (CARD_START, CARD_END), (STRAGGLER_START, STRAGGLER_END),
        (HISTORY_START, HISTORY_END))
PHASES = [("proc", "rank 0 process started"), ("body", "work starts"),
          ("import", "torch imported"), ("init", "group formed"),
          ("collective", "all-reduce done")]
DETECTION_TARGET = 5.0


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, spec="%.2f"):
    return "n/a" if value is None else spec % value


class Results:
    def __init__(self, data):
        self.data = data
        self.runs = data["runs"]

    def select(self, kind, launcher=None, world=None, ok=True, **settings):
        out = []
        for r in self.runs:
            s = r["settings"]
            if s.get("BENCH_KIND") != kind or (launcher and r["launcher"] != launcher):
                continue
            if world is not None and int(s.get("BENCH_WORLD", 0)) != world:
                continue
            if any(str(s.get(k)) != str(v) for k, v in settings.items()):
                continue
            if ok and (r["returncode"] != 0 or r["result"] is None):
                continue
            out.append(r)
        return out

    def launch(self, launcher, world, key):
        runs = self.select("launch", launcher, world)
        if key in ("wall", "peak_rss_mb", "peak_pss_mb"):
            return median(r[key] for r in runs)
        return median(r["result"].get(key) for r in runs)

    def paired_ratios(self, kind, num, den, world, key="wall"):
        """num/den of every repetition that measured both."""
        a = {r["rep"]: r[key] for r in self.select(kind, num, world)}
        b = {r["rep"]: r[key] for r in self.select(kind, den, world)}
        return [a[k] / b[k] for k in sorted(a) if k in b and b[k]]

    def paired_ratio(self, kind, num, den, world, key="wall"):
        """Median over repetitions of num/den, both from the same repetition."""
        return median(self.paired_ratios(kind, num, den, world, key))

    def ddp(self, launcher):
        return median(r["result"]["steps_per_s"] for r in self.select("ddp", launcher))

    def ddp_ratios(self):
        a = {r["rep"]: r["result"]["steps_per_s"] for r in self.select("ddp", "ours_fork")}
        b = {r["rep"]: r["result"]["steps_per_s"] for r in self.select("ddp", "torchrun")}
        return [a[k] / b[k] for k in sorted(a) if k in b]

    def ddp_ratio(self):
        return median(self.ddp_ratios())

    def detection(self, launcher, when):
        runs = self.select("fail", launcher, ok=False, BENCH_FAIL_WHEN=when)
        timed_out = [r for r in runs if r["timed_out"]]
        return median(r.get("detection") for r in runs if not r["timed_out"]), len(timed_out), len(runs)


def targets(res, sizes):
    rows = []

    def add(what, value, limit, better):
        if value is None:
            rows.append((what, "n/a", limit, "not measured"))
            return
        met = value <= limit if better == "lower" else value >= limit
        rows.append((what, "%.2f" % value, ("<= %.2f" if better == "lower" else ">= %.2f") % limit,
                     "met" if met else "**missed**"))

    if 4 in sizes:
        add("4 ranks, whole flow: ours (fork) / one process", res.paired_ratio("launch", "ours_fork", "single", 4), 1.10, "lower")
        add("4 ranks, whole flow: ours (fork) / torchrun", res.paired_ratio("launch", "ours_fork", "torchrun", 4), 0.50, "lower")
    if 8 in sizes:
        add("8 ranks, whole flow: ours (fork) / one process", res.paired_ratio("launch", "ours_fork", "single", 8), 1.25, "lower")
    fix = "with torch imported before the fork (the suggested fix)"
    if 4 in sizes:
        add("4 ranks, %s / one process" % fix, res.paired_ratio("launch", "ours_preload", "single", 4), 1.10, "lower")
        add("4 ranks, %s / torchrun" % fix, res.paired_ratio("launch", "ours_preload", "torchrun", 4), 0.50, "lower")
    if 8 in sizes:
        add("8 ranks, %s / one process" % fix, res.paired_ratio("launch", "ours_preload", "single", 8), 1.25, "lower")
    add("DDP steady state: ours / torchrun steps per second", res.ddp_ratio(), 0.98, "higher")
    for when in ("before_init", "in_collective"):
        value, _, _ = res.detection("ours_fork", when)
        add("failure detection, rank 1 SIGKILLed %s (s)" % when.replace("_", " "), value,
            DETECTION_TARGET, "lower")
    return rows


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def plot(res, sizes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for launcher, style in (("torchrun", "s-"), ("parallel", "^-"), ("ours_fork", "o-"),
                            ("ours_exec", "o--"), ("ours_preload", "o:")):
        ys = [res.launch(launcher, n, "wall") for n in sizes]
        ax.plot(sizes, ys, style, label=NAMES[launcher])
    floor = median(res.launch("single", n, "wall") for n in sizes)
    if floor is not None:
        ax.axhline(floor, color="grey", linestyle=":", label=NAMES["single"])
    ax.set_xlabel("world size (processes on this host)")
    ax.set_ylabel("whole-flow wall time (s), median")
    ax.set_xticks(sizes)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Launch overhead: import torch, init_process_group, one all_reduce")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render(data, source):
    res = Results(data)
    cfg = data["config"]
    sizes = cfg["sizes"]
    m = data["machine"]
    out = ["# Benchmarks", ""]
    out.append(
        "`@torch_distributed` side by side with what users do today: `torchrun --standalone` "
        "inside a plain step, Metaflow's own `@parallel` (the torch environment set by hand "
        "from `current.parallel`), and the physical floor, the same work as one process in a "
        "plain step. Every number below, up to the `world_size` section at the end (which names "
        "its own run), comes from one run of the command below; medians "
        "over repetitions, each repetition running every launcher back to back in a shuffled "
        "order, ratios as the median of the per-repetition ratios.")
    out += ["", "## How it was measured", ""]
    out.append("```\n.venv/bin/pip install -r bench/requirements.txt\n%s\n```" % data["command"])
    out.append("")
    out.append("Results: `%s` (run started %s, took %.0f s%s)." % (
        source, data["started"], data["duration_s"],
        "; **--quick: one repetition, smaller sizes, not for publication**" if data["quick"] else ""))
    out.append("")
    out.append(table(["machine", ""], [
        ("CPU", "%s, %d cores" % (m["cpu"], m["cores"])), ("memory", "%s GiB" % m["memory_gb"]),
        ("OS", m["os"]), ("Python / torch / Metaflow", "%s / %s / %s" % (m["python"], m["torch"], m["metaflow"])),
        ("1-min load average", "%.2f before, %.2f median during, %.2f after" % (
            m["load_1min_before"], m["load_1min_median_during"] or 0, m["load_1min_after"])),
    ]))
    out.append("")
    out.append(
        "The load average includes the bench's own flows (a run of 8 ranks keeps both cores "
        "busy). %s" % data.get("note", ""))
    out += ["", "Each flow runs in a fresh folder (its own `METAFLOW_HOME`, local datastore and "
            "metadata). The work (`bench/flows/work.py`) is the same under every launcher: "
            "`import torch`, `init_process_group(\"gloo\")` from the environment, one "
            "`all_reduce`. Times inside the step are seconds since the Metaflow task process of "
            "the step was created. Memory is the peak, over 0.1 s samples, of the summed RSS "
            "(and PSS, which counts pages shared after a fork once) of every process below the "
            "Metaflow runtime.", ""]

    out += ["## Targets", "", table(["target (from issue 5)", "measured", "target", ""],
                                    targets(res, sizes)), ""]
    out.append(
        "The rows \"torch imported before the fork\" import `torch.distributed` in the train "
        "task before the decorator forks its members, as the design's prototype did; they "
        "show what starting members costs when no member re-imports torch (\"Where the time "
        "goes\" below).")
    out.append("")

    out += ["## Launch overhead", "", "![launch time against world size](%s)" % PLOT.name, ""]
    rows = []
    for n in sizes:
        for launcher in ORDER:
            if not res.select("launch", launcher, n):
                continue
            rows.append((n, NAMES[launcher], fmt(res.launch(launcher, n, "wall")),
                         fmt(res.launch(launcher, n, "collective")),
                         fmt(res.launch(launcher, n, "peak_rss_mb"), "%.0f"),
                         fmt(res.launch(launcher, n, "peak_pss_mb"), "%.0f")))
    out.append(table(["world size", "launcher", "whole flow (s)", "task start to first collective (s)",
                      "peak RSS (MB)", "peak PSS (MB)"], rows))
    out += ["", "Ratios of whole-flow wall time (paired, median):", ""]
    rows = []
    for ours in ("ours_fork", "ours_exec", "ours_preload"):
        for n in sizes:
            rows.append((NAMES[ours], n) + tuple(fmt(res.paired_ratio("launch", ours, den, n))
                                                 for den in ("torchrun", "parallel", "single")))
    out.append(table(["ours", "world size", "/ torchrun", "/ @parallel", "/ one process"], rows))
    out += ["", "### Where the time goes", "",
            "Medians of the moments (seconds since the step's task process was created) at "
            "which rank 0 passed each phase. Under torchrun \"rank 0 process started\" is when "
            "torchrun's worker process was created.", ""]
    rows = []
    for n in sizes:
        for launcher in ORDER:
            if not res.select("launch", launcher, n):
                continue
            rows.append((n, NAMES[launcher]) + tuple(fmt(res.launch(launcher, n, k))
                                                       for k, _ in PHASES))
    out.append(table(["world size", "launcher"] + [label for _, label in PHASES], rows))
    out += ["", analysis(res, sizes), ""]

    out += ["## Steady state: DDP training", ""]
    out.append(
        "A 3-layer MLP (256-512-512-10), batch 64 of random data, SGD, %d ranks, %d timed steps "
        "after 10 warm-up steps, one line printed per step and rank (so the output pump is "
        "busy), `torch.set_num_threads(1)` in every rank under both launchers." %
        (cfg["ddp_world"], cfg["ddp_steps"]))
    out.append("")
    out.append(table(["launcher", "steps per second (median)"],
                     [(NAMES[k], fmt(res.ddp(k), "%.1f")) for k in ("torchrun", "ours_fork")]))
    out += ["", "Ratio ours / torchrun: **%s** (target >= 0.98), the median of the paired "
            "ratios %s (a repetition whose torchrun or ours run failed has no ratio)." % (
                fmt(res.ddp_ratio()), ", ".join("%.2f" % r for r in res.ddp_ratios()) or "none"),
            ""]

    out += ["## Artifacts: a %s MB state dict" % cfg["artifact_mb"], ""]
    out.append(
        "World size %d. Under `@torch_distributed` only rank 0's `self.state` is persisted; "
        "under `@parallel` every node is a Metaflow task and persists its own copy. Bytes are "
        "everything the run wrote to the local datastore." % cfg["artifact_world"])
    out.append("")
    rows = []
    for launcher in ("single", "ours_fork", "parallel"):
        runs = res.select("artifact", launcher)
        rows.append((NAMES[launcher], fmt(median(r["wall"] for r in runs)),
                     fmt(median(r["datastore_bytes"] / 1e6 for r in runs), "%.0f")))
    out.append(table(["launcher", "whole flow (s)", "written to the datastore (MB)"], rows))
    out += ["", "## Failure detection", ""]
    out.append(
        "World size %d; rank 1 is SIGKILLed either before `init_process_group` (its peers wait "
        "in the rendezvous) or once its peers are blocked in an `all_reduce`. Detection is the "
        "time from the kill to the end of `python flow.py run`. `@parallel` runs are bounded at "
        "%.0f s and killed after." % (cfg["fail_world"], cfg["parallel_bound"]))
    out.append("")
    rows = []
    for when in ("before_init", "in_collective"):
        row = [when.replace("_", " ")]
        for launcher in ("ours_fork", "parallel"):
            value, timed_out, total = res.detection(launcher, when)
            if total == 0:
                row.append("n/a")
            elif timed_out == total:
                row.append("> %.0f s (bound)" % cfg["parallel_bound"])
            else:
                row.append(fmt(value) + " s" + (" (%d of %d runs > bound)" % (timed_out, total)
                                                if timed_out else ""))
        rows.append(row)
    out.append(table(["rank 1 killed", NAMES["ours_fork"], NAMES["parallel"]], rows))
    out += ["", "The full fault matrix, with detection times for every case, is in "
            "[reliability.md](reliability.md).", ""]
    out += ["## Checkpoints and recovery", "",
            "Measured apart from this run, with their own conditions, in [checkpoints and "
            "recovery](checkpoints.md#costs): the time from a lost rank's SIGKILL to the first "
            "training step of the gang `@retry` resumes from the latest `@checkpoint` (the "
            "end-to-end test `tests/e2e/test_checkpoints.py`, `TD_RECOVERY_REPORT`), and the save "
            "and restore throughput of a 200 MB state through metaflow-checkpoint against "
            "Metaflow's datastore directly (`bench/checkpoint_throughput.py`). The recovery of a "
            "restart in place, one node and two, against `torchrun --max-restarts=1` and "
            "`@retry` in one paired run (`bench/recovery.py`): [restarts in "
            "place](checkpoints.md#restarts-in-place).", ""]
    return "\n".join(out)


def member_startup(res, launcher, world):
    """Median seconds from a member's (rank > 0) creation to the start of its step body: its
    own times are measured from its own creation."""
    return median(rank["body"] for r in res.select("launch", launcher, world)
                  for rank in r.get("ranks", [])[1:])


def analysis(res, sizes):
    """What the phase table says, with the numbers of this run."""
    lines = []
    body = res.launch("single", sizes[0], "body")
    if body is not None:
        lines.append(
            "* **The floor.** Metaflow needs %.2f s from the creation of the task process to the "
            "step body, then `import torch` takes %.2f s; the whole 3-step flow takes %.2f s. "
            "Every launcher pays this once in its rank 0." % (
                body, res.launch("single", sizes[0], "import") - body,
                res.launch("single", sizes[0], "wall")))
        walls = [r["wall"] for r in res.select("launch", "single")]
        lines.append(
            "* **Noise.** The same one-process flow took between %.2f and %.2f s across this "
            "run's repetitions: a ratio of whole-flow times on this machine moves by about "
            "+-%.0f%% between repetitions, as much as the targets' margins." % (
                min(walls), max(walls), 50 * (max(walls) - min(walls)) / median(walls)))
    for n in sizes:
        if n == 1:
            continue
        fork, single = res.launch("ours_fork", n, "collective"), res.launch("single", n, "collective")
        startup = member_startup(res, "ours_fork", n)
        pre_startup = member_startup(res, "ours_preload", n)
        pre_c = res.launch("ours_preload", n, "collective")
        if None in (fork, single):
            continue
        text = "* **%d ranks, fork.** The first collective completes %.2f s after the task " \
            "started, %+.2f s against one process. A forked member needs %s s from the fork " \
            "to its step body (median)" % (n, fork, fork - single, fmt(startup))
        if startup is not None and startup > 0.3:
            text += (": it imports torch itself, because the decorator forked it before the "
                     "task imported torch; %d imports compete for %d cores."
                     % (n, res.data["machine"]["cores"]))
        else:
            text += ": it inherits the torch the task imported before forking it."
        if pre_c is not None:
            text += (" With torch imported in the task before the fork (the rows `fork, torch "
                     "imported before the fork`: the bench's flow imports it at module level in "
                     "the train task), a member needs %s s to its body and the first collective "
                     "completes at %.2f s." % (fmt(pre_startup), pre_c))
        lines.append(text)
        trun, proc = res.launch("torchrun", n, "collective"), res.launch("torchrun", n, "proc")
        if trun is not None:
            lines.append(
                "* **%d ranks, torchrun.** Its workers are created %.2f s after the task (the "
                "step body starts, then torchrun imports torch and sets up its rendezvous) and "
                "each imports torch itself; first collective at %.2f s." % (n, proc, trun))
    return "\n".join(lines)


def render_world_size(data, source):
    """The section of a launch-only run: `world_size=N` alone (one node of N processes since
    issue 11) against one process, torchrun, and the N-node plan it had before."""
    res = Results(data)
    sizes = [n for n in data["config"]["sizes"] if n > 1]
    m = data["machine"]
    out = [SECTION_START, "", "## `world_size` alone: one node (issue 11)", ""]
    out.append(
        "`@torch_distributed(world_size=N)` on a machine without GPUs runs N processes on one "
        "node (`@torch_distributed fork` below: `bench/flows/bench_ours.py` with "
        "`world_size=N`). Before issue 11 it ran N emulated nodes of one process each, the row "
        "`one process per emulated node` (the same flow with `nodes=N` added). Every number in "
        "this section comes from one run of:")
    out += ["", "```\n%s\n```" % data["command"], ""]
    out.append("Results: `%s` (run started %s, took %.0f s%s). Medians over %d repetitions; "
               "ratios are the median of the per-repetition ratios. 1-min load average %.2f "
               "before, %.2f median during, %.2f after. %s" % (
                   source, data["started"], data["duration_s"],
                   "; **--quick: not for publication**" if data["quick"] else "",
                   data["config"]["reps"], m["load_1min_before"],
                   m["load_1min_median_during"] or 0, m["load_1min_after"], data.get("note", "")))
    out.append("")
    rows = []

    def add(what, value, limit):
        rows.append((what, fmt(value), "<= %.2f" % limit,
                     "not measured" if value is None else "met" if value <= limit else "**missed**"))

    if 4 in sizes:
        add("world_size=4, whole flow / one process", res.paired_ratio("launch", "ours_fork", "single", 4), 1.10)
        add("world_size=4, whole flow / torchrun in a step", res.paired_ratio("launch", "ours_fork", "torchrun", 4), 0.50)
    if 8 in sizes:
        add("world_size=8, whole flow / one process", res.paired_ratio("launch", "ours_fork", "single", 8), 1.25)
    out += [table(["target (issue 11)", "measured", "target", ""], rows), ""]
    rows = []
    for n in sizes:
        for launcher, plan in (("ours_nodes", "%d nodes x 1 (before)" % n),
                               ("ours_fork", "1 node x %d (now)" % n)):
            row = ["world_size=%d" % n, plan, fmt(res.launch(launcher, n, "wall"))]
            for den in ("single", "torchrun"):
                each = res.paired_ratios("launch", launcher, den, n)
                row.append("%s (%s to %s)" % (fmt(median(each)), fmt(min(each, default=None)),
                                              fmt(max(each, default=None))))
            rows.append(row)
    out += [table(["you write", "plan", "whole flow (s)", "/ one process (lowest to highest "
                   "repetition)", "/ torchrun (lowest to highest)"], rows), ""]
    out.append("On a loaded machine the ratio of one repetition moves far more than the "
               "targets' margins (see the ranges): read the targets against the load average "
               "above, and the before/after rows as the robust result.")
    out.append("")
    rows = [(n, NAMES[launcher], fmt(res.launch(launcher, n, "wall")),
             fmt(res.launch(launcher, n, "collective")),
             fmt(res.launch(launcher, n, "peak_pss_mb"), "%.0f"))
            for n in sizes for launcher in ORDER if res.select("launch", launcher, n)]
    out += ["Every launcher of the run (medians):", "",
            table(["world size", "launcher", "whole flow (s)",
                   "task start to first collective (s)", "peak PSS (MB)"], rows), "", SECTION_END]
    return "\n".join(out)


def _split(page, start, end):
    """(`page` without the section between `start` and `end`, that section or None)."""
    if start not in page:
        return page, None
    before, rest = page.split(start, 1)
    inside, after = rest.split(end, 1)
    return before.rstrip("\n") + "\n\n" + after.lstrip("\n"), start + inside + end


def with_section(page, section):
    """`page` without its kept sections, then `section` (the kept ones, as section_of gives
    them) at its end."""
    for start, end in KEPT:
        page = _split(page, start, end)[0]
    return page.rstrip("\n") + "\n\n" + section + "\n"


def section_of(page):
    """The kept sections of `page`, in KEPT's order, or None."""
    found = [_split(page, start, end)[1] for start, end in KEPT]
    found = [f for f in found if f]
    return "\n\n".join(found) if found else None


def replace_section(page, start, end, text):
    """`page` with the section between `start` and `end` replaced by `text`, the kept
    sections at the end in KEPT's order."""
    kept = []
    for s_, e_ in KEPT:
        page, found = _split(page, s_, e_)
        kept.append(text if s_ == start else found)
    return with_section(page, "\n\n".join(k for k in kept if k))


def write_docs(data, source):
    old = DOC.read_text() if DOC.exists() else ""
    if data["parts"] == ["launch"]:
        DOC.write_text(replace_section(old, SECTION_START, SECTION_END,
                                       render_world_size(data, source)))
        return [DOC]
    res = Results(data)
    plot(res, data["config"]["sizes"], PLOT)
    page = render(data, source)
    kept = section_of(old)
    DOC.write_text(with_section(page, kept) if kept else page)
    return [DOC, PLOT]


if __name__ == "__main__":
    path = Path(sys.argv[1])
    for written in write_docs(json.loads(path.read_text()), path.resolve().relative_to(REPO)):
        print("wrote", written.relative_to(REPO))
