"""Metaflow's metadata service, emulated in memory: what a Batch node or a pod asks for when a
flow runs with `--metadata service`, as on a real deployment (Netflix/metaflow-service 2.5.1,
`services/metadata_service/api/*.py`: the routes, the bodies their docstrings publish and the
answers their handlers give; `services/data/models.py`: the rows' serialized fields).

Why here: with local metadata, an emulated node could read the launcher's metadata only from
a folder shared with the launcher's machine, which real nodes never have. With this service,
Metaflow's client in a task (metaflow-checkpoint's @checkpoint reads the run's tags with it at
task start) and the launcher reach the same metadata over HTTP, at `url`, which every node and
pod reaches (`netns.listen_address()`: the bridge's address when nodes are hosts).

Every route of the service that Metaflow 2.19's `ServiceMetadataProvider`, its heartbeat
sidecar and its client use is here; every body is checked against what the service's handler
reads (a JSON object, or a list of them for artifacts and metadata, with each field of the
type the service stores), and a request that fails the check gets the service's 400 with the
reason, so a client bug shows up as it would against the service. Objects are created as the
service's database does: run numbers and task ids from one sequence each, a run or a task named
by the client (a non-numeric `run_number` or `task_id`) kept as `run_id` / `task_name`, 409
when it exists already, and the read endpoints answer a task's or an artifact's request with
the run's tags. Not emulated: pagination cursors (every list fits one answer), the UI's
routes, authentication. `requests` records every call (method, path, status, the caller's
address: with nodes as hosts, a node's own) for the tests.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from . import netns

VERSION = "2.5.1"  # the METADATA_SERVICE_VERSION header: filtered_tasks needs 2.5.0
HEARTBEAT_WAIT_S = 10  # the service's WAIT_TIME: its answer to every heartbeat

_NAME = r"[^/]+"


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _now_ms() -> int:
    return int(round(time.time() * 1000))


# What each create handler of the service reads from its body, and the type it stores.
_STRING, _TAGS, _INT = "a string", "a list of strings", "an integer"
# metadata values: the service's text column takes a number as its text (Postgres casts it on
# insert), and Metaflow sends some as numbers (AWS Batch's parallel-node-index, @parallel's
# parallel-world-size)
_TEXT = "a string or a number"
_BODIES = {
    "flow": {"user_name": _STRING, "tags": _TAGS, "system_tags": _TAGS},
    "run": {"user_name": _STRING, "run_number": _STRING, "tags": _TAGS, "system_tags": _TAGS},
    "step": {"user_name": _STRING, "tags": _TAGS, "system_tags": _TAGS},
    "task": {"user_name": _STRING, "task_id": _STRING, "tags": _TAGS, "system_tags": _TAGS},
    "artifact": {"name": _STRING, "location": _STRING, "ds_type": _STRING, "sha": _STRING,
                 "type": _STRING, "content_type": _STRING, "attempt_id": _INT,
                 "user_name": _STRING, "tags": _TAGS, "system_tags": _TAGS},
    "metadata": {"field_name": _STRING, "value": _TEXT, "type": _STRING,
                 "user_name": _STRING, "tags": _TAGS, "system_tags": _TAGS},
}
# the fields a row cannot be stored without (NOT NULL in the service's schema)
_REQUIRED = {"artifact": ("name", "location", "ds_type", "sha", "type", "content_type",
                          "attempt_id"),
             "metadata": ("field_name", "value", "type")}


def check_body(kind: str, body: Any) -> dict:
    """`body` as the service's handler for a `kind` would store it, or Refused(400, why)."""
    if not isinstance(body, dict):
        raise Refused(400, "the body of a %s must be a JSON object, not %s"
                      % (kind, type(body).__name__))
    for field, expected in _BODIES[kind].items():
        value = body.get(field)
        if value is None:
            continue
        ok = {_STRING: lambda v: isinstance(v, str),
              _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
              _TAGS: lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v),
              _TEXT: lambda v: isinstance(v, (str, int, float)) and not isinstance(v, bool),
              }[expected](value)
        if not ok:
            named = body.get("field_name") or body.get("name")
            raise Refused(400, "%s%s.%s must be %s, not %r" % (
                kind, " %r" % named if isinstance(named, str) and field not in (
                    "name", "field_name") else "", field, expected, value))
    missing = [f for f in _REQUIRED.get(kind, ()) if body.get(f) is None]
    if missing:
        raise Refused(400, "a %s needs %s" % (kind, ", ".join(missing)))
    return body


class MetadataService:
    """The emulated service; `url` is METAFLOW_SERVICE_URL for the launcher and the nodes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.flows: dict[str, dict] = {}
        self.runs: dict[tuple[str, str], dict] = {}  # (flow, exposed run id) -> row
        self.steps: dict[tuple[str, str, str], dict] = {}
        self.tasks: dict[tuple[str, str, str, str], dict] = {}
        self.artifacts: dict[tuple[str, str, str, str], list[dict]] = {}
        self.metadata: dict[tuple[str, str, str, str], list[dict]] = {}
        self.requests: list[tuple[str, str, int, str]] = []
        self._run_number = 0
        self._task_id = 0
        self._metadata_id = 0
        self._routes = self._make_routes()
        self._server = ThreadingHTTPServer((netns.listen_address(), 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return "http://%s:%d" % (host, port)

    @property
    def env(self) -> dict[str, str]:
        """For a Metaflow run (the launcher's; Metaflow passes both on to its remote tasks)."""
        return {"METAFLOW_DEFAULT_METADATA": "service", "METAFLOW_SERVICE_URL": self.url}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    # -- routes ---------------------------------------------------------------------------

    def _make_routes(self) -> list[tuple[str, re.Pattern, Callable]]:
        run = r"/flows/(?P<flow>%s)/runs/(?P<run>%s)" % (_NAME, _NAME)
        step = run + r"/steps/(?P<step>%s)" % _NAME
        task = step + r"/tasks/(?P<task>%s)" % _NAME
        table = [
            ("GET", r"/ping", lambda q, b: "pong"),
            ("GET", r"/version", lambda q, b: VERSION),
            ("GET", r"/flows", lambda q, b: list(self.flows.values())),
            ("GET", r"/flows/(?P<flow>%s)" % _NAME, self._get_flow),
            ("POST", r"/flows/(?P<flow>%s)" % _NAME, self._create_flow),
            ("GET", r"/flows/(?P<flow>%s)/runs" % _NAME, self._get_runs),
            ("POST", r"/flows/(?P<flow>%s)/run" % _NAME, self._create_run),
            ("GET", run, self._get_run),
            ("POST", run + r"/heartbeat", self._run_heartbeat),
            ("PATCH", run + r"/tag/mutate", self._mutate_tags),
            ("GET", run + r"/steps", self._get_steps),
            ("GET", run + r"/artifacts", self._get_run_artifacts),
            ("GET", run + r"/metadata", self._get_run_metadata),
            ("GET", step, self._get_step),
            ("POST", step + r"/step", self._create_step),
            ("GET", step + r"/tasks", self._get_tasks),
            ("GET", step + r"/filtered_tasks", self._filtered_tasks),
            ("GET", step + r"/artifacts", self._get_step_artifacts),
            ("POST", step + r"/task", self._create_task),
            ("GET", task, self._get_task),
            ("POST", task + r"/heartbeat", self._task_heartbeat),
            ("GET", task + r"/artifacts", self._get_task_artifacts),
            ("GET", task + r"/attempt/(?P<attempt>\d+)/artifacts", self._get_task_artifacts),
            ("GET", task + r"/artifacts/(?P<name>%s)" % _NAME, self._get_artifact),
            ("GET", task + r"/artifacts/(?P<name>%s)/attempt/(?P<attempt>\d+)" % _NAME,
             self._get_artifact),
            ("POST", task + r"/artifact", self._create_artifacts),
            ("GET", task + r"/metadata", self._get_task_metadata),
            ("POST", task + r"/metadata", self._create_metadata),
        ]
        return [(method, re.compile(pattern + "$"), handler) for method, pattern, handler
                in table]

    def _handler(self):
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: `requests` has every call
                pass

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, answer = service._answer(method, parts.path, parse_qs(parts.query),
                                                 raw)
                service.requests.append((method, parts.path, status, self.client_address[0]))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("METADATA_SERVICE_VERSION", VERSION)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went first (a heartbeat sidecar stopped mid-request)

            def do_GET(self):  # noqa: N802 (http.server's names)
                self._serve("GET")

            def do_POST(self):  # noqa: N802
                self._serve("POST")

            def do_PATCH(self):  # noqa: N802
                self._serve("PATCH")

        return Handler

    def _answer(self, method: str, path: str, query: dict, raw: bytes) -> tuple[int, Any]:
        path = path.rstrip("/") or "/"
        allowed = False
        for route_method, pattern, handler in self._routes:
            found = pattern.match(path)
            if not found:
                continue
            if route_method != method:
                allowed = True
                continue
            try:
                body = json.loads(raw) if raw.strip() else {}
            except ValueError:
                return 400, {"message": "the body is not JSON"}
            try:
                with self._lock:
                    return 200, handler(dict(found.groupdict(), **{
                        k: v[-1] for k, v in query.items()}), body)
            except Refused as refused:
                return refused.status, {"message": refused.message}
        return (405, {"message": "%s is not allowed on %s" % (method, path)}) if allowed \
            else (404, {"message": "no route %s" % path})

    # -- objects --------------------------------------------------------------------------

    def _flow(self, q: dict) -> dict:
        if q["flow"] not in self.flows:
            raise Refused(404, "no flow %s" % q["flow"])
        return self.flows[q["flow"]]

    def _run(self, q: dict) -> dict:
        self._flow(q)
        row = self.runs.get((q["flow"], q["run"]))
        if row is None:
            raise Refused(404, "no run %s/%s" % (q["flow"], q["run"]))
        return row

    def _step(self, q: dict) -> dict:
        run = self._run(q)
        row = self.steps.get((q["flow"], str(run["run_number"]), q["step"]))
        if row is None:
            raise Refused(404, "no step %s/%s/%s" % (q["flow"], q["run"], q["step"]))
        return row

    def _task_key(self, q: dict) -> tuple[str, str, str, str]:
        step = self._step(q)
        key = (q["flow"], str(step["run_number"]), q["step"], q["task"])
        if key not in self.tasks:
            raise Refused(404, "no task %s/%s/%s/%s" % (q["flow"], q["run"], q["step"],
                                                        q["task"]))
        return key

    def _with_run_tags(self, row: dict) -> dict:
        """A read endpoint's task or artifact: with its run's tags, as the service answers."""
        run = self.runs[(row["flow_id"], str(row["run_number"]))]
        return dict(row, tags=run["tags"], system_tags=run["system_tags"])

    def _get_flow(self, q, body):
        return self._flow(q)

    def _create_flow(self, q, body):
        body = check_body("flow", body)
        if q["flow"] in self.flows:
            raise Refused(409, "flow %s exists" % q["flow"])
        row = {"flow_id": q["flow"], "user_name": body.get("user_name"),
               "ts_epoch": _now_ms(), "tags": body.get("tags") or [],
               "system_tags": body.get("system_tags") or []}
        self.flows[q["flow"]] = row
        return row

    def _get_runs(self, q, body):
        self._flow(q)
        return [r for (flow, _), r in self.runs.items() if flow == q["flow"]]

    def _create_run(self, q, body):
        body = check_body("run", body)
        self._flow(q)
        named = body.get("run_number")
        if named and named.isnumeric():
            raise Refused(400, "provided run_id may not be a numeric")
        if named and (q["flow"], named) in self.runs:
            raise Refused(409, "run %s/%s exists" % (q["flow"], named))
        self._run_number += 1
        exposed = named or str(self._run_number)
        # the exposed id: the name a client gave, else the number (a JSON number, as the
        # service's integer column)
        row = {"flow_id": q["flow"], "run_number": named or self._run_number,
               "user_name": body.get("user_name"), "ts_epoch": _now_ms(),
               "tags": body.get("tags") or [], "system_tags": body.get("system_tags") or [],
               "last_heartbeat_ts": None}
        self.runs[(q["flow"], exposed)] = row
        return row

    def _get_run(self, q, body):
        return self._run(q)

    def _run_heartbeat(self, q, body):
        self._run(q)["last_heartbeat_ts"] = int(time.time())
        return json.dumps({"wait_time_in_seconds": HEARTBEAT_WAIT_S})

    def _mutate_tags(self, q, body):
        if not isinstance(body, dict):
            raise Refused(400, "the body must be a JSON object")
        add, remove = body.get("tags_to_add", []), body.get("tags_to_remove", [])
        if not isinstance(add, list):
            raise Refused(400, "tags_to_add must be a list")
        if not isinstance(remove, list):
            raise Refused(400, "tags_to_remove must be a list")
        if not all(isinstance(t, str) for t in add + remove):
            raise Refused(400, "All tag values must be strings")
        run = self._run(q)
        system = set(run["system_tags"])
        if set(remove) & system:
            raise Refused(422, "Cannot remove tags that are existing system tags %s"
                          % (set(remove) & system))
        run["tags"] = sorted((set(run["tags"]) - set(remove)) | (set(add) - system))
        return {"tags": run["tags"]}

    def _get_steps(self, q, body):
        run = self._run(q)
        return [s for (flow, number, _), s in self.steps.items()
                if (flow, number) == (q["flow"], str(run["run_number"]))]

    def _get_step(self, q, body):
        return self._step(q)

    def _create_step(self, q, body):
        body = check_body("step", body)
        run = self._run(q)
        key = (q["flow"], str(run["run_number"]), q["step"])
        if key in self.steps:
            raise Refused(409, "step %s/%s/%s exists" % key)
        row = {"flow_id": q["flow"], "run_number": run["run_number"], "step_name": q["step"],
               "user_name": body.get("user_name"), "ts_epoch": _now_ms(),
               "tags": body.get("tags") or [], "system_tags": body.get("system_tags") or []}
        self.steps[key] = row
        return row

    def _get_tasks(self, q, body):
        step = self._step(q)
        return [self._with_run_tags(t) for (f, r, s, _), t in self.tasks.items()
                if (f, r, s) == (q["flow"], str(step["run_number"]), q["step"])]

    def _filtered_tasks(self, q, body):
        """Task pathspecs whose metadata field matches the pattern (an unanchored search, as
        the service's SQL regex match)."""
        step = self._step(q)
        field, pattern = q.get("metadata_field_name"), q.get("pattern")
        found = []
        for (f, r, s, t), task in self.tasks.items():
            if (f, r, s) != (q["flow"], str(step["run_number"]), q["step"]):
                continue
            entries = self.metadata.get((f, r, s, t), [])
            if (field is None and pattern is None) or any(
                    (field is None or m["field_name"] == field)
                    and (pattern is None or re.search(pattern, m["value"]))
                    for m in entries):
                found.append("%s/%s/%s/%s" % (f, r, s, t))
        return found

    def _create_task(self, q, body):
        body = check_body("task", body)
        step = self._step(q)
        named = body.get("task_id")
        if named and named.isnumeric():
            raise Refused(400, "provided task_name may not be a numeric")
        if named and (q["flow"], str(step["run_number"]), q["step"], named) in self.tasks:
            raise Refused(409, "task %s exists" % named)
        self._task_id += 1
        exposed = named or str(self._task_id)
        row = {"flow_id": q["flow"], "run_number": step["run_number"], "step_name": q["step"],
               "task_id": named or self._task_id, "user_name": body.get("user_name"), "ts_epoch": _now_ms(),
               "tags": body.get("tags") or [], "system_tags": body.get("system_tags") or [],
               "last_heartbeat_ts": None}
        self.tasks[(q["flow"], str(step["run_number"]), q["step"], exposed)] = row
        return self._with_run_tags(row)

    def _get_task(self, q, body):
        return self._with_run_tags(self.tasks[self._task_key(q)])

    def _task_heartbeat(self, q, body):
        key = self._task_key(q)
        now = int(time.time())
        self.tasks[key]["last_heartbeat_ts"] = now
        self.runs[key[:2]]["last_heartbeat_ts"] = now
        return json.dumps({"wait_time_in_seconds": HEARTBEAT_WAIT_S})

    @staticmethod
    def _latest_attempt(rows: list[dict]) -> list[dict]:
        latest: dict[str, int] = {}
        for row in rows:
            latest[row["task_id"]] = max(row["attempt_id"], latest.get(row["task_id"], 0))
        return [row for row in rows if row["attempt_id"] == latest[row["task_id"]]]

    def _get_task_artifacts(self, q, body):
        rows = self.artifacts.get(self._task_key(q), [])
        if "attempt" in q:
            rows = [r for r in rows if r["attempt_id"] == int(q["attempt"])]
        else:
            rows = self._latest_attempt(rows)
        return [self._with_run_tags(r) for r in rows]

    def _get_artifact(self, q, body):
        rows = [r for r in self.artifacts.get(self._task_key(q), []) if r["name"] == q["name"]]
        if "attempt" in q:
            rows = [r for r in rows if r["attempt_id"] == int(q["attempt"])]
        if not rows:
            raise Refused(404, "no artifact %s" % q["name"])
        return self._with_run_tags(max(rows, key=lambda r: r["attempt_id"]))

    def _get_step_artifacts(self, q, body):
        step = self._step(q)
        rows = [r for (f, run, s, _), rs in self.artifacts.items() for r in rs
                if (f, run, s) == (q["flow"], str(step["run_number"]), q["step"])]
        return [self._with_run_tags(r) for r in self._latest_attempt(rows)]

    def _get_run_artifacts(self, q, body):
        run = self._run(q)
        rows = [r for (f, number, _, _), rs in self.artifacts.items() for r in rs
                if (f, number) == (q["flow"], str(run["run_number"]))]
        return [self._with_run_tags(r) for r in self._latest_attempt(rows)]

    def _create_artifacts(self, q, body):
        try:
            key = self._task_key(q)
        except Refused:
            raise Refused(400, "need to register run_id and task_id first") from None
        if not isinstance(body, list):
            raise Refused(400, "the body of artifacts must be a JSON list")
        rows = [check_body("artifact", item) for item in body]
        stored = self.artifacts.setdefault(key, [])
        for item in rows:
            stored.append({
                "flow_id": key[0], "run_number": self.tasks[key]["run_number"],
                "step_name": key[2], "task_id": self.tasks[key]["task_id"],
                "name": item["name"], "location": item["location"],
                "ds_type": item["ds_type"], "sha": item["sha"], "type": item["type"],
                "content_type": item["content_type"], "user_name": item.get("user_name"),
                "attempt_id": item["attempt_id"], "ts_epoch": _now_ms(),
                "tags": item.get("tags") or [], "system_tags": item.get("system_tags") or []})
        return {}

    def _get_task_metadata(self, q, body):
        return list(self.metadata.get(self._task_key(q), []))

    def _get_run_metadata(self, q, body):
        run = self._run(q)
        return [m for (f, number, _, _), ms in self.metadata.items() for m in ms
                if (f, number) == (q["flow"], str(run["run_number"]))]

    def _create_metadata(self, q, body):
        try:
            key = self._task_key(q)
        except Refused:
            raise Refused(400, "need to register run_id and task_id first") from None
        if not isinstance(body, list):
            raise Refused(400, "the body of metadata must be a JSON list")
        rows = [check_body("metadata", item) for item in body]
        stored = self.metadata.setdefault(key, [])
        for item in rows:
            self._metadata_id += 1
            stored.append({
                "id": self._metadata_id, "flow_id": key[0],
                "run_number": self.tasks[key]["run_number"], "step_name": key[2],
                "task_id": self.tasks[key]["task_id"], "field_name": item["field_name"],
                "value": str(item["value"]), "type": item["type"],
                "user_name": item.get("user_name"), "ts_epoch": _now_ms(),
                "tags": item.get("tags") or [], "system_tags": item.get("system_tags") or []})
        return {}
