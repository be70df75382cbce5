"""The ``maintain`` and ``jobs`` commands of the CLI. Importing this module must stay cheap: pyspark is
imported only when one of its commands runs (the daemon's container does not ship Spark)."""

from __future__ import annotations

import argparse

from kafka2delta.config import Config

COMMANDS = ("maintain", "jobs")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``maintain`` and ``jobs`` subcommands (and their arguments) to the CLI."""


def run(args: argparse.Namespace, config: Config) -> int:
    """Run a ``maintain``/``jobs`` command; the exit code."""
    raise NotImplementedError
