"""The documentation site builds with `mkdocs build --strict`: no broken link or anchor, no page
missing from the nav, no nav entry without its page."""

import re
import subprocess
import sys

import yaml

from tests.support import REPO


def build(site_dir):
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
         "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(site_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=300)


def test_site_builds_strict_without_warnings(tmp_path):
    res = build(tmp_path / "site")
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    assert not re.search(r"^(WARNING|ERROR)", log, re.M), log
    pages = sorted(p.relative_to(REPO / "docs") for p in (REPO / "docs").rglob("*.md"))
    for page in pages:
        html = tmp_path / "site" / page.with_suffix("") / "index.html"
        if page.name == "index.md":
            html = tmp_path / "site" / page.parent / "index.html"
        assert html.exists(), "no HTML page built for docs/%s" % page


def test_strict_mode_and_link_checks_are_on():
    # mkdocs.yml uses no custom YAML tags, so a plain safe_load reads it.
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["strict"] is True
    checks = config["validation"]
    assert checks["nav"] == {"omitted_files": "warn", "not_found": "warn", "absolute_links": "warn"}
    assert checks["links"] == {"not_found": "warn", "anchors": "warn", "absolute_links": "warn",
                               "unrecognized_links": "warn"}


def test_a_broken_anchor_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [nowhere](other.md#no-such-heading).\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    config = tmp_path / "mkdocs.yml"
    text = (REPO / "mkdocs.yml").read_text()
    config.write_text(text.split("\nnav:")[0] + "\nnav:\n  - index.md\n  - other.md\n")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          str(config), "--site-dir", str(tmp_path / "site")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "no-such-heading" in res.stdout + res.stderr
