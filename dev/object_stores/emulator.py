"""What the two emulators share: a child process on 127.0.0.1 with its data in a work dir, restartable on
the same port and data, behind the HTTP proxy of :mod:`dev.object_stores.proxy` (itself a child process).

Clients always talk to the proxy (:attr:`Emulator.endpoint`): it stays up while the emulator is stopped and
started again (``stop``/``start``: a restarted endpoint, same objects), races conditional PUTs on request
(``hold_puts``), records how each ended (``put_outcomes``) and injects faults (``fail``/``refuse``/``heal``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self
from urllib.parse import urlencode

from dev.local_server import free_ports, signal_group, tail

ROOT = Path(__file__).resolve().parents[2]


class Emulator(ABC):
    """One emulator process and its proxy. A subclass gives the command, the proxy flavour and the options."""

    LABEL: ClassVar[str]
    FLAVOUR: ClassVar[str]  # the proxy's --flavour

    def __init__(self, work_dir: Path | None = None) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix=f"k2d-{self.FLAVOUR}-")).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        """The emulator's own port (clients use the proxy's, :attr:`endpoint`)."""
        self._process: subprocess.Popen[bytes] | None = None
        self._proxy: subprocess.Popen[str] | None = None
        self.proxy_port = 0
        self.faults = 0
        """Requests the proxy answered with a fault or refused, as of the last control call."""

    # -- what a subclass provides

    @abstractmethod
    def _command(self) -> list[str]:
        """The emulator's command line (installed first if missing), listening on 127.0.0.1:``port``."""

    @abstractmethod
    def create_bucket(self, name: str) -> None:
        """A container (Azure) or bucket (GCS), made on the emulator directly."""

    @abstractmethod
    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        """deltalake / kafka2delta ``table.storage_options`` for the proxy (or another ``endpoint``)."""

    # -- lifecycle

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def direct_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "emulator.log"

    def start(self, timeout: float = 60) -> str:
        """Start the emulator (on the port it had, if it ran before: same data) and the proxy; wait until
        both answer. Returns :attr:`endpoint`."""
        if not self.port:
            self.port = free_ports(1)[0]
        command = self._command()
        _LIVE.add(self)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command, cwd=self.work_dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not _answers(self.port):
            code = self._process.poll()
            if code is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.LABEL} {'exited with code ' + str(code) if code is not None else 'not ready in time'}"
                    f"; tail of {self.log_path}:\n{tail(self.log_path)}"
                )
            time.sleep(0.1)
        if self._proxy is None:
            self._proxy = subprocess.Popen(
                [sys.executable, "-m", "dev.object_stores.proxy", "--target-port", str(self.port),
                 "--flavour", self.FLAVOUR],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert self._proxy.stdout is not None
            line = self._proxy.stdout.readline()
            if not line:
                raise RuntimeError(f"the proxy in front of {self.LABEL} exited (code {self._proxy.wait()})")
            self.proxy_port = int(json.loads(line)["port"])
        return self.endpoint

    def stop(self, timeout: float = 30) -> None:
        """Stop the emulator (SIGTERM, then SIGKILL); its data and the proxy stay, for a later :meth:`start`."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            signal_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout)
        signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)

    def close(self) -> None:
        """Stop the emulator and the proxy (and remove the work dir if it was a temporary one)."""
        _LIVE.discard(self)
        self.stop()
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            with contextlib.suppress(OSError):
                assert proxy.stdin is not None
                proxy.stdin.close()  # the proxy ends when its stdin does
            try:
                proxy.wait(10)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait()
            if proxy.stdout is not None:
                proxy.stdout.close()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- the proxy's control API

    def _control(self, command: str, **query: str | int | float) -> Any:
        url = f"{self.endpoint}/_k2d/{command}" + (f"?{urlencode(query)}" if query else "")
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as response:
            answer = json.loads(response.read())
        self.faults = int(answer["faults"])
        return answer["result"]

    def hold_puts(self, bucket: str, key: str, count: int, timeout: float = 10) -> None:
        """Hold conditional PUTs of ``bucket/key`` until ``count`` of them have arrived, then let them all go
        to the emulator at once. After ``timeout`` seconds those waiting go on alone (listed by :meth:`unmet`)."""
        self._control("hold", key=f"{bucket}/{key}", count=count, timeout=timeout)

    def put_outcomes(self, bucket: str, key: str) -> list[int]:
        """HTTP status of each conditional PUT of ``bucket/key`` so far, as the emulator answered it."""
        return list(self._control("outcomes", key=f"{bucket}/{key}"))

    def unmet(self) -> list[str]:
        """``bucket/key`` of every hold whose PUTs did not all arrive in time."""
        return list(self._control("unmet"))

    def fail(self, status: int = 503) -> None:
        """Answer every request with ``status`` (and drop those in flight) until :meth:`heal`."""
        self._control("fail", status=status)

    def refuse(self) -> None:
        """Close every connection unanswered until :meth:`heal`."""
        self._control("refuse")

    def heal(self) -> None:
        self._control("heal")

    def fault_count(self) -> int:
        """Requests the proxy answered with a fault or refused so far."""
        self._control("faults")
        return self.faults


# Emulators started in this process and not closed yet: closed at interpreter exit (they lead their own sessions).
_LIVE: set[Emulator] = set()


@atexit.register
def _close_live() -> None:
    for emulator in list(_LIVE):
        emulator.close()


def _answers(port: int) -> bool:
    """True when something answers HTTP on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            sock.settimeout(2)
            return sock.recv(12).startswith(b"HTTP/")
    except OSError:
        return False
