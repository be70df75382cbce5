"""fake-gcs-server (Go module, ``go install``) on loopback behind the test proxy: a Google Cloud Storage.

    with LocalGcs() as gcs:
        gcs.create_bucket("k2d-test")
        options = gcs.storage_options()                      # table.storage_options for gs://k2d-test/…

Its objects live under the work dir (``-backend filesystem``), so a stop and start serves the same objects.
object_store uploads with GCS's XML API, which fake-gcs-server lacks; the proxy in front
(:mod:`dev.object_stores.proxy`) turns each upload into the JSON API's media upload, carrying the
precondition: delta-rs's commit of a log version is ``x-goog-if-generation-match: 0``, sent on as
``ifGenerationMatch=0``, which fake-gcs-server checks and stores under one lock (200, or 412 if the object
exists). The options point object_store at the proxy without OAuth (a service-account key with
``gcs_base_url`` and ``disable_oauth``, object_store's emulator route).
"""

from __future__ import annotations

import json
import urllib.request

from dev.object_stores.emulator import Emulator
from dev.object_stores.tools import ensure_fake_gcs


class LocalGcs(Emulator):
    LABEL = "fake-gcs-server"
    FLAVOUR = "gcs"

    def _command(self) -> list[str]:
        root = self.work_dir / "data"
        root.mkdir(exist_ok=True)
        return [
            str(ensure_fake_gcs()),
            "-scheme", "http",
            "-host", "127.0.0.1",
            "-port", str(self.port),
            "-public-host", f"127.0.0.1:{self.port}",
            "-external-url", self.direct_endpoint,
            "-backend", "filesystem",
            "-filesystem-root", str(root),
            "-log-level", "warn",
        ]  # fmt: skip

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.direct_endpoint}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        # object_store's own emulator route: a service-account key whose ``gcs_base_url`` names the server
        # and ``disable_oauth`` skips the token exchange (deltalake 1.6's object_store 0.13 has no
        # ``google_base_url``/``google_skip_signature`` keys yet).
        key = {
            "gcs_base_url": endpoint or self.endpoint,
            "disable_oauth": True,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        }
        return {"google_service_account_key": json.dumps(key), "allow_http": "true"}
