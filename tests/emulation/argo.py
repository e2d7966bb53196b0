"""What Argo Workflows does with a compiled workflow, for tests: find a template, fill in a
resource template's manifest the way Argo's substitution does before it creates the resource,
validate the Workflow against Argo's published JSON schema, and normalise `--only-json`
output for golden files.

Filling in covers what the gang's JobSet template uses: simple tags (`{{workflow.name}}`,
`{{inputs.parameters.<name>}}`) and the expressions (`{{=...}}`) our compiler writes, which use
string literals, `+`, `inputs.parameters['<name>']` and the sprig functions `sha256sum` and
`trunc`; their meaning in expr-lang is Python's, so they are evaluated with Python here. Any
other tag is an error: a test would not notice a value Argo fills in that this does not."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

import jsonschema

SCHEMA_FILE = Path(__file__).parent / "schemas" / "argo-workflows-schema.json"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_TAG = re.compile(r"\{\{(=?)(.*?)\}\}")


def workflow(stdout: str) -> dict:
    """The WorkflowTemplate `argo-workflows create --only-json` printed."""
    return json.loads(stdout[stdout.index("{"):])


def template(wf: dict, name: str) -> dict:
    [found] = [t for t in wf["spec"]["templates"] if t["name"] == name]
    return found


def dag_task(wf: dict, name: str) -> dict:
    found = [task for t in wf["spec"]["templates"] for task in (t.get("dag") or {}).get(
        "tasks", []) if task["name"] == name]
    assert len(found) == 1, "DAG task %r: %d found" % (name, len(found))
    return found[0]


class _Sprig:
    @staticmethod
    def sha256sum(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    @staticmethod
    def trunc(length: int, text: str) -> str:
        return text[:length]


def fill(text: str, workflow_name: str, parameters: dict[str, str]) -> str:
    """`text` with Argo's tags replaced, as Argo does in a template of workflow
    `workflow_name` called with `parameters` (its inputs)."""
    scope = {"sprig": _Sprig, "inputs": SimpleNamespace(parameters=dict(parameters)),
             "workflow": SimpleNamespace(name=workflow_name), "__builtins__": {}}

    def replace(match):
        expression, body = match.group(1), match.group(2).strip()
        if expression:
            return str(eval(body, scope))  # noqa: S307 - our compiler's own expressions
        if body == "workflow.name":
            return workflow_name
        if body.startswith("inputs.parameters."):
            return parameters[body[len("inputs.parameters."):]]
        raise AssertionError("an Argo tag this test does not fill in: {{%s}}" % body)

    return _TAG.sub(replace, text)


def manifest(wf: dict, name: str, workflow_name: str, parameters: dict[str, str]) -> dict:
    """What the resource template `name` creates, filled in."""
    resource = template(wf, name)["resource"]
    return json.loads(fill(resource["manifest"], workflow_name, parameters))


def jobset(wf: dict, step: str, workflow_name: str, parameters: dict[str, str]) -> dict:
    """The JobSet the step's resource template creates, filled in."""
    return manifest(wf, step, workflow_name, parameters)


def network_policy(wf: dict, step: str, workflow_name: str, parameters: dict[str, str]) -> dict:
    """The NetworkPolicy the template beside the gang step's creates, filled in (Argo adds
    the Workflow as its owner when it creates it: setOwnerReference)."""
    return manifest(wf, step + "-gang-policy", workflow_name, parameters)


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def validate_workflow(wf: dict) -> None:
    """Raises with every violation of Argo's published schema for a WorkflowTemplate."""
    published = _schema()
    definitions = dict(published["definitions"])
    # IntOrString (Kubernetes' intstr) is an integer or a string, as its name and Go type say
    # and the API server accepts; the published JSON schema writes it as a string only.
    definitions[_INT_OR_STRING] = {"type": ["integer", "string"]}
    schema = {"$schema": published["$schema"], "definitions": definitions,
              "$ref": "#/definitions/io.argoproj.workflow.v1alpha1.WorkflowTemplate"}
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(_pruned(wf)), key=lambda e: list(e.absolute_path))
    assert not errors, "; ".join(
        "%s: %s" % ("/".join(str(p) for p in e.absolute_path) or "<root>", e.message)
        for e in errors[:10])


def _pruned(tree):
    """Without nulls, as the API server stores it (Metaflow's compiler writes null fields)."""
    if isinstance(tree, dict):
        return {k: _pruned(v) for k, v in tree.items() if v is not None}
    if isinstance(tree, list):
        return [_pruned(v) for v in tree]
    return tree


def normalised(stdout: str, endpoint_url: str) -> str:
    """`--only-json` output with what changes between compiles (code package, moto's port,
    random file names, times, versions) replaced by placeholders, and each
    resource template's manifest shown parsed (it is JSON) so that a change reads well."""
    wf = workflow(stdout)
    for t in wf["spec"]["templates"]:
        if "resource" in t:
            t["resource"]["manifest"] = json.loads(t["resource"]["manifest"])
    text = json.dumps(wf, indent=1, sort_keys=True)
    replacements = [
        (re.escape(endpoint_url), "<moto>"),
        (r"data/[0-9a-f]{2}/[0-9a-f]{40}", "data/<package>"),
        (r"\b[0-9a-f]{40}\b", "<sha>"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00", "<time>"),
        (r"set_parameters [a-z]{10} (.*?)&& \. `pwd`/[a-z]{10}",
         r"set_parameters <file> \1&& . `pwd`/<file>"),
        (r"image=python:3\.\d+", "image=python:<version>"),
        (r'"image": "python:3\.\d+"', '"image": "python:<version>"'),
    ]
    for pattern, placeholder in replacements:
        text = re.sub(pattern, placeholder, text)
    return json.dumps(_without_versions(json.loads(text)), indent=1, sort_keys=True) + "\n"


def _without_versions(tree):
    """METAFLOW_VERSION's value (the platform, Python and Metaflow of the compiling machine)
    as a placeholder, wherever a container's environment has it."""
    if isinstance(tree, dict):
        if tree.get("name") == "METAFLOW_VERSION" and "value" in tree:
            return dict(tree, value="<versions>")
        return {k: _without_versions(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_without_versions(v) for v in tree]
    return tree
