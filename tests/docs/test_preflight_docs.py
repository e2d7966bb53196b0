"""docs/troubleshooting.md quotes every message of the preflight's checks (a failed or unknown
finding, preflight*.py), as tests/docs/test_troubleshooting.py does for errors; and the
backends' pages start with the preflight."""

import ast

import pytest

from tests.docs.test_troubleshooting import (PACKAGE, called_name, fragments, page_text, quotes,
                                             strings_in)
from tests.support import REPO

FINDINGS = ("failed", "unknown")


def finding_messages():
    """(module, message format) of every failed() and unknown() finding of the preflight."""
    found = []
    for path in sorted(PACKAGE.rglob("preflight/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and called_name(node) in FINDINGS and \
                    len(node.args) >= 3:
                found += [(path.name, s) for s in strings_in(node.args[2]) if fragments(s)]
    return sorted(set(found))


def test_the_scan_finds_the_preflight_messages():
    found = [m for _, m in finding_messages()]
    assert any("allows all traffic" in m for m in found), found
    assert any("is Fargate" in m for m in found), found


@pytest.mark.parametrize("module, message", finding_messages())
def test_every_preflight_message_is_quoted(module, message):
    text = page_text()
    assert any(q in text for q in quotes(message)), (
        "docs/troubleshooting.md does not quote the preflight message of %s: %r (quote one of "
        "%r)" % (module, message, quotes(message)[:3]))


@pytest.mark.parametrize("page", ["aws-batch.md", "kubernetes.md", "slurm.md"])
def test_the_backend_pages_start_with_the_preflight(page):
    text = (REPO / "docs" / page).read_text()
    first = text.split("\n## ", 2)[1]
    assert first.startswith("First remote run"), "%s: the first section is %r" % (
        page, first.splitlines()[0])
    assert "torch-distributed preflight" in first
