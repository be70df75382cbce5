"""A fake schema registry on loopback speaking the Confluent REST API, for the registry client's tests."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeState:
    """What the fake registry serves, and what it saw."""

    schemas: dict[int, dict[str, Any]] = field(default_factory=dict)
    subjects: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    status: int = 200
    """Answer every request with this status (200: serve normally)."""
    body: bytes | None = None
    """Raw body for a forced status (default: a Confluent error body)."""
    sleep_s: float = 0.0
    credentials: tuple[str, str] | None = None
    """When set, requests without this basic-auth pair get 401."""

    def register(self, schema_id: int, schema: str, schema_type: str | None = None, references: Any = ()) -> None:
        answer: dict[str, Any] = {"schema": schema}
        if schema_type is not None:
            answer["schemaType"] = schema_type
        if references:
            answer["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in references]
        self.schemas[schema_id] = answer


class FakeRegistry(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeRegistryHandler)
        self.state = FakeState()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeRegistryHandler(BaseHTTPRequestHandler):
    server: FakeRegistry

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/vnd.schemaregistry.v1+json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)

    def _error(self, status: int, code: int, message: str) -> None:
        self._send(status, json.dumps({"error_code": code, "message": message}).encode())

    def do_GET(self) -> None:
        state = self.server.state
        state.requests.append(self.path)
        state.authorizations.append(self.headers.get("Authorization"))
        if state.sleep_s:
            time.sleep(state.sleep_s)
        if state.credentials is not None:
            user, password = state.credentials
            expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            if self.headers.get("Authorization") != expected:
                self._error(401, 401, "Unauthorized")
                return
        if state.status != 200:
            if state.body is not None:
                self._send(state.status, state.body, "text/html")
            else:
                self._error(state.status, state.status * 100, "forced")
            return
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[:2] == ["schemas", "ids"]:
            found = state.schemas.get(int(parts[2]))
            if found is None:
                self._error(404, 40403, "Schema not found")
            else:
                self._send(200, json.dumps(found).encode())
            return
        if len(parts) == 4 and parts[0] == "subjects" and parts[2] == "versions":
            from urllib.parse import unquote

            subject = unquote(parts[1])
            found = state.subjects.get((subject, int(parts[3])))
            if found is None:
                self._error(404, 40402, "Version not found")
            else:
                self._send(200, json.dumps(found).encode())
            return
        self._send(404, b"<html>no such page</html>", "text/html")
