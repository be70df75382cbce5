"""The house rule that the pure core imports no edge, checked on the import graph (docs/DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kafka2delta"

PURE = [
    "kafka2delta.records",
    "kafka2delta.bisection",
    "kafka2delta.errors",
    "kafka2delta.offsets",
    "kafka2delta.schema",
    "kafka2delta.pipeline",
    "kafka2delta.value_buffers",
    "kafka2delta.routing",
    "kafka2delta.splitting",
    "kafka2delta.serialization",
    "kafka2delta.transforms",
    "kafka2delta.coercions",
]
# Libraries that talk to the outside world, and the modules of the package that wrap them. The schema
# registry client is not here: it is the one edge a deserializer holds (passed in by the CLI).
EDGES = {
    "confluent_kafka",
    "deltalake",
    "kazoo",
    "pyspark",
    "kafka2delta.kafka",
    "kafka2delta.writer",
    "kafka2delta.dead_letters",
    "kafka2delta.committer",
    "kafka2delta.runner",
    "kafka2delta.coordinator",
    "kafka2delta.status",
    "kafka2delta.verify",
    "kafka2delta.cli",
    "kafka2delta.spark",
}


def module_file(module: str) -> Path | None:
    relative = Path(*module.split(".")[1:])
    for candidate in (PACKAGE / relative.with_suffix(".py"), PACKAGE / relative / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def imports_of(module: str) -> set[str]:
    """Every module ``module`` imports at run time (TYPE_CHECKING blocks excluded)."""
    path = module_file(module)
    assert path is not None, module
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if not name.startswith("kafka2delta.") or module_file(name) is not None}


def reached_edges(start: str) -> dict[str, list[str]]:
    """The edges reachable from ``start`` through the package's own imports, each with the path to it."""
    paths: dict[str, list[str]] = {start: [start]}
    pending = [start]
    edges: dict[str, list[str]] = {}
    while pending:
        module = pending.pop()
        for imported in sorted(imports_of(module)):
            edge = next((e for e in EDGES if imported == e or imported.startswith(f"{e}.")), None)
            if edge is not None:
                edges.setdefault(edge, [*paths[module], imported])
            elif imported.startswith("kafka2delta.") and imported not in paths:
                paths[imported] = [*paths[module], imported]
                pending.append(imported)
    return edges


def submodules(package: str) -> list[str]:
    path = module_file(package)
    assert path is not None, package
    if path.name != "__init__.py":
        return [package]
    return [package] + [
        f"{package}.{child.stem}" for child in sorted(path.parent.glob("*.py")) if child.stem != "__init__"
    ]


def test_the_pure_core_imports_no_edge() -> None:
    offenders = {
        module: [" → ".join(path) for path in reached_edges(module).values()]
        for package in PURE
        for module in submodules(package)
        if reached_edges(module)
    }
    assert offenders == {}


def test_the_check_sees_an_edge_when_there_is_one() -> None:
    # The loop is not pure: if the check could not see that, it would pass for anything.
    assert {"kafka2delta.committer", "kafka2delta.coordinator"} <= set(reached_edges("kafka2delta.runner"))
    assert "deltalake" in reached_edges("kafka2delta.writer")


def test_boto3_is_imported_by_the_glue_edge_only_and_only_when_it_is_used() -> None:
    # The image without the glue extra must start: boto3 is imported inside the Glue edge's functions, never
    # when a module loads (at its top, or in a try or if there), and by no other module of the daemon (the
    # Spark jobs are not the daemon).
    importers: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("kafka2delta", *path.relative_to(PACKAGE).with_suffix("").parts))
        if module.startswith("kafka2delta.spark"):
            continue
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        in_functions = {id(node) for function in functions for node in ast.walk(function)}
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0] in ("boto3", "botocore") for name in names):
                where = "in a function" if id(node) in in_functions else "when the module loads"
                importers.setdefault(module, []).append(where)
    assert set(importers) == {"kafka2delta.registry_glue"}, importers
    assert set(importers["kafka2delta.registry_glue"]) == {"in a function"}
