"""Every flow shown in README.md and docs/ runs as shown."""

import re

import pytest

from tests.support import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def flow_blocks():
    for doc in DOCS:
        for i, block in enumerate(BLOCK.findall(doc.read_text())):
            if "(FlowSpec)" in block and "__main__" in block:
                yield pytest.param(block, id="%s-%d" % (doc.name, i))


@pytest.mark.parametrize("code", list(flow_blocks()))
def test_doc_flow_runs(flow_runner, code):
    (flow_runner.root / "doc_flow.py").write_text(code)
    res = flow_runner.run("doc_flow.py")
    assert res.returncode == 0, res


def test_doc_links_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            if target.startswith("http"):
                continue
            assert (doc.parent / target).exists(), "%s links to missing %s" % (doc.name, target)


def test_doc_flow_found():
    assert list(flow_blocks()), "README.md must show a runnable flow"
