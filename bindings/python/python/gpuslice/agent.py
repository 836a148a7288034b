"""A client for the gpuslice node agent's API (``gpuslice agent``) over its unix socket.

Pure Python (``http.client``), so an orchestrator written in Python needs no HTTP code of its
own. Every answer is the API's JSON document as dicts and lists; every error document becomes an
:class:`AgentError` carrying the API's ``kind``, ``status`` and ``errno``.

Reads ask for gzip, and the client keeps the last topology and health documents with their entity
tags: polling an unchanged agent costs a ``304 Not Modified`` and no transfer of the document.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import urllib.parse
from typing import Any, Dict, Iterator, Optional

DEFAULT_SOCKET = "/run/gpuslice/agent.sock"
# The reads the agent serves with entity tags; the client keeps the last answer of each.
_CACHED_PATHS = ("/v1/topology", "/v1/health")


class AgentError(Exception):
    """An error document from the agent: ``kind`` is the same string as ``gpuslice -o json``."""

    def __init__(self, status: int, kind: str, message: str, errno: Optional[int] = None) -> None:
        super().__init__(f"{message} ({kind}, HTTP {status})")
        self.status = status
        self.kind = kind
        self.message = message
        self.errno = errno

    def __repr__(self) -> str:
        return (
            f"AgentError(status={self.status!r}, kind={self.kind!r}, message={self.message!r}"
            + (f", errno={self.errno!r}" if self.errno is not None else "")
            + ")"
        )


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


class AgentClient:
    """The agent at ``socket`` (default ``/run/gpuslice/agent.sock``)."""

    def __init__(self, socket: str = DEFAULT_SOCKET, timeout: float = 60.0) -> None:
        self.socket = socket
        self.timeout = timeout
        # path -> (ETag, JSON text) of the last cached read of that path.
        self._cached: Dict[str, "tuple[str, str]"] = {}

    def _request(
        self, method: str, path: str, body: Optional[Any] = None, raw: Optional[str] = None
    ) -> Any:
        conn = _UnixConnection(self.socket, self.timeout)
        try:
            data: Optional[bytes] = None
            headers = {"Accept-Encoding": "gzip"}
            cached = self._cached.get(path) if method == "GET" else None
            if cached is not None:
                headers["If-None-Match"] = cached[0]
            if raw is not None:
                data = raw.encode()
                headers["Content-Type"] = "application/yaml"
            elif body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        if resp.status == 304 and cached is not None:
            return json.loads(cached[1])
        if resp.getheader("Content-Encoding", "") == "gzip":
            payload = gzip.decompress(payload)
        text = payload.decode()
        etag = resp.getheader("ETag")
        if method == "GET" and etag and resp.status == 200 and path in _CACHED_PATHS:
            self._cached[path] = (etag, text)
        if resp.status >= 400:
            try:
                err = json.loads(text)["error"]
            except (ValueError, KeyError, TypeError):
                raise AgentError(resp.status, "error", text.strip() or resp.reason) from None
            raise AgentError(resp.status, err.get("kind", "error"), err.get("message", ""), err.get("errno"))
        if resp.getheader("Content-Type", "").startswith("application/json"):
            return json.loads(text)
        return text

    def topology(self) -> Dict[str, Any]:
        """``GET /v1/topology``: the node topology, with the ``revision`` it reflects."""
        return self._request("GET", "/v1/topology")

    def health(self) -> Dict[str, Any]:
        """``GET /v1/health``: each GPU's health report."""
        return self._request("GET", "/v1/health")

    def vgpus(self) -> Dict[str, Any]:
        """``GET /v1/vgpus``: the instances on the host and the agent's promises."""
        return self._request("GET", "/v1/vgpus")

    def promises(self) -> Dict[str, Any]:
        """``GET /v1/promises``: the recorded promises and what the last reconcile found."""
        return self._request("GET", "/v1/promises")

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self._request("GET", "/metrics")

    def create(
        self,
        parent: str,
        profile: str,
        *,
        machine: Optional[str] = None,
        uuid: Optional[str] = None,
        request: Optional[str] = None,
        index: Optional[int] = None,
        force: bool = False,
    ) -> Dict[str, Any]:
        """``POST /v1/vgpus``: creates a vGPU for ``machine`` (or with ``uuid``)."""
        body: Dict[str, Any] = {"parent": parent, "profile": profile}
        for k, v in (("machine", machine), ("uuid", uuid), ("request", request), ("index", index)):
            if v is not None:
                body[k] = v
        if force:
            body["force"] = True
        return self._request("POST", "/v1/vgpus", body)

    def remove(self, target: str, *, force: bool = False) -> Dict[str, Any]:
        """``DELETE /v1/vgpus/{uuid|vf}``: refused (``in-use``) while a VM holds it, unless ``force``."""
        q = "?force=true" if force else ""
        return self._request("DELETE", f"/v1/vgpus/{urllib.parse.quote(target, safe='')}{q}")

    def bind(self, gpu: str, *, force: bool = False) -> Dict[str, Any]:
        """``POST /v1/gpus/{gpu}/bind``: binds a whole GPU to vfio-pci; a GPU graded Unhealthy
        is refused (``unhealthy``) unless ``force``, a Degraded one comes with ``warnings``."""
        q = "?force=true" if force else ""
        return self._request("POST", f"/v1/gpus/{urllib.parse.quote(gpu, safe='')}/bind{q}")

    def release(self, gpu: str, *, force: bool = False) -> Dict[str, Any]:
        """``POST /v1/gpus/{gpu}/release``: returns a GPU to its host driver."""
        q = "?force=true" if force else ""
        return self._request("POST", f"/v1/gpus/{urllib.parse.quote(gpu, safe='')}/release{q}")

    def realize(
        self, allocation: Any, *, machine: Optional[str] = None, force: bool = False
    ) -> Dict[str, Any]:
        """``POST /v1/realize``: makes a placed Machine's devices on this node in one call, as
        ``gpuslice realize --allocation`` does. ``allocation`` is the document ``gpuslice place``
        prints (JSON or YAML text, or the decoded dict); ``machine`` picks one of several. The
        answer has the hand-off and ``allocation`` with ``status: created``. A GPU graded
        Unhealthy is refused (``unhealthy``) unless ``force``."""
        q = {k: v for k, v in (("machine", machine), ("force", "true" if force else None)) if v}
        qs = ("?" + urllib.parse.urlencode(q)) if q else ""
        if isinstance(allocation, str):
            return self._request("POST", f"/v1/realize{qs}", raw=allocation)
        return self._request("POST", f"/v1/realize{qs}", body=allocation)

    def apply_layout(
        self, layout: str, *, config: Optional[str] = None, dry_run: bool = False, force: bool = False
    ) -> Dict[str, Any]:
        """``PUT /v1/layout``: applies a layout document (``gpuslice vgpu apply``'s file)."""
        q = {k: v for k, v in (("config", config), ("dryRun", "true" if dry_run else None), ("force", "true" if force else None)) if v}
        qs = ("?" + urllib.parse.urlencode(q)) if q else ""
        return self._request("PUT", f"/v1/layout{qs}", raw=layout)

    def events(self, since: int = 0) -> Iterator[Dict[str, Any]]:
        """``GET /v1/events?since=N``: yields change events (with increasing ``revision``) as they come."""
        conn = _UnixConnection(self.socket, self.timeout)
        try:
            conn.request("GET", f"/v1/events?since={int(since)}&format=ndjson")
            resp = conn.getresponse()
            if resp.status >= 400:
                err = json.loads(resp.read().decode())["error"]
                raise AgentError(resp.status, err["kind"], err["message"], err.get("errno"))
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()
