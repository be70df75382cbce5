"""JMESPath expressions: parsing and checking them at start, and the reference lane, which evaluates
one expression on one document (directly for plain paths, metadata, literals and the custom
functions; through the JMESPath interpreter for anything else).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import jmespath  # type: ignore[import-untyped]
from jmespath import exceptions as jmespath_exceptions

from kafka2delta.errors import ConfigError
from kafka2delta.records import PartitionMessages
from kafka2delta.transforms.functions import CUSTOM_FUNCTIONS, TransformFunctions

KAFKA = "kafka"
"""The name of the metadata object in expressions."""
SCALAR_METADATA = ("topic", "partition", "offset", "timestamp", "timestamp_type")
METADATA = (*SCALAR_METADATA, "key", "headers")


Node = dict[str, Any]


def parse_expression(config_key: str, expression: str) -> Node:
    try:
        parsed: Node = jmespath.compile(expression).parsed
    except jmespath_exceptions.LexerError as exc:
        detail = f"{exc.message} at column {exc.lexer_position}"
    except jmespath_exceptions.IncompleteExpressionError:
        detail = "incomplete expression"
    except jmespath_exceptions.ParseError as exc:
        detail = f"{exc.msg} at column {exc.lex_position}"
    except jmespath_exceptions.EmptyExpressionError:
        detail = "cannot be empty"
    except jmespath_exceptions.JMESPathError as exc:
        detail = str(exc).splitlines()[0]
    else:
        _check_functions(config_key, expression, parsed)
        return parsed
    raise ConfigError(config_key, f"invalid JMESPath expression {expression!r}: {detail}")


def _nodes(node: Node) -> list[Node]:
    """Every node of the tree (slice nodes hold ints and None as children: skip those)."""
    found = [node]
    for child in node.get("children", ()):
        if isinstance(child, dict):
            found.extend(_nodes(child))
    return found


def _check_functions(config_key: str, expression: str, parsed: Node) -> None:
    """Unknown functions and wrong argument counts would fail every message: refuse them at start."""
    table: dict[str, Any] = TransformFunctions.FUNCTION_TABLE
    for node in _nodes(parsed):
        if node["type"] != "function_expression":
            continue
        name, count = node["value"], len(node["children"])
        spec = table.get(name)
        if spec is None:
            raise ConfigError(config_key, f"unknown function {name}() in {expression!r}")
        signature = spec["signature"]
        variadic = bool(signature) and bool(signature[-1].get("variadic"))
        if (variadic and count < len(signature)) or (not variadic and count != len(signature)):
            expected = f"at least {len(signature)}" if variadic else str(len(signature))
            raise ConfigError(config_key, f"{name}() takes {expected} argument(s), got {count} in {expression!r}")


def path_parts(node: Node) -> tuple[str, ...] | None:
    """The field names of a plain path (``a``, ``a.b``, ``"x y".c``, ``@.a``), or None."""
    kind = node["type"]
    if kind == "field":
        return (node["value"],)
    if kind == "current":
        return ()
    if kind == "subexpression":
        parts: tuple[str, ...] = ()
        for child in node["children"]:
            child_parts = path_parts(child)
            if child_parts is None:
                return None
            parts += child_parts
        return parts
    return None


def _uses_field(parsed: Node, name: str) -> bool:
    return any(node["type"] == "field" and node["value"] == name for node in _nodes(parsed))


def _uses_current(parsed: Node) -> bool:
    return any(node["type"] == "current" for node in _nodes(parsed))


class MessageContext:
    """One message's metadata, computed only as far as an expression asks for it."""

    __slots__ = ("_object", "key", "messages", "position")

    def __init__(self, messages: PartitionMessages, position: int, key: Any) -> None:
        self.messages = messages
        self.position = position
        self.key = key
        self._object: dict[str, Any] | None = None

    def value(self, name: str) -> Any:
        messages, position = self.messages, self.position
        if name == "offset":
            return messages.offsets[position]
        if name == "partition":
            return messages.partition
        if name == "topic":
            return messages.topic
        if name == "timestamp":
            return None if messages.timestamp_type(position) == -1 else messages.timestamps_ms[position]
        if name == "timestamp_type":
            return messages.timestamp_type(position)
        if name == "key":
            return self.key
        if name == "headers":
            return headers_object(messages, position)
        return None

    def object(self) -> dict[str, Any]:
        """The ``kafka`` object seen by expressions (built once per message)."""
        if self._object is None:
            self._object = {name: self.value(name) for name in METADATA}
        return self._object


def headers_object(messages: PartitionMessages, position: int) -> dict[str, str | None]:
    return {
        name: None if value is None else value.decode("utf-8", errors="replace")
        for name, value in messages.header_list(position)
    }


def walk_path(value: Any, parts: Sequence[str]) -> Any:
    """JMESPath field access: a missing field, or a non-object in the way, is null."""
    for part in parts:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def set_path(document: dict[str, Any], parts: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at ``parts`` (nothing when it is null); objects on the way are copied, not
    mutated, because an earlier transform may have put the same object at two places (``b = a``)."""
    if value is None:
        return
    current = document
    for part in parts[:-1]:
        child = current.get(part)
        child = dict(child) if isinstance(child, dict) else {}
        current[part] = child
        current = child
    current[parts[-1]] = value


def is_truthy(value: Any) -> bool:
    """JMESPath truthiness: false, null, "", [] and {} are false; 0 is true."""
    return not (value is None or value is False or value == "" or value == [] or value == {})


Evaluate = Callable[[dict[str, Any], MessageContext], Any]


def _direct_evaluator(node: Node) -> Evaluate | None:
    """Plain paths, metadata, literals and the custom functions over those, without the interpreter
    (the same values: the interpreter would only add dispatch, and these functions check their own
    arguments). None for anything else."""
    parts = path_parts(node)
    if parts:
        if parts[0] == KAFKA:
            if len(parts) == 1:
                return lambda document, context: context.object()
            name, rest = parts[1], parts[2:]
            if not rest:
                return lambda document, context: context.value(name)
            return lambda document, context: walk_path(context.value(name), rest)
        if len(parts) == 1:
            field = parts[0]
            return lambda document, context: document.get(field)
        return lambda document, context: walk_path(document, parts)
    if node["type"] == "literal":
        literal = node["value"]
        return lambda document, context: literal
    if node["type"] == "function_expression" and node["value"] in CUSTOM_FUNCTIONS:
        function = CUSTOM_FUNCTIONS[node["value"]]
        arguments = [_direct_evaluator(child) for child in node["children"]]
        if any(argument is None for argument in arguments):
            return None
        direct = [argument for argument in arguments if argument is not None]
        if len(direct) == 1:
            (only,) = direct
            return lambda document, context: function(only(document, context))
        if len(direct) == 3:
            first, second, third = direct
            return lambda document, context: function(
                first(document, context), second(document, context), third(document, context)
            )
    return None


def reference_evaluator(parsed: Node, interpreter: Any) -> Evaluate:
    """The cheapest exact evaluation of one expression on one document."""
    evaluate = _direct_evaluator(parsed) or _interpreted_evaluator(parsed, interpreter)
    if any(node["type"] == "literal" and isinstance(node["value"], dict | list) for node in _nodes(parsed)):
        # The interpreter hands out the literal object itself: without a copy, every document would
        # share (and a later stage could change) one object.
        shared = evaluate
        return lambda document, context: copy.deepcopy(shared(document, context))
    return evaluate


def _interpreted_evaluator(parsed: Node, interpreter: Any) -> Evaluate:
    visit = interpreter.visit
    if _uses_field(parsed, KAFKA):
        return lambda document, context: visit(parsed, {**document, KAFKA: context.object()})
    if _uses_current(parsed):
        # The result may hold the document itself (``[@]``): evaluate on a copy so that setting the
        # result into the document never makes it contain itself.
        return lambda document, context: visit(parsed, dict(document))
    return lambda document, context: visit(parsed, document)
