"""Loading the configuration: the TOML file, then ``K2D_<SECTION>__<KEY>`` environment overrides, each
value converted to its field's type with an error that names the key (and the variable it came from).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from kafka2delta.config.masking import MASK, is_secret_key
from kafka2delta.config.secret_files import (
    MAPPING_KEYS,
    ConfigPath,
    environment_file_key,
    read_key_files,
    secrets_dir_variables,
)
from kafka2delta.config.sections import (
    ENV_PREFIX,
    CoercionConfig,
    Config,
    CoordinatorConfig,
    DeadLetterConfig,
    FilterConfig,
    FormatConfig,
    IngestConfig,
    JobsConfig,
    KafkaConfig,
    LoggingConfig,
    MetricsConfig,
    RouteConfig,
    RoutingConfig,
    SchemaRegistryConfig,
    SparkConfig,
    TableConfig,
)
from kafka2delta.config.validation import validate, validate_storage_options
from kafka2delta.errors import ConfigError

SECTIONS: dict[str, type[Any]] = {
    "kafka": KafkaConfig,
    "table": TableConfig,
    "ingest": IngestConfig,
    "format": FormatConfig,
    "schema_registry": SchemaRegistryConfig,
    "filter": FilterConfig,
    "coercions": CoercionConfig,
    "dead_letters": DeadLetterConfig,
    "metrics": MetricsConfig,
    "logging": LoggingConfig,
    "spark": SparkConfig,
    "coordinator": CoordinatorConfig,
    "jobs": JobsConfig,
    "routing": RoutingConfig,
}
# A section that is a plain ordered table of strings, not a dataclass.
_TRANSFORMS = "transforms"
# An array of tables ([[routes]] in TOML; K2D_ROUTES: a JSON array of objects).
_ROUTES = "routes"
_FORMAT = "format"
_FILTER = "filter"
_COERCIONS = "coercions"
_TYPE_HINTS = {name: typing.get_type_hints(cls) for name, cls in [*SECTIONS.items(), (_ROUTES, RouteConfig)]}


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (optional), apply ``K2D_`` overrides from ``environ``, validate, return."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                raw = tomllib.load(handle)
        except FileNotFoundError as exc:
            raise ConfigError("--config", f"file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from exc
    sources: dict[str, str] = {}
    environ = os.environ if environ is None else environ
    from_files: set[ConfigPath] = set()
    file_variables = secrets_dir_variables(environ)
    _apply_environment(raw, {**environ, **file_variables}, sources)
    config = _build(raw, sources, from_files)
    validate_storage_options(config, environ, sources)
    return config


def _apply_environment(raw: dict[str, Any], environ: Mapping[str, str], sources: dict[str, str]) -> None:
    transforms_variable = f"{ENV_PREFIX}{_TRANSFORMS.upper()}"
    if transforms_variable in environ:
        raw[_TRANSFORMS] = _json_object(_TRANSFORMS, transforms_variable, environ[transforms_variable])
        sources[_TRANSFORMS] = transforms_variable
    routes_variable = f"{ENV_PREFIX}{_ROUTES.upper()}"
    if routes_variable in environ:
        raw[_ROUTES] = _json_array(_ROUTES, routes_variable, environ[routes_variable])
        sources[_ROUTES] = routes_variable
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or "__" not in variable:
            continue
        parts = variable[len(ENV_PREFIX) :].lower().split("__")
        section, key = parts[0], parts[1]
        if section not in SECTIONS:
            # A K2D_<NAME>__<KEY> variable means config: a misspelt section must not be silently ignored.
            if section in (_TRANSFORMS, _ROUTES):
                raise ConfigError(variable, f"give {section} as one JSON value in {ENV_PREFIX}{section.upper()}")
            raise ConfigError(variable, f"unknown section {section!r} (known: {', '.join(SECTIONS)})")
        value: Any = environ[variable]
        dotted = f"{section}.{key}"
        if len(parts) == 3 and key in MAPPING_KEYS:
            sub = environment_file_key(key, variable.split("__", 2)[2])
            raw.setdefault(section, {}).setdefault(key, {})[sub] = value
            sources[f"{dotted}.{sub}"] = variable
            continue
        if len(parts) != 2:
            raise ConfigError(variable, "expected K2D_<SECTION>__<KEY> (or __<SUBKEY> for settings/storage_options)")
        if key in _JSON_KEYS:
            value = _json_object(dotted, variable, value)
        raw.setdefault(section, {})[key] = value
        sources[dotted] = variable


# Mappings whose keys are column names (any case, dots allowed): from the environment as one JSON object.
_JSON_KEYS = frozenset({"schema", "epoch_units"})


def _json_array(key: str, variable: str, text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{key} (from {variable})", f"expected a JSON array: {exc}") from exc
    if not isinstance(value, list):
        # Not the text: it may hold a route's credentials, and the error is printed before anything masks them.
        raise ConfigError(f"{key} (from {variable})", f"expected a JSON array, got a JSON {type(value).__name__}")
    return value


def _json_object(key: str, variable: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{key} (from {variable})", f"expected a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{key} (from {variable})", f"expected a JSON object, got {text!r}")
    return value


def _build(raw: dict[str, Any], sources: dict[str, str], from_files: set[ConfigPath]) -> Config:
    for section in raw:
        if section not in SECTIONS and section not in (_TRANSFORMS, _ROUTES):
            raise ConfigError(section, f"unknown section (known: {', '.join([*SECTIONS, _TRANSFORMS, _ROUTES])})")
    built: dict[str, Any] = {
        "transforms": _build_transforms(raw.get(_TRANSFORMS, {}), _where(_TRANSFORMS, sources)),
        "routes": _build_routes(raw.get(_ROUTES, []), sources, from_files),
    }
    for section, cls in SECTIONS.items():
        values = raw.get(section, {})
        if not isinstance(values, dict):
            raise ConfigError(section, "expected a table")
        read_key_files(section, cls, values, sources, from_files)
        built[section] = _build_section(section, cls, values, sources, from_files)
    config = Config(**built, from_files=frozenset(from_files))
    validate(config)
    return config


def _where(key: str, sources: dict[str, str]) -> str:
    """``key`` as an error names it: with the environment variable it came from, if it did."""
    return f"{key} (from {sources[key]})" if key in sources else key


def _build_transforms(values: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(values, dict):
        raise ConfigError(where, 'expected a table of target = "expression"')
    pairs = []
    for target, expression in _flatten_targets(values):
        if not isinstance(expression, str) or not expression.strip():
            raise ConfigError(f"{where}.{target}", f"expected a JMESPath expression string, got {expression!r}")
        pairs.append((target, expression))
    return tuple(pairs)


def _flatten_targets(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``meta.offset = "kafka.offset"`` in TOML is a nested table; the target is the dotted path."""
    flat: list[tuple[str, Any]] = []
    for key, value in values.items():
        target = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.extend(_flatten_targets(value, f"{target}."))
        else:
            flat.append((target, value))
    return flat


def _build_routes(values: Any, sources: dict[str, str], from_files: set[ConfigPath]) -> tuple[RouteConfig, ...]:
    where = _where(_ROUTES, sources)
    if not isinstance(values, list):
        raise ConfigError(where, "expected an array of tables ([[routes]] in TOML, a JSON array in the environment)")
    routes = []
    for index, route in enumerate(values):
        if not isinstance(route, dict):
            raise ConfigError(f"{where}[{index}]", "expected a table")
        section = f"{_ROUTES}[{index}]"
        read_key_files(section, RouteConfig, route, sources, from_files)
        # Read apart: tables of their own, and a filter whose absence (the daemon's) differs from "" (none).
        keys = {key: value for key, value in route.items() if key not in (_TRANSFORMS, _FORMAT, _COERCIONS, _FILTER)}
        built = _build_section(section, RouteConfig, keys, sources, from_files, _TYPE_HINTS[_ROUTES])
        if _TRANSFORMS in route:
            transforms = _build_transforms(route[_TRANSFORMS], f"{section}.{_TRANSFORMS}")
            built = dataclasses.replace(built, transforms=transforms)
        if _FILTER in route:
            expression = route[_FILTER]
            if not isinstance(expression, str):
                raise ConfigError(
                    f"{section}.{_FILTER}", f'expected a JMESPath expression string ("": none), got {expression!r}'
                )
            built = dataclasses.replace(built, filter=expression.strip())  # "  " is none, as ""
        for name in (_FORMAT, _COERCIONS):
            if name not in route:
                continue
            own = f"{section}.{name}"
            if not isinstance(route[name], dict):
                raise ConfigError(own, f"expected a table ([routes.{name}] after its [[routes]] in TOML)")
            whole = _build_section(own, SECTIONS[name], route[name], sources, from_files, _TYPE_HINTS[name])
            built = dataclasses.replace(built, **{name: whole})
        routes.append(built)
    return tuple(routes)


def _build_section(
    section: str,
    cls: type[Any],
    values: dict[str, Any],
    sources: dict[str, str],
    from_files: set[ConfigPath],
    hints: dict[str, Any] | None = None,
) -> Any:
    hints = hints if hints is not None else _TYPE_HINTS[section]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            raise ConfigError(f"{section}.{key}", f"unknown key (known keys: {', '.join(fields)})")
    kwargs: dict[str, Any] = {}
    for name, spec in fields.items():
        dotted = f"{section}.{name}"
        if name not in values:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise ConfigError(dotted, f"required key missing (expected {_describe(hints[name])})")
            continue
        where = f"{dotted} (from {sources[dotted]})" if dotted in sources else dotted
        secret = is_secret_key(name) or (section, name) in from_files
        kwargs[name] = _convert(where, hints[name], values[name], secret=secret)
    return cls(**kwargs)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(hint))
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if origin is tuple:
        return "a list of strings"
    return "a table of string values"


def _convert(where: str, hint: Any, value: Any, *, secret: bool) -> Any:
    """Convert a TOML value (or an environment string) to ``hint``; raise naming ``where``."""
    shown = MASK if secret else repr(value)
    problem = f"expected {_describe(hint)}, got {shown}"
    origin = typing.get_origin(hint)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(where, problem)
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(where, problem)
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(where, problem)
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(where, problem)
    if hint is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        # nan passes every range check (nan <= 0 is false) and inf never comes: both are refused here.
        if number is None or not math.isfinite(number):
            raise ConfigError(where, problem)
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(where, problem)
    if origin is tuple:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return tuple(value)
        raise ConfigError(where, problem)
    if origin in (Mapping, dict) or hint is Mapping or isinstance(hint, types.GenericAlias):
        if not isinstance(value, dict):
            # Never echoed: a whole storage_options or settings string holds secrets.
            raise ConfigError(where, f"expected {_describe(hint)}, got {type(value).__name__}")
        converted = {}
        for key, item in value.items():
            if isinstance(item, bool):
                item = "true" if item else "false"
            elif isinstance(item, (int, float)):
                item = str(item)
            if not isinstance(item, str):
                raise ConfigError(
                    f"{where}.{key}", f"expected a string, got {MASK if is_secret_key(key) else repr(item)}"
                )
            converted[str(key)] = item
        return converted
    raise ConfigError(where, f"unsupported type {hint!r}")  # pragma: no cover - a bug in this module
