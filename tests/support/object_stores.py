"""Azure and GCS table stores for the tests: an emulator of :mod:`dev.object_stores` with one bucket, and what
a test asks of it (URIs, storage options, raced commits), the same for both stores.

    store = start_store("gcs")        # fake-gcs-server behind its proxy, bucket made
    uri = store.uri("events")         # gs://k2d-test/<random>/events
    store.hold_commit(uri, 1, 2)      # the next two commits of log version 1 reach the emulator together
    store.commit_outcomes(uri, 1)     # [200, 412]: one stored, one refused

The emulators are installed on first use (npm, Go module proxy) into the tools cache; see
:mod:`dev.object_stores.tools`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from dev.object_stores import Emulator, LocalAzurite, LocalGcs

StoreName = Literal["azure", "gcs"]
STORES: tuple[StoreName, ...] = ("azure", "gcs")
BUCKET = "k2d-test"


@dataclass
class Store:
    name: StoreName
    emulator: Emulator
    bucket: str
    stored: int
    """The emulator's answer to the conditional PUT that wins a log version (Azure 201, GCS 200)."""
    refused: int
    """... and to the one that loses it (Azure 409 BlobAlreadyExists, GCS 412 conditionNotMet)."""

    @property
    def scheme(self) -> str:
        return {"azure": "az", "gcs": "gs"}[self.name]

    def uri(self, name: str, abfss: bool = False) -> str:
        """A fresh table URI in the bucket; ``abfss`` writes an Azure one as ADLS Gen2 names it."""
        path = f"{uuid.uuid4().hex[:10]}/{name}"
        if abfss:
            assert self.name == "azure"
            return f"abfss://{self.bucket}@devstoreaccount1.dfs.core.windows.net/{path}"
        return f"{self.scheme}://{self.bucket}/{path}"

    def options(self, endpoint: str | None = None) -> dict[str, str]:
        return self.emulator.storage_options(endpoint)

    def log_key(self, uri: str, version: int) -> str:
        """The object key (in the bucket) of the table's commit file of ``version``."""
        path = uri.split("://", 1)[1].split("/", 1)[1]
        return f"{path}/_delta_log/{version:020d}.json"

    def hold_commit(self, uri: str, version: int, count: int, timeout: float = 10) -> None:
        self.emulator.hold_puts(self.bucket, self.log_key(uri, version), count, timeout)

    def commit_outcomes(self, uri: str, version: int) -> list[int]:
        return self.emulator.put_outcomes(self.bucket, self.log_key(uri, version))

    def unmet(self, uri: str, version: int) -> bool:
        """True when a hold of that commit gave up waiting (the other writer never came)."""
        return f"{self.bucket}/{self.log_key(uri, version)}" in self.emulator.unmet()


def start_store(name: StoreName, bucket: str = BUCKET) -> Store:
    """The store's emulator started (installed first if missing) with ``bucket`` in it; ``close()`` it."""
    emulator: Emulator = LocalAzurite() if name == "azure" else LocalGcs()
    emulator.start()
    try:
        emulator.create_bucket(bucket)
    except BaseException:
        emulator.close()
        raise
    stored, refused = (201, 409) if name == "azure" else (200, 412)
    return Store(name, emulator, bucket, stored, refused)
