"""Producer-side Protobuf for tests: .proto text → message classes, the way a code generator would."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
from grpc_tools import protoc  # type: ignore[import-untyped]


def compile_with_protoc(files: dict[str, str], main: str) -> Any:
    """protoc (grpc_tools) → descriptor set → a fresh descriptor pool holding ``files``."""
    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as directory:
        for name, text in files.items():
            Path(directory, name).parent.mkdir(parents=True, exist_ok=True)
            Path(directory, name).write_text(text)
        out = os.path.join(directory, "set.pb")
        arguments = ["protoc", f"-I{directory}", f"-I{include}", f"--descriptor_set_out={out}", "--include_imports"]
        assert protoc.main([*arguments, main]) == 0
        descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(Path(out).read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_set.file:
        pool.Add(file)
    return pool


def message_class(pool: Any, name: str) -> Any:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
