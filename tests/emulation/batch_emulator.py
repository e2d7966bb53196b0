"""A local AWS Batch that runs jobs as processes, for tests.

boto3 clients reach it through `AWS_ENDPOINT_URL_BATCH` (botocore's per-service endpoint)
while every other service stays on moto through `AWS_ENDPOINT_URL`. The emulator answers
the job operations itself (see `batch_api.BatchApi.operations`) and forwards the other
Batch operations (job queues, compute environments) to moto unchanged.

It also stands in for the network a container sees: nodes get `http_proxy` pointing here,
so calls to the EC2 instance metadata service (169.254.169.254, which Metaflow's @batch
makes from inside the job) are answered 404 locally and nothing leaves 127.0.0.1 (with
TD_EMULATION_HOSTS=1, the emulation's bridge: netns.py).

    with BatchEmulator(aws.endpoint_url, image_env=aws.container_env) as batch:
        env = {**aws.env, **batch.env}   # for boto3 clients or a Metaflow run
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import boto3

from . import netns
from .batch_api import BatchApi, upstream_queue_lookup
from .batch_jobs import JobBoard, NodeRunner
from .batch_spec import BatchClientError
from .hosts import host_address

UPSTREAM_TIMEOUT_S = 30
# Hop-by-hop or recomputed headers that must not be copied from moto's response.
_DROPPED_HEADERS = {"connection", "content-length", "transfer-encoding", "keep-alive"}


class EmulatorError(Exception):
    """The emulator itself failed (a bug here, not a rejected request)."""


def _json(status: int, payload: dict, headers: dict) -> tuple[int, bytes, dict]:
    """An AWS REST-JSON answer; errors name their type in x-amzn-ErrorType."""
    return status, json.dumps(payload).encode(), {**headers, "Content-Type": "application/json"}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self._dispatch()

    do_GET = do_PUT = do_DELETE = do_POST

    def do_CONNECT(self) -> None:
        # An HTTPS request from a node to some outside host: refuse the tunnel.
        self.server.emulator.sunk_requests.append("CONNECT " + self.path)
        self._reply(403, b"", {})

    def log_message(self, format: str, *args) -> None:
        """Quiet: failures surface as API errors or in `BatchEmulator.errors`."""

    def _dispatch(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        emulator = self.server.emulator
        if self.path.startswith("http://"):
            # A node's request through `http_proxy`: instance metadata and the like.
            emulator.sunk_requests.append("%s %s" % (self.command, self.path))
            self._reply(404, b"", {})
            return
        try:
            self._reply(*self._answer(emulator, body))
        # The HTTP boundary: report the emulator's own bugs instead of dropping the connection.
        except Exception:
            emulator.errors.append(traceback.format_exc())
            self._reply_json(
                500, {"message": "emulator error"}, {"x-amzn-ErrorType": "ServerException"}
            )

    def _answer(self, emulator: BatchEmulator, body: bytes) -> tuple[int, bytes, dict]:
        operation = self.path.rstrip("/").rsplit("/", 1)[-1]
        handler = emulator.api.operations.get(operation) if self.path.startswith("/v1/") else None
        if handler is None:
            return emulator.forward(self.command, self.path, self.headers, body)
        try:
            result = handler(json.loads(body or b"{}"))
        except BatchClientError as error:
            return _json(400, {"message": str(error)}, {"x-amzn-ErrorType": "ClientException"})
        return _json(200, result, {})

    def _reply_json(self, status: int, payload: dict, headers: dict) -> None:
        self._reply(*_json(status, payload, headers))

    def _reply(self, status: int, body: bytes, headers: dict) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    emulator: BatchEmulator


class BatchEmulator:
    """AWS Batch on 127.0.0.1 that runs every node of a job as a local process group, or,
    with TD_EMULATION_HOSTS=1, on the bridge of netns.py, every node a host of its own.

    Parameters
    ----------
    upstream_url : moto's endpoint; queues and compute environments are read from it.
    image_env : what the container image and host provide (credentials, endpoints).
    hold_nodes : node indices of multinode jobs that stay in STARTING forever.
    workdir : where node working directories and logs go; a temporary one by default.
    transition_s : time a job spends in each state before RUNNING.
    stop_grace_s : SIGTERM to SIGKILL delay when nodes are stopped (ECS uses 30 s).
    poll_s : how often the scheduler advances jobs and polls node processes.
    region, account_id : what job and job definition ARNs are made of.
    loopback_hostname_nodes : node indices whose hostname resolves to 127.0.1.1, as in an
        image whose /etc/hosts maps it there (Debian's and Ubuntu's default).
    """

    def __init__(
        self,
        upstream_url: str,
        *,
        image_env: dict[str, str] | None = None,
        hold_nodes: Collection[int] = (),
        workdir: Path | None = None,
        transition_s: float = 0.05,
        stop_grace_s: float = 2.0,
        poll_s: float = 0.05,
        region: str = "us-east-1",
        account_id: str = "123456789012",
        loopback_hostname_nodes: Collection[int] = (),
    ) -> None:
        self._upstream = urlsplit(upstream_url)
        self._image_env = dict(image_env or {})
        self._hold_nodes = frozenset(hold_nodes)
        self._owns_root = workdir is None
        self._root = Path(workdir) if workdir is not None else None
        self._transition_s = transition_s
        self._stop_grace_s = stop_grace_s
        self._poll_s = poll_s
        self._region = region
        self._account_id = account_id
        self._loopback_hostname_nodes = frozenset(loopback_hostname_nodes)
        self._hosts = netns.network() if netns.enabled() else None
        self._server: _Server | None = None
        self._endpoint_url = ""
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.errors: list[str] = []
        self.sunk_requests: list[str] = []
        self.api: BatchApi | None = None
        self._runner: NodeRunner | None = None
        self._board: JobBoard | None = None

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> BatchEmulator:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="batch-emulator-"))
        self._server = _Server((netns.listen_address(), 0), _Handler)
        self._server.emulator = self
        host, port = self._server.server_address[:2]
        self._endpoint_url = "http://%s:%d" % (host, port)
        self._runner = NodeRunner(root=self._root, base_env=self._node_base_env(),
                                  main_node_address=host_address(),
                                  loopback_hostname_nodes=self._loopback_hostname_nodes,
                                  hosts=self._hosts)
        self._board = JobBoard(
            self._runner,
            hold_nodes=self._hold_nodes,
            transition_s=self._transition_s,
            stop_grace_s=self._stop_grace_s,
        )
        upstream_batch = boto3.client(
            "batch",
            endpoint_url=self._upstream.geturl(),
            region_name=self._region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        self.api = BatchApi(
            self._board, upstream_queue_lookup(upstream_batch), self._region, self._account_id
        )
        self._threads = [
            threading.Thread(target=self._server.serve_forever, args=(0.1,), daemon=True),
            threading.Thread(target=self._schedule, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        """Stops serving, stops every node process (bounded) and removes the temp dir."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._stop_processes()
        self._server = None
        if self._owns_root:
            shutil.rmtree(self._root, ignore_errors=True)
        if self.errors:
            raise EmulatorError("batch emulator failed:\n" + "\n".join(self.errors))

    def _schedule(self) -> None:
        while not self._stopping.wait(self._poll_s):
            try:
                self.api.tick()
            # Kept for close() to raise, instead of the thread dying silently.
            except Exception:
                self.errors.append(traceback.format_exc())
                return

    def _stop_processes(self) -> None:
        processes = self._board.processes()
        started = time.monotonic()
        for process in processes:
            process.request_stop(started, self._stop_grace_s)
        while time.monotonic() - started < self._stop_grace_s and any(
            process.exit_code() is None for process in processes
        ):
            time.sleep(0.02)
        for process in processes:
            process.teardown()
            if process.wait(timeout_s=5) is None:
                self.errors.append("node process %d survived SIGKILL" % process.pid)

    # -- what tests use --------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return self._endpoint_url

    @property
    def env(self) -> dict[str, str]:
        """For the test's boto3 clients or Metaflow run: Batch goes here, nothing goes out."""
        return {"AWS_ENDPOINT_URL_BATCH": self.endpoint_url, **self._network_env()}

    @property
    def submissions(self) -> list[dict]:
        """Every accepted SubmitJob request body, in order."""
        return self.api.submissions

    def node_log(self, job_id: str, node_index: int = 0) -> str:
        """The node's stdout and stderr, interleaved as CloudWatch would show them."""
        job = self.api.find(job_id)
        return self._runner.log_path(job, job.nodes[node_index]).read_text(errors="replace")

    def node_dir(self, job_id: str, node_index: int = 0) -> Path:
        """The node's directory: `work/` is its working directory."""
        job = self.api.find(job_id)
        return self._runner.node_dir(job, job.nodes[node_index])

    def forward(self, method: str, path: str, headers, body: bytes) -> tuple[int, bytes, dict]:
        """Sends a request to moto unchanged and returns its answer."""
        connection = http.client.HTTPConnection(
            self._upstream.hostname, self._upstream.port, timeout=UPSTREAM_TIMEOUT_S
        )
        try:
            connection.request(method, path, body=body, headers=dict(headers))
            response = connection.getresponse()
            payload = response.read()
            kept = {
                name: value
                for name, value in response.getheaders()
                if name.lower() not in _DROPPED_HEADERS
            }
            return response.status, payload, kept
        finally:
            connection.close()

    # -- environment -----------------------------------------------------------------

    def _network_env(self) -> dict[str, str]:
        proxy = self.endpoint_url
        bypass = ",".join(dict.fromkeys([netns.listen_address(), "127.0.0.1", "localhost"]))
        return {
            "http_proxy": proxy,
            "HTTP_PROXY": proxy,
            "https_proxy": proxy,
            "HTTPS_PROXY": proxy,
            "no_proxy": bypass,
            "NO_PROXY": bypass,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def _node_base_env(self) -> dict[str, str]:
        # The test's interpreter stands in for the image's: its bin dir comes first on PATH.
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        return {
            "PATH": path,
            **self._image_env,
            **self._network_env(),
            "AWS_ENDPOINT_URL_BATCH": self.endpoint_url,
        }
