"""An HTTP proxy in front of a local object-store emulator (Azurite, fake-gcs-server), run as a child process.

    python -m dev.object_stores.proxy --target-port 41234 --flavour gcs
    → one JSON line on stdout: {"port": 41235}

It forwards each request to ``127.0.0.1:<target-port>`` and answers with the emulator's response, and adds
what the tests need around the emulator's own atomic put-if-absent:

- **Races on purpose.** ``/_k2d/hold?key=K&count=2&timeout=10`` parks the conditional PUTs of key ``K``
  (``bucket/object``) until ``count`` have arrived, then lets them all go to the emulator at once;
  ``/_k2d/outcomes?key=K`` lists the HTTP status each conditional PUT of ``K`` ended with, ``/_k2d/unmet``
  the holds whose PUTs did not all arrive in time. A conditional PUT is Azure's ``If-None-Match: *`` and
  GCS's ``x-goog-if-generation-match``: what object_store sends for delta-rs's commit of a log version.
- **Faults.** ``/_k2d/fail?status=503`` answers every other request with that status (and drops requests in
  flight), ``/_k2d/refuse`` closes connections unanswered, ``/_k2d/heal`` forwards again; an emulator that is
  down (stopped for a restart) looks the same as ``refuse``. ``/_k2d/faults`` counts the requests faulted.
- **GCS's XML upload** (``--flavour gcs``). object_store uploads an object with the XML API (``PUT
  /bucket/object`` with ``x-goog-if-generation-match: 0`` for put-if-absent), which fake-gcs-server does not
  implement (it answers 400 "invalid uploadType": fsouza/fake-gcs-server#331; object_store's own CI uses a
  fork, not on the Go module proxy). The proxy sends it to the JSON API's media upload instead,
  ``POST /upload/storage/v1/b/bucket/o?uploadType=media&name=object&ifGenerationMatch=0``, which
  fake-gcs-server checks and stores under one lock (412 if the object exists), and answers like the XML
  API (``ETag``, ``x-goog-generation``, an XML error). The parts of XML multipart uploads are kept in the
  proxy and stored with one media upload on completion (deltalake's Parquet writer streams files as multipart
  uploads). Copies (``x-goog-copy-source``) are not translated: they get 501, so nothing silently misbehaves
  (delta-rs never copies). An XML ``DELETE`` of an object (``maintain vacuum``) is the JSON API's delete.
  fake-gcs-server's XML listing also ignores ``start-after``, with which object_store
  lists a log from a known version: the proxy drops those keys.

Everything else (GET, HEAD, Azure's blob and block calls, Azure's DELETE) passes through unchanged.
The proxy runs in a process of its own because deltalake holds the GIL while it waits for storage.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import html
import http.client
import json
import re
import socket
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

CONTROL = "/_k2d/"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class State:
    """What the control API changes and reports; shared by every request thread."""

    def __init__(self, target_port: int, flavour: str) -> None:
        self.target = ("127.0.0.1", target_port)
        self.flavour = flavour
        self.lock = threading.Lock()
        self.mode = "forward"
        self.status = 503
        self.faults = 0
        self.held: dict[str, threading.Barrier] = {}
        self.outcomes: dict[str, list[int]] = {}
        self.unmet: list[str] = []
        self.upstreams: set[http.client.HTTPConnection] = set()
        self.uploads: dict[str, dict[int, bytes]] = {}  # GCS XML multipart uploads in progress: id → parts

    def key(self, path: str) -> str:
        """``bucket/object`` of a request path (Azure's path starts with the account)."""
        parts = unquote(urlsplit(path).path).lstrip("/").split("/")
        if self.flavour == "azure":
            parts = parts[1:]
        return "/".join(parts)

    def drop_in_flight(self) -> None:
        with self.lock:
            upstreams, self.upstreams = list(self.upstreams), set()
        for connection in upstreams:
            with contextlib.suppress(OSError):
                if connection.sock is not None:
                    connection.sock.shutdown(socket.SHUT_RDWR)
                connection.close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _handle(self) -> None:
        state = self.server.state
        if self.path.startswith(CONTROL):
            self._control(state)
            return
        body = self._read_body()
        if state.mode == "refuse":
            self._refuse(state)
            return
        if state.mode == "fail":
            with state.lock:
                state.faults += 1
            self._answer(state.status, {"Content-Type": "application/xml"}, _error("ServiceUnavailable", "injected"))
            return
        conditional = self.command == "PUT" and (
            self.headers.get("If-None-Match") is not None or self.headers.get("x-goog-if-generation-match") is not None
        )
        key = state.key(self.path) if conditional else ""
        if conditional:
            barrier = state.held.get(key)
            if barrier is not None:
                try:
                    barrier.wait()
                except threading.BrokenBarrierError:
                    state.unmet.append(key)  # the others never came: go on alone
                state.held.pop(key, None)  # one rendezvous per hold
        if state.flavour == "gcs" and self.command in ("PUT", "POST", "DELETE") and _xml_object_path(self.path):
            response = self._gcs_xml(state, body)
        else:
            response = self._forward(state, self.command, self.path, dict(self.headers.items()), body)
            if state.flavour == "gcs" and self.command == "GET" and response is not None:
                response = _start_after(self.path, response)
        if response is None:
            self._refuse(state)
            return
        status, headers, payload = response
        if conditional:
            with state.lock:
                state.outcomes.setdefault(key, []).append(status)
        self._answer(status, headers, payload)

    # --- forwarding --------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(
        self, state: State, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        """The emulator's response, or None when it cannot be reached or the request was dropped."""
        connection = http.client.HTTPConnection(*state.target, timeout=60)
        with state.lock:
            state.upstreams.add(connection)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in (*_HOP_BY_HOP, "content-length", "host")}
            if body or method in ("PUT", "POST", "PATCH"):
                sent["Content-Length"] = str(len(body))
            connection.request(method, path, body=body or None, headers=sent)
            response = connection.getresponse()
            payload = response.read()
            received = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
            if method != "HEAD":
                received = {k: v for k, v in received.items() if k.lower() != "content-length"}
                received["Content-Length"] = str(len(payload))
            return response.status, received, payload
        except (OSError, http.client.HTTPException):
            return None
        finally:
            with state.lock:
                state.upstreams.discard(connection)
            connection.close()

    def _gcs_xml(self, state: State, body: bytes) -> tuple[int, dict[str, str], bytes] | None:
        """An XML API upload (a PUT, or one step of a multipart upload), made through the JSON API."""
        split = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        bucket, _, name = unquote(split.path).lstrip("/").partition("/")
        xml = {"Content-Type": "application/xml"}
        if self.headers.get("x-goog-copy-source"):
            return 501, xml, _error("NotImplemented", "copies are not translated to fake-gcs-server")
        if self.command == "POST" and "uploads" in query:
            upload_id = uuid.uuid4().hex
            with state.lock:
                state.uploads[upload_id] = {}
            result = (
                f"<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{name}</Key>"
                f"<UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>"
            )
            return 200, xml, result.encode()
        if "uploadId" in query:
            with state.lock:
                parts = state.uploads.get(query["uploadId"])
            if parts is None:
                return 404, xml, _error("NoSuchUpload", query["uploadId"])
            if self.command == "DELETE":
                with state.lock:
                    state.uploads.pop(query["uploadId"], None)
                return 204, {}, b""
            if self.command == "PUT":
                parts[int(query["partNumber"])] = body
                return 200, {"ETag": f'"{hashlib.md5(body).hexdigest()}"'}, b""
            numbers = [int(n) for n in re.findall(rb"<PartNumber>(\d+)</PartNumber>", body)]
            with state.lock:
                state.uploads.pop(query["uploadId"], None)
            stored = self._media_upload(state, bucket, name, b"".join(parts[n] for n in numbers), {})
            if stored is None or stored[0] != 200:
                return stored
            status, headers, _ = stored
            return (
                status,
                {**headers, **xml},
                f"<CompleteMultipartUploadResult><ETag>{headers['ETag']}</ETag></CompleteMultipartUploadResult>".encode(),
            )
        if self.command == "DELETE":  # of an object (``maintain vacuum``): the JSON API's delete
            gone = self._forward(state, "DELETE", f"/storage/v1/b/{quote(bucket)}/o/{quote(name, safe='')}", {}, b"")
            if gone is None:
                return None
            if gone[0] == 404:
                return 404, xml, _error("NoSuchKey", name)
            return (204, {}, b"") if 200 <= gone[0] < 300 else (gone[0], xml, _error("Error", gone[2].decode()[:500]))
        if self.command != "PUT":
            return 501, xml, _error("NotImplemented", f"{self.command} {split.path} is not translated")
        conditions = {}
        for header, parameter in (
            ("x-goog-if-generation-match", "ifGenerationMatch"),
            ("x-goog-if-generation-not-match", "ifGenerationNotMatch"),
        ):
            value = self.headers.get(header)
            if value is not None:
                conditions[parameter] = value
        return self._media_upload(state, bucket, name, body, conditions)

    def _media_upload(
        self, state: State, bucket: str, name: str, body: bytes, conditions: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes] | None:
        """``POST /upload/storage/v1/b/<bucket>/o?uploadType=media``, answered like the XML API."""
        query = "&".join(
            f"{k}={quote(v, safe='')}" for k, v in {"uploadType": "media", "name": name, **conditions}.items()
        )
        headers = {"Content-Type": self.headers.get("Content-Type") or "application/octet-stream"}
        response = self._forward(state, "POST", f"/upload/storage/v1/b/{quote(bucket)}/o?{query}", headers, body)
        if response is None:
            return None
        status, _, payload = response
        xml = {"Content-Type": "application/xml"}
        if status == 412:
            return (
                412,
                xml,
                _error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold."),
            )
        if not 200 <= status < 300:
            return status, xml, _error("Error", payload.decode(errors="replace")[:500])
        stored = json.loads(payload)
        return 200, {"ETag": f'"{stored.get("etag", "")}"', "x-goog-generation": str(stored.get("generation", ""))}, b""

    def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if "content-length" not in {k.lower() for k in headers}:
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
        except OSError:
            self.close_connection = True

    def _refuse(self, state: State) -> None:
        with state.lock:
            state.faults += 1
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # --- control -----------------------------------------------------------------------------

    def _control(self, state: State) -> None:
        self._read_body()
        split = urlsplit(self.path)
        command = split.path.removeprefix(CONTROL)
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        result: Any = None
        if command == "hold":
            barrier = threading.Barrier(int(query["count"]), timeout=float(query.get("timeout", "10")))
            state.held[query["key"]] = barrier
        elif command == "outcomes":
            with state.lock:
                result = list(state.outcomes.get(query["key"], []))
        elif command == "unmet":
            result = list(state.unmet)
        elif command == "fail":
            state.mode, state.status = "fail", int(query.get("status", "503"))
            state.drop_in_flight()
        elif command == "refuse":
            state.mode = "refuse"
            state.drop_in_flight()
        elif command == "heal":
            state.mode = "forward"
        elif command != "faults":
            self._answer(404, {"Content-Type": "application/json"}, b'{"error": "unknown command"}')
            return
        answer = json.dumps({"result": result, "faults": state.faults}).encode()
        self._answer(200, {"Content-Type": "application/json"}, answer)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: State) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.state = state

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: clients drop connections all the time here (faults, retries, restarts)."""


def _start_after(path: str, response: tuple[int, dict[str, str], bytes]) -> tuple[int, dict[str, str], bytes]:
    """An XML listing (``list-type=2``) without the keys up to ``start-after``, which fake-gcs-server ignores
    (object_store lists a table's log from the last version it knows with it)."""
    status, headers, payload = response
    query = {k: v[0] for k, v in parse_qs(urlsplit(path).query).items()}
    after = query.get("start-after")
    if status != 200 or query.get("list-type") != "2" or after is None:
        return response

    def keep(match: re.Match[bytes]) -> bytes:
        key = re.search(rb"<Key>(.*?)</Key>", match.group(0), re.DOTALL)
        return match.group(0) if key is None or html.unescape(key.group(1).decode()) > after else b""

    filtered = re.sub(rb"<Contents>.*?</Contents>", keep, payload, flags=re.DOTALL)
    count = filtered.count(b"<Contents>") + filtered.count(b"<CommonPrefixes>")
    filtered = re.sub(rb"<KeyCount>\d+</KeyCount>", f"<KeyCount>{count}</KeyCount>".encode(), filtered)
    return status, {**headers, "Content-Length": str(len(filtered))}, filtered


def _xml_object_path(path: str) -> bool:
    """True for an XML API object URL (``/bucket/object``), not a JSON API or control path."""
    first = urlsplit(path).path.lstrip("/").split("/", 1)
    return len(first) == 2 and bool(first[1]) and first[0] not in ("upload", "storage", "download", "batch", "_k2d")


def _error(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'.encode()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--flavour", choices=("azure", "gcs"), required=True)
    args = parser.parse_args(argv)
    server = Server(State(args.target_port, args.flavour))
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    # Ends with its parent: stdin closes when the test process goes away.
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
