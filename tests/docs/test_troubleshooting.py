"""docs/troubleshooting.md covers every error class of the package and every message it
raises or prints: the page must quote five consecutive words of each message's fixed text (or
all of it, when no piece between placeholders is that long), so a new message fails this test
until it is documented."""

import ast
import re

import pytest

from tests.support import REPO

PACKAGE = REPO / "metaflow_extensions" / "torch_distributed"
PAGE = REPO / "docs" / "troubleshooting.md"
# printf-style placeholders: %s, %d, %r, %.2f, %ss (seconds), %%
PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfx%]")
# Calls whose string arguments are messages a user can see.
MESSAGE_CALL = re.compile(r"(Error|Exception|Failure|Timeout|Mismatch|Aborted|Failed|^compile_error)$")
# Functions that compose the text of a failure (its place, what happened, who was stopped,
# the hints of the group check, notes written for a process that died).
MESSAGE_FUNCTION = re.compile(
    r"^(describe|what|brief|where|diagnose|explain_error|spawn_message|_hints|_opt_out)$|_note$")


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "mfextinit" not in p.name)


def normalize(text):
    return " ".join(text.split())


def page_text():
    return normalize(PAGE.read_text())


def strings_in(node):
    """The fixed text of the string expressions in `node`: constants, the format of `"..." % x`,
    the constant parts of f-strings."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.append(sub.value)
    return found


def called_name(call):
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def is_stderr_print(call):
    return called_name(call) == "print" and any(
        kw.arg == "file" and "stderr" in ast.unparse(kw.value) for kw in call.keywords)


def is_super_init(call):
    return called_name(call) == "__init__" and "super()" in ast.unparse(call.func)


def messages():
    """(module, message format) for every user-visible message of the package."""
    found = []
    for path in modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and MESSAGE_FUNCTION.search(node.name):
                found += [(path.name, s) for s in strings_in(node)
                          if s != ast.get_docstring(node, clean=False)]
            elif isinstance(node, ast.Raise) and node.exc is not None:
                found += [(path.name, s) for s in strings_in(node.exc)]
            elif isinstance(node, ast.Call) and (
                    MESSAGE_CALL.search(called_name(node)) or is_stderr_print(node)
                    or is_super_init(node)):
                found += [(path.name, s) for s in strings_in(node)]
    # Keep messages with fixed text to quote, not keys, labels or bare formats like "%s: %s".
    return sorted({(m, s) for m, s in found if fragments(s)})


def fragments(message):
    """Pieces of fixed text of a message, three words or longer."""
    pieces = []
    for piece in PLACEHOLDER.split(message):
        # sentences, clauses in parentheses, and the text around *step* names
        for part in re.split(r"(?<=[.:;])\s|\n|\s\(|\)\s?|\*", piece):
            part = normalize(part.strip(" .,:;()"))
            if len(part.split()) >= 3:
                pieces.append(part)
    return pieces


def quotes(message):
    """What the page may quote to cover `message`: any five consecutive words of a piece of
    fixed text, or, when no piece has five words, the longest piece."""
    pieces = fragments(message)
    windows = [" ".join(words[i:i + 5]) for words in (p.split() for p in pieces)
               for i in range(len(words) - 4)]
    return windows or [max(pieces, key=len)]


def error_classes():
    """Names of the exception classes the package defines, with their headlines."""
    classes = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    re.search(r"(Exception|Error|Mismatch|Aborted|Failed|Timeout)$", ast.unparse(b))
                    for b in node.bases):
                headline = None
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "headline":
                        headline = stmt.value.value
                classes[node.name] = headline
    return classes


def test_the_scan_finds_the_messages_it_must():
    found = [m for _, m in messages()]
    assert any("is not a whole number" in m for m in found)
    assert any("did not join the gang" in m for m in found)
    assert any("exists only inside a step decorated" in m for m in found)
    assert any("was killed by" in m for m in found)
    assert any("without joining the gang's process group" in m for m in found)
    assert any("died without a word" in m for m in found)
    assert "TorchDistributedGangFailed" in error_classes()
    assert "GangMismatch" in error_classes()


@pytest.mark.parametrize("name", sorted(error_classes()))
def test_every_error_class_is_documented(name):
    text = page_text()
    assert name in text, "docs/troubleshooting.md does not mention %s" % name
    headline = error_classes()[name]
    if headline:
        assert headline in text, "docs/troubleshooting.md does not show the headline %r" % headline


@pytest.mark.parametrize("module, message", messages(),
                         ids=["%s: %s" % (m, s[:50]) for m, s in messages()])
def test_every_message_is_documented(module, message):
    text = page_text()
    candidates = quotes(message)
    assert any(q in text for q in candidates), (
        "docs/troubleshooting.md quotes no part of this message of %s: %r\n"
        "quote five consecutive words of it, e.g. %r" % (module, message, candidates[0]))
