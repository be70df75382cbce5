"""Azure (Azurite) and Google Cloud Storage (fake-gcs-server) emulators on loopback for the tests.

- :mod:`dev.object_stores.tools`: installs both once (npm registry, Go module proxy) into the tools cache.
- :mod:`dev.object_stores.azurite`, :mod:`dev.object_stores.fake_gcs`: :class:`LocalAzurite`, :class:`LocalGcs`,
  each a child process on 127.0.0.1 behind :mod:`dev.object_stores.proxy` (races, faults, GCS's XML upload).

S3 is :mod:`dev.s3` (moto, in-process).
"""

from dev.object_stores.azurite import LocalAzurite
from dev.object_stores.emulator import Emulator
from dev.object_stores.fake_gcs import LocalGcs

__all__ = ["Emulator", "LocalAzurite", "LocalGcs"]
