"""Azurite, the Azure storage emulator (npm), on loopback behind the test proxy: an ADLS Gen2 / Blob store.

    with LocalAzurite() as azure:
        azure.create_bucket("k2d-test")                      # a container
        options = azure.storage_options()                    # table.storage_options for az://k2d-test/…

Only the blob service runs (``--blobHost 127.0.0.1``), with its data under the work dir (``--location``), so a
stop and start serves the same blobs; ``--skipApiVersionCheck`` because object_store's ``x-ms-version`` can be
newer than Azurite knows. delta-rs commits a log version with ``PUT`` + ``If-None-Match: *`` (Put Blob):
Azurite checks and stores it in one synchronous step of its single-threaded metadata store
(``LokiBlobMetadataStore.createBlob``), so of two such PUTs exactly one is stored (201) and the other refused
(409 ``BlobAlreadyExists``). Azurite has no hierarchical namespace (no DFS endpoint): ``abfss://`` URIs work
(object_store speaks the Blob API for them too), with the emulator's account in the options.
"""

from __future__ import annotations

from pyarrow import fs as pa_fs

from dev.object_stores.emulator import Emulator
from dev.object_stores.tools import ensure_azurite, node

# Azurite's well-known development account (public, the same in every installation).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class LocalAzurite(Emulator):
    LABEL = "Azurite"
    FLAVOUR = "azure"

    def _command(self) -> list[str]:
        main = ensure_azurite()
        return [
            node(),
            str(main),
            "--blobHost", "127.0.0.1",
            "--blobPort", str(self.port),
            "--location", str(self.work_dir / "data"),
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
        ]  # fmt: skip

    def create_bucket(self, name: str) -> None:
        """A blob container (pyarrow's Azure filesystem creates one for a top-level directory)."""
        filesystem = pa_fs.AzureFileSystem(
            account_name=ACCOUNT,
            account_key=ACCOUNT_KEY,
            blob_storage_authority=f"127.0.0.1:{self.port}",
            blob_storage_scheme="http",
            dfs_storage_authority=f"127.0.0.1:{self.port}",
            dfs_storage_scheme="http",
        )
        filesystem.create_dir(name)

    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        return {
            "azure_storage_account_name": ACCOUNT,
            "azure_storage_account_key": ACCOUNT_KEY,
            "azure_storage_endpoint": f"{endpoint or self.endpoint}/{ACCOUNT}",
            "allow_http": "true",
        }
