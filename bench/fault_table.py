"""The fault matrix's measured detection times, as the table in docs/reliability.md.

    rm -f bench/results/faults.jsonl
    TD_FULL_FAULT_MATRIX=1 TD_FAULT_REPORT=bench/results/faults.jsonl \\
        .venv/bin/python -m pytest -q tests/e2e/test_failures.py -k test_failing_rank
    .venv/bin/python bench/fault_table.py bench/results/faults.jsonl

rewrites the part of docs/reliability.md between the matrix markers. The same matrix under
start_method="exec" (TD_FAULT_START_METHOD=exec, into bench/results/faults-exec.jsonl) goes
between the exec matrix markers with `--start-method exec`.
"""

import json
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
MARKERS = {"fork": ("<!-- matrix:start -->", "<!-- matrix:end -->"),
           "exec": ("<!-- matrix-exec:start -->", "<!-- matrix-exec:end -->")}
WHERE = {0: "rank 0 (forked by the task)", 1: "rank 1 (member, node 0)", 2: "rank 2 (member, node 1)"}
# under exec every rank, rank 0 included, is a spin-step of its node's supervisor
WHERE_EXEC = {0: "rank 0 (a spin-step of the task)", 1: "rank 1 (spin-step, node 0)",
              2: "rank 2 (spin-step, node 1)"}
WHENS = ("before_init", "in_rendezvous", "in_collective", "after_body")
HOWS = ("raise", "exit", "sigkill", "hang")


def cell(entry):
    if entry is None:
        return "not run"
    if entry["latency"] is None:
        return "**not detected** (killed at the bound)"
    return "%.1f s" % entry["latency"]


def render(entries, where=WHERE):
    # a later entry of a case (a rerun) replaces an earlier one
    found = {(e["rank"], e["when"], e["how"]): e for e in entries}
    lines = ["| where | when | " + " | ".join(HOWS) + " |", "|---|---|" + "---|" * len(HOWS)]
    for rank in where:
        for when in WHENS:
            lines.append("| %s | %s | %s |" % (where[rank], when.replace("_", " "), " | ".join(
                cell(found.get((rank, when, how))) for how in HOWS)))
    lines.append("")
    lines.append("Every case names the failing rank and its cause (a hang: the hung rank, or rank "
                 "0 that did not finish), as tests/e2e/test_failures.py asserts.")
    return "\n".join(lines)


def main(args):
    method = "fork"
    if args[:1] == ["--start-method"]:
        method, args = args[1], args[2:]
    start, end = MARKERS[method]
    entries = [json.loads(line) for path in args
               for line in Path(path).read_text().splitlines() if line.strip()]
    doc = DOC.read_text()
    head, rest = doc.split(start, 1)
    _, tail = rest.split(end, 1)
    table = render(entries, WHERE_EXEC if method == "exec" else WHERE)
    DOC.write_text(head + start + "\n" + table + "\n" + end + tail)
    print("wrote", DOC)


if __name__ == "__main__":
    main(sys.argv[1:])
