"""What Step Functions does with a compiled state machine, for tests: find a state, turn a
SubmitJob state's PascalCase parameters into the AWS Batch API's input (filling the JSONPath
values Step Functions would), and normalise `--only-json` output for golden files."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

# Keys whose values are maps of user data (kept as they are) in a SubmitJob state.
_DATA_KEYS = ("Parameters", "Tags")


def state_machine(stdout: str) -> dict:
    """The state machine `step-functions create --only-json` printed."""
    return json.loads(stdout[stdout.index("{"):])


def states(machine: dict) -> Iterator[tuple[str, dict]]:
    """Every (name, state) of the machine, inside Map and Parallel states too."""
    for name, state in machine["States"].items():
        yield name, state
        if "Iterator" in state:
            yield from states(state["Iterator"])
        if "ItemProcessor" in state:
            yield from states(state["ItemProcessor"])
        for branch in state.get("Branches", []):
            yield from states(branch)


def state(machine: dict, name: str) -> dict:
    found = [s for n, s in states(machine) if n == name]
    assert len(found) == 1, "state %r: %d found" % (name, len(found))
    return found[0]


def submit_job_input(parameters: dict, filled: dict[str, str]) -> dict:
    """The AWS Batch SubmitJob input a `batch:submitJob.sync` state sends: Step Functions writes
    the API's members in PascalCase; a key ending in `.$` is a JSONPath whose value `filled`
    gives (by path, e.g. "$.JobId")."""
    return {_camel(k): _value(k, v, filled) for k, v in parameters.items()}


def _value(key, value, filled):
    if key in _DATA_KEYS:
        return {_plain(k): filled[v] if k.endswith(".$") else v for k, v in value.items()}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out[_camel(_plain(k))] = filled[v] if k.endswith(".$") else _value(k, v, filled)
        return out
    if isinstance(value, list):
        return [_value(key, v, filled) for v in value]
    return value


def _plain(key):
    return key[:-2] if key.endswith(".$") else key


def _camel(key):
    return key[:1].lower() + key[1:]


def normalised(stdout: str, endpoint_url: str) -> str:
    """`--only-json` output with what changes between runs (code package, job definition,
    token, moto's port, random file names, versions) replaced by placeholders."""
    text = json.dumps(state_machine(stdout), indent=1, sort_keys=True)
    replacements = [
        (re.escape(endpoint_url), "<moto>"),
        (r"data/[0-9a-f]{2}/[0-9a-f]{40}", "data/<package>"),
        (r"\b[0-9a-f]{40}\b", "<sha>"),
        (r"job-definition/metaflow_[0-9a-f]+:\d+", "job-definition/<definition>"),
        (r"(deploy[a-z]+flow)-\d+-[a-z]{4}", r"\1-<token>"),
        (r"(parameters|parent_tasks) [a-z]{10} && \. `pwd`/[a-z]{10}", r"\1 <file> && . `pwd`/<file>"),
        (r"image=python:3\.\d+", "image=python:<version>"),
        (r'"metaflow\.version": "[^"]+"', '"metaflow.version": "<metaflow>"'),
    ]
    for pattern, placeholder in replacements:
        text = re.sub(pattern, placeholder, text)
    machine = json.loads(text)
    for _, s in states(machine):
        for overrides in _container_overrides(s):
            for entry in overrides.get("Environment", []):
                if entry["Name"] == "METAFLOW_VERSION":
                    entry["Value"] = "<versions>"
    return json.dumps(machine, indent=1, sort_keys=True) + "\n"


def _container_overrides(s):
    params = s.get("Parameters", {})
    if "ContainerOverrides" in params:
        yield params["ContainerOverrides"]
    for node in params.get("NodeOverrides", {}).get("NodePropertyOverrides", []):
        yield node["ContainerOverrides"]
