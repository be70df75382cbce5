"""Configuration values read from files: how Kubernetes and most secret stores hand a process its credentials.

Two ways, both read once at start:

- a ``_file`` suffix on any key names the file holding its value: ``schema_registry.password_file``,
  ``[kafka.settings] "sasl.password_file"``, ``K2D_KAFKA__SETTINGS__SASL_PASSWORD_FILE``,
  ``K2D_TABLE__STORAGE_OPTIONS__AWS_SECRET_ACCESS_KEY_FILE``. Keys that end in ``_file`` themselves
  (``format.avro_schema_file``, the object store's ``azure_federated_token_file`` …) keep their meaning;
- ``K2D_SECRETS_DIR``: every file in that directory named like a ``K2D_*`` variable is that variable, with the
  file's content as its value (a Kubernetes Secret whose keys are ``K2D_*`` names, mounted as a volume). Such
  a variable is treated as if it were in the environment: masked when its key is a secret's (``is_secret_key``),
  so a topic name kept in the same Secret does not vanish from every log line. Any other file there is refused
  (an ``AWS_SECRET_ACCESS_KEY`` that used to reach the environment through ``envFrom`` must not be silently
  ignored).

Where a key is given both ways, the environment wins over the TOML file (either way round), and an empty value
(``password = ""``, as in config.example.toml) gives way to its ``_file``; both in one place is an error.

A value read through a ``_file`` key is a secret whatever its key's name: masked in every printed config and
redacted from the logs. One trailing newline is dropped (``echo secret > file`` writes one); nothing else is
stripped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kafka2delta.config.sections import ENV_PREFIX
from kafka2delta.errors import ConfigError

FILE_SUFFIX = "_file"
SECRETS_DIR_VARIABLE = f"{ENV_PREFIX}SECRETS_DIR"
# Mapping keys whose entries are free-form (librdkafka settings, object-store options, Spark conf).
MAPPING_KEYS = ("settings", "storage_options", "conf")
# Object-store options that are file names themselves (the store reads the file): never read here.
_FILE_NAMING_OPTIONS = frozenset(
    {"azure_federated_token_file", "federated_token_file", "aws_web_identity_token_file", "web_identity_token_file"}
)

ConfigPath = tuple[str, ...]
"""Where a value sits in the config: ``("schema_registry", "password")``, ``("kafka", "settings", "sasl.password")``."""


def read_value_file(key: str, path: str) -> str:
    """The content of ``path`` (one trailing newline dropped), or a :class:`ConfigError` naming ``key``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(key, f"{path} is not UTF-8 text") from exc
    return text.removesuffix("\n").removesuffix("\r")


def secrets_dir_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``K2D_*`` variables held as files in ``K2D_SECRETS_DIR`` (empty when it is not set)."""
    directory = environ.get(SECRETS_DIR_VARIABLE, "")
    if not directory:
        return {}
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(SECRETS_DIR_VARIABLE, f"{directory} is not a directory")
    variables = {}
    # A mounted Secret holds ..data/ and ..<timestamp>/ beside one symlink per key.
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.name.startswith(ENV_PREFIX):
            raise ConfigError(
                f"{SECRETS_DIR_VARIABLE}/{entry.name}",
                f"only K2D_* names are read from {directory}: name it after the config key it sets (e.g. "
                "K2D_TABLE__STORAGE_OPTIONS__AWS_SECRET_ACCESS_KEY), or pass it as an environment variable "
                "(Helm: secret.mountAsFiles = false)",
            )
        if entry.is_file():
            if entry.name in environ:
                raise ConfigError(
                    entry.name, f"set both in the environment and as a file in {directory} ({SECRETS_DIR_VARIABLE})"
                )
            variables[entry.name] = read_value_file(f"{entry.name} (from {SECRETS_DIR_VARIABLE})", str(entry))
    return variables


def environment_file_key(key: str, sub: str) -> str:
    """The mapping key an environment variable's last part names: ``SASL_PASSWORD_FILE`` under ``settings`` is
    ``sasl.password_file`` (librdkafka's dots stand for underscores), other mappings keep the name as written."""
    if key != "settings":
        return sub
    if sub.lower().endswith(FILE_SUFFIX):
        return sub[: -len(FILE_SUFFIX)].lower().replace("_", ".") + FILE_SUFFIX
    return sub.lower().replace("_", ".")


def read_key_files(
    section: str, cls: type[Any], values: dict[str, Any], sources: dict[str, str], from_files: set[ConfigPath]
) -> None:
    """Replace each ``<key>_file`` of ``values`` (one section of the raw config) by ``<key>`` read from the file,
    also inside the section's free-form mappings; record the paths read in ``from_files``."""
    fields = {f.name for f in dataclasses.fields(cls)}
    for name in [k for k in values if k.endswith(FILE_SUFFIX) and k not in fields]:
        target = name[: -len(FILE_SUFFIX)]
        if target in fields and _replace(values, name, target, f"{section}.", sources):
            from_files.add((section, target))
    for mapping_key in MAPPING_KEYS:
        mapping = values.get(mapping_key)
        if mapping_key not in fields or not isinstance(mapping, dict):
            continue
        for name in [k for k in mapping if isinstance(k, str) and k.lower().endswith(FILE_SUFFIX)]:
            if name.lower() in _FILE_NAMING_OPTIONS:
                continue
            target = name[: -len(FILE_SUFFIX)]
            if _replace(mapping, name, target, f"{section}.{mapping_key}.", sources):
                from_files.add((section, mapping_key, target))


def _replace(values: dict[str, Any], name: str, target: str, prefix: str, sources: dict[str, str]) -> bool:
    """Read ``name``'s file into ``target``; False when the environment's ``target`` overrides the file instead."""
    where = prefix + name
    shown = f"{where} (from {sources[where]})" if where in sources else where
    if target in values:
        file_from_environment, value_from_environment = where in sources, prefix + target in sources
        if (file_from_environment and not value_from_environment) or values[target] == "":
            del values[target]  # the environment overrides the TOML file's value (or its empty placeholder)
        elif value_from_environment and not file_from_environment:
            del values[name]  # the environment's value overrides the TOML file's _file key
            return False
        else:
            raise ConfigError(shown, f"{prefix}{target} is set too: give the value or the file, not both")
    path = values.pop(name)
    if not isinstance(path, str) or not path:
        raise ConfigError(shown, f"expected a file name, got {path!r}")
    values[target] = read_value_file(shown, path)
    sources[prefix + target] = f"{sources.get(where, where)}, file {path}"
    return True
