"""docs/benchmarks.md is bench/report.py's rendering of the results file it names, and points to
the checkpoint measurements kept in docs/checkpoints.md (issue 15)."""

import importlib.util
import json
import re

from tests.support import REPO


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rendered():
    """The page as `bench/report.py <results file>` writes it (without redrawing the plot)."""
    report = _report()
    page = report.DOC.read_text()
    source = re.search(r"^Results: `(bench/results/[^`]+\.json)`", page, re.M).group(1)
    rendered = report.render(json.loads((REPO / source).read_text()), source)
    kept = report.section_of(page)
    return page, report.with_section(rendered, kept) if kept else rendered


def test_the_page_is_what_report_renders_from_its_results_file():
    page, rendered = _rendered()
    assert page == rendered  # edit bench/report.py, then rerun it, rather than the page


def test_the_page_points_to_the_checkpoint_and_recovery_measurements():
    _, rendered = _rendered()
    section = rendered.split("## Checkpoints and recovery", 1)[1]
    assert "(checkpoints.md#costs)" in section
    assert "bench/checkpoint_throughput.py" in section and "test_checkpoints.py" in section


def _scale_report():
    spec = importlib.util.spec_from_file_location("bench_scale_report",
                                                  REPO / "bench" / "scale_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scale_section_is_what_scale_report_renders_from_its_results_files():
    """Issue 25: the "Scale" section is bench/scale_report.py's rendering of the results files
    it names (the runs, the runs before the fix, the open-file limit's probe)."""
    scale = _scale_report()
    page = scale.DOC.read_text()
    start, end = scale.report.SCALE_START, scale.report.SCALE_END
    section = start + page.split(start, 1)[1].split(end, 1)[0] + end

    def named(prefix):
        line = re.search(r"^%s.*$" % re.escape(prefix), section, re.M)
        return re.findall(r"`(bench/results/scale-[^`]+\.json)`", line.group(0)) if line else []

    runs, before, fdlimit = named("Results: "), named("Before the fix: "), named(
        "Open-file limit probe: ")
    assert runs, "the section names no results file"

    def load(paths):
        return [json.loads((REPO / p).read_text()) for p in paths]

    asides = [(name, json.loads((REPO / path).read_text()), path) for name, path in
              re.findall(r"^Aside, `([^`]+)`: `(bench/results/scale-[^`]+\.json)`\.$",
                         section, re.M)]
    rendered = scale.render(load(runs), runs, load(before), before,
                            load(fdlimit)[0] if fdlimit else None,
                            fdlimit[0] if fdlimit else None, asides)
    assert section == rendered  # edit bench/scale_report.py or scale_notes.md, then rerun it
