"""NetworkPolicies on the loopback Kubernetes API (k8s_api.py), and the garbage collector's part
in them: a policy whose every owner is gone is deleted, as Kubernetes' garbage collector does
(in the background, a tick of the controller after its owner's deletion; an owner that never
existed counts as gone).

    POST   /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies         create (validated)
    GET    /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies         list
    GET    /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}  read
    DELETE /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}  delete

A policy is validated against the published Kubernetes OpenAPI as the kubernetes client's
models carry it (generated from that OpenAPI): no unknown field, every required one, each
value of its type. The emulation enforces none of them on the pods' traffic: every pod is a
local process on 127.0.0.1 (docs/testing.md).
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Callable, Collection

from .jobset_controller import now_iso

GROUP, VERSION = "networking.k8s.io", "v1"
PREFIX = "/apis/%s/%s/namespaces/" % (GROUP, VERSION)
_PRIMITIVES = {"str": str, "int": int, "bool": bool, "object": object}


class InvalidObject(Exception):
    """The API server would refuse the object (422)."""


def validate_object(obj: object, model: str, where: str = "") -> None:
    """Raises InvalidObject when `obj` (JSON) is not a valid `model` (a kubernetes client model
    name, e.g. V1NetworkPolicy, or one of its field types such as List[V1IPBlock])."""
    from kubernetes import client

    listed = re.fullmatch(r"List\[(.+)\]", model)
    mapped = re.fullmatch(r"Dict\(str, (.+)\)|Dict\[str, (.+)\]", model)
    if listed:
        if not isinstance(obj, list):
            raise InvalidObject("%s: a list expected, got %r" % (where, obj))
        for i, item in enumerate(obj):
            validate_object(item, listed.group(1), "%s[%d]" % (where, i))
    elif mapped:
        if not isinstance(obj, dict):
            raise InvalidObject("%s: a map expected, got %r" % (where, obj))
        for key, value in obj.items():
            validate_object(value, mapped.group(1) or mapped.group(2), "%s.%s" % (where, key))
    elif model in _PRIMITIVES:
        if not isinstance(obj, _PRIMITIVES[model]) or (model == "int" and isinstance(obj, bool)):
            raise InvalidObject("%s: %s expected, got %r" % (where, model, obj))
    elif model == "datetime":
        if not isinstance(obj, str):
            raise InvalidObject("%s: a timestamp expected, got %r" % (where, obj))
    else:
        cls = getattr(client, model)
        if not isinstance(obj, dict):
            raise InvalidObject("%s: an object (%s) expected, got %r" % (where, model, obj))
        fields = {json_name: cls.openapi_types[attr] for attr, json_name in
                  cls.attribute_map.items()}
        unknown = sorted(set(obj) - set(fields))
        if unknown:
            raise InvalidObject("%s: unknown fields %s of %s" % (where, unknown, model))
        for key, value in obj.items():
            validate_object(value, fields[key], "%s.%s" % (where, key))
        try:  # the models' constructors refuse a missing required field and a bad enum
            client.ApiClient().deserialize(json.dumps(obj), model, "application/json")
        except ValueError as error:
            raise InvalidObject("%s: %s" % (where, error)) from error


class NetworkPolicies:
    """The NetworkPolicies of the emulated cluster. `allowed(verb, group, resource)` is the
    cluster's RBAC (k8s_cluster.ClusterApi.allowed); `forbidden` its 403 answer."""

    def __init__(self, allowed: Callable[[str, str, str], bool],
                 forbidden: Callable[[str, str, str, str], tuple[int, dict]]) -> None:
        self._allowed = allowed
        self._forbidden = forbidden
        self._lock = threading.Lock()
        self.policies: dict[tuple[str, str], dict] = {}  # (namespace, name) -> object
        self.created: list[dict] = []  # every policy accepted, in order
        self.collected: list[dict] = []  # every policy the garbage collector deleted

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict] | None:
        """The answer to a NetworkPolicy call, or None for the other routes."""
        if not path.startswith(PREFIX):
            return None
        rest = path[len(PREFIX):].split("/")
        if len(rest) not in (2, 3) or rest[1] != "networkpolicies":
            return None
        namespace = rest[0]
        verb = {"POST": "create", "DELETE": "delete",
                "GET": "get" if len(rest) == 3 else "list"}.get(method, method.lower())
        if not self._allowed(verb, GROUP, "networkpolicies"):
            return self._forbidden(verb, GROUP, "networkpolicies", namespace)
        with self._lock:
            if method == "POST" and len(rest) == 2:
                return self._create(namespace, json.loads(body or b"{}"))
            if method == "GET" and len(rest) == 2:
                return 200, {"kind": "NetworkPolicyList", "apiVersion": "%s/%s" % (GROUP, VERSION),
                             "metadata": {}, "items": [copy.deepcopy(p) for (ns, _), p in
                                                       sorted(self.policies.items())
                                                       if ns == namespace]}
            if method in ("GET", "DELETE") and len(rest) == 3:
                found = (self.policies.get if method == "GET" else self.policies.pop)(
                    (namespace, rest[2]), None)
                if found is None:
                    return 404, _status(404, "NotFound", 'networkpolicies.%s "%s" not found'
                                        % (GROUP, rest[2]))
                return 200, copy.deepcopy(found)
        return None

    def _create(self, namespace: str, body: dict) -> tuple[int, dict]:
        try:
            validate_object(body, "V1NetworkPolicy", "NetworkPolicy")
        except InvalidObject as error:
            return 422, _status(422, "Invalid", "NetworkPolicy is invalid: %s" % error)
        meta = body.get("metadata") or {}
        if meta.get("namespace", namespace) != namespace or not meta.get("name"):
            return 422, _status(422, "Invalid", "NetworkPolicy needs metadata.name, in the "
                                "namespace of its URL")
        key = (namespace, meta["name"])
        if key in self.policies:
            return 409, _status(409, "AlreadyExists", 'networkpolicies.%s "%s" already exists'
                                % (GROUP, meta["name"]))
        obj = copy.deepcopy(body)
        obj["metadata"] = dict(meta, namespace=namespace, uid=str(uuid.uuid4()),
                               resourceVersion="1", creationTimestamp=now_iso())
        self.policies[key] = obj
        self.created.append(copy.deepcopy(obj))
        return 201, copy.deepcopy(obj)

    def collect(self, live_uids: Collection[str]) -> None:
        """The garbage collector: delete every policy with owners, none of them alive."""
        with self._lock:
            for key, policy in list(self.policies.items()):
                owners = policy["metadata"].get("ownerReferences") or []
                if owners and not any(o["uid"] in live_uids for o in owners):
                    self.collected.append(self.policies.pop(key))


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
