"""The fault matrix's measured detection times, as the table in docs/reliability.md.

    rm -f bench/results/faults.jsonl
    TD_FULL_FAULT_MATRIX=1 TD_FAULT_REPORT=bench/results/faults.jsonl \\
        .venv/bin/python -m pytest -q tests/e2e/test_failures.py -k test_failing_rank
    .venv/bin/python bench/fault_table.py bench/results/faults.jsonl

rewrites the part of docs/reliability.md between the matrix markers.
"""

import json
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"
WHERE = {0: "rank 0 (forked by the task)", 1: "rank 1 (member, node 0)", 2: "rank 2 (member, node 1)"}
WHENS = ("before_init", "in_rendezvous", "in_collective", "after_body")
HOWS = ("raise", "exit", "sigkill", "hang")


def cell(entry):
    if entry is None:
        return "not run"
    if entry["latency"] is None:
        return "**not detected** (killed at the bound)"
    return "%.1f s" % entry["latency"]


def render(entries):
    # a later entry of a case (a rerun) replaces an earlier one
    found = {(e["rank"], e["when"], e["how"]): e for e in entries}
    lines = ["| where | when | " + " | ".join(HOWS) + " |", "|---|---|" + "---|" * len(HOWS)]
    for rank in WHERE:
        for when in WHENS:
            lines.append("| %s | %s | %s |" % (WHERE[rank], when.replace("_", " "), " | ".join(
                cell(found.get((rank, when, how))) for how in HOWS)))
    lines.append("")
    lines.append("Every case names the failing rank and its cause (a hang: the hung rank, or rank "
                 "0 that did not finish), as tests/e2e/test_failures.py asserts.")
    return "\n".join(lines)


def main(paths):
    entries = [json.loads(line) for path in paths
               for line in Path(path).read_text().splitlines() if line.strip()]
    doc = DOC.read_text()
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + START + "\n" + render(entries) + "\n" + END + tail)
    print("wrote", DOC)


if __name__ == "__main__":
    main(sys.argv[1:])
