"""An S3-compatible server on loopback for tests (moto's server from PyPI), and a TCP proxy in front
of it that injects faults.

No MinIO here: moto's ``ThreadedMotoServer`` runs in the test process, bound to 127.0.0.1, and
keeps its buckets in memory for the life of the process, so a server stopped and started again on
the same port serves the same objects (a restarted S3 endpoint). delta-rs commits its log with
put-if-absent (``If-None-Match: *``), which moto (>= 5.0.15) answers with 412 on an existing key.
moto checks the condition and stores the object in two steps, so two conditional PUTs of one key
arriving together could both pass the check; :class:`LocalS3` makes each conditional PUT atomic
(one lock around check and write), as S3 is. ``hold_puts`` parks conditional PUTs of one key until a
given number have arrived, to race two commits of the same log version on purpose, and
``put_outcomes`` says how each conditional PUT of a key ended (200 or 412).

The proxy forwards TCP bytes unchanged; ``fail()`` makes it answer every new request with an HTTP
error, ``refuse()`` closes new connections at once (a server that went away), ``heal()`` goes back
to forwarding. Point clients at ``proxy.endpoint`` to put faults between them and the server.
``delay_s`` holds the first bytes of each answer that long (a round trip to a distant store, for the
writers benchmark).

    with LocalS3() as s3, FaultProxy(s3.port) as proxy:
        s3.create_bucket("k2d-test")
        options = s3.storage_options(endpoint=proxy.endpoint)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import boto3
from moto.s3.exceptions import PreconditionFailed
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer

ACCESS_KEY = "k2d-test-key"
SECRET_KEY = "k2d-test-secret"
REGION = "us-east-1"


# moto's backend is one per process, and so are the lock and records below: kept on the patched method,
# so that this file loaded twice (under two module names) still patches once and shares them.
class _ConditionalPuts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, threading.Barrier] = {}
        self.outcomes: dict[str, list[int]] = {}
        self.unmet: list[str] = []


def _atomic_conditional_put(original: Any, state: _ConditionalPuts) -> Any:
    def put_object(self: Any) -> Any:
        if self.headers.get("If-None-Match") is None and self.headers.get("If-Match") is None:
            return original(self)
        key = f"{self.bucket_name}/{self.parse_key_name()}"
        barrier = state.held.get(key)
        if barrier is not None:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                state.unmet.append(key)  # the others never came: go on alone
            state.held.pop(key, None)  # one rendezvous per hold_puts
        with state.lock:
            try:
                response = original(self)
            except PreconditionFailed:
                state.outcomes.setdefault(key, []).append(412)
                raise
            state.outcomes.setdefault(key, []).append(200)
            return response

    put_object.k2d_state = state  # type: ignore[attr-defined]
    return put_object


_STATE: _ConditionalPuts | None = getattr(S3Response.put_object, "k2d_state", None)
if _STATE is None:
    _STATE = _ConditionalPuts()
    S3Response.put_object = _atomic_conditional_put(S3Response.put_object, _STATE)  # type: ignore[method-assign]


def client(endpoint: str) -> Any:
    """A boto3 S3 client of the test credentials at ``endpoint``."""
    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
    )


def storage_options(endpoint: str) -> dict[str, str]:
    """deltalake / kafka2delta ``table.storage_options`` for the server (or a proxy) at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
    }


class LocalS3:
    def __init__(self, port: int = 0) -> None:
        self._server: ThreadedMotoServer | None = None
        self.port = port

    @staticmethod
    def hold_puts(bucket: str, key: str, count: int, timeout: float = 10) -> None:
        """Hold conditional PUTs of ``bucket/key`` until ``count`` of them have arrived, then let them
        all go at once (to the atomic check-and-write, where exactly one can win). After ``timeout``
        seconds (keep it below the clients' request timeout, 30 s for delta-rs) those waiting go on
        alone and the key is listed by :meth:`unmet`."""
        assert _STATE is not None
        _STATE.held[f"{bucket}/{key}"] = threading.Barrier(count, timeout=timeout)

    @staticmethod
    def unmet() -> list[str]:
        """``bucket/key`` of every hold whose PUTs did not all arrive in time."""
        assert _STATE is not None
        return list(_STATE.unmet)

    @staticmethod
    def put_outcomes(bucket: str, key: str) -> list[int]:
        """HTTP status of each conditional PUT of ``bucket/key`` so far (200 stored, 412 refused)."""
        assert _STATE is not None
        return list(_STATE.outcomes.get(f"{bucket}/{key}", []))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        # Always 127.0.0.1: moto's default is every interface.
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        return self.endpoint

    def stop(self) -> None:
        """Stop serving; the objects stay (moto keeps them in this process) for a later start()."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def create_bucket(self, name: str) -> None:
        client(self.endpoint).create_bucket(Bucket=name)

    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        """deltalake / kafka2delta ``table.storage_options`` for this server (or a proxy in front of it)."""
        return storage_options(endpoint or self.endpoint)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


class FaultProxy:
    """A TCP proxy from a free loopback port to ``127.0.0.1:target_port`` that can inject faults."""

    def __init__(self, target_port: int, delay_s: float = 0.0) -> None:
        self._target = ("127.0.0.1", target_port)
        self.delay_s = delay_s
        """Added to each request's round trip: the answer's first bytes wait this long."""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._mode = "forward"
        self._status = 503
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.faults = 0
        """Requests answered with an error or refused so far."""
        self._thread = threading.Thread(target=self._accept, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, status: int = 503) -> None:
        """Answer every new request with ``status`` (and drop open connections, so requests in
        flight see the fault too)."""
        self._mode, self._status = "fail", status
        self._drop_open()

    def refuse(self) -> None:
        """Close every new connection at once, as a server that went away."""
        self._mode = "refuse"
        self._drop_open()

    def heal(self) -> None:
        self._mode = "forward"

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self._drop_open()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # --- internals ---------------------------------------------------------------------------

    def _drop_open(self) -> None:
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
            self._open.clear()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            mode = self._mode
            if mode == "refuse":
                self.faults += 1
                client.close()
                continue
            if mode == "fail":
                threading.Thread(target=self._answer_error, args=(client, self._status), daemon=True).start()
                continue
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _answer_error(self, client: socket.socket, status: int) -> None:
        self.faults += 1
        with contextlib.suppress(OSError), client:
            client.settimeout(5)
            client.recv(65536)  # the request head; the answer does not depend on it
            body = b'<?xml version="1.0"?><Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>'
            client.sendall(
                f"HTTP/1.1 {status} Injected Fault\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._target, timeout=10)
        except OSError:
            client.close()
            return
        with self._lock:
            self._open.update((client, upstream))
        asked = threading.Event()  # a request went up since the last answer began
        pumps = [
            threading.Thread(target=_pump, args=(client, upstream, asked.set), daemon=True),
            threading.Thread(target=_pump, args=(upstream, client, lambda: self._answering(asked)), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        with self._lock:
            self._open.discard(client)
            self._open.discard(upstream)

    def _answering(self, asked: threading.Event) -> None:
        if asked.is_set():
            asked.clear()
            if self.delay_s:
                time.sleep(self.delay_s)


def _pump(source: socket.socket, sink: socket.socket, on_data: Callable[[], None]) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            on_data()
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def main(argv: list[str] | None = None) -> int:
    """The server in a process of its own (the writers benchmark: moto answers many daemons without sharing a GIL
    with the harness), with a plain proxy and a delaying one in front; ends when stdin closes."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds the second proxy adds per request")
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    with LocalS3() as s3, FaultProxy(s3.port) as plain, FaultProxy(s3.port, delay_s=args.delay) as delayed:
        s3.create_bucket(args.bucket)
        print(json.dumps({"endpoint": s3.endpoint, "plain": plain.endpoint, "delayed": delayed.endpoint}), flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
