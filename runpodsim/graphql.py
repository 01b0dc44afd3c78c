"""Just enough GraphQL to answer the runpod SDK the way a real server would.

A real lexer and parser rather than regexes, because the point of the simulator
is to fail where RunPod fails: the SDK pastes values into the query text
unescaped, and a stray `"` must end in a syntax error (or in a duplicate or
unknown input field), not in a query that a regex happened to accept.

Supported: one query or mutation, fields with aliases, arguments with literal
values (strings, block strings, numbers, booleans, null, enums, lists, input
objects), nested selections, ``__typename``. Not supported (answered with an
error): variables, fragments, directives, several operations in one document.

Length: a lexer, a parser and the schema checks of one small language, each needing the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class GraphQLError(Exception):
    """Answered as ``{"errors": [{"message": ..., "extensions": {"code": ...}}]}``."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code  # RunPod's extensions.code (SUPPLY_CONSTRAINT, ...), when it sends one


class EnumValue(str):
    """An unquoted name in value position (``cloudType: SECURE``), kept apart from strings."""


@dataclass
class Field:
    name: str
    alias: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    selections: list[Field] | None = None

    @property
    def response_key(self) -> str:
        return self.alias or self.name


@dataclass
class Operation:
    kind: str  # "query" or "mutation"
    name: str | None
    selections: list[Field]


# -- lexer ---------------------------------------------------------------------------------------

_PUNCTUATORS = "!$&()[]{}:=@|"
_NAME = re.compile(r"[_A-Za-z][_0-9A-Za-z]*")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


@dataclass
class _Token:
    kind: str  # "punct", "name", "int", "float", "string", "spread", "eof"
    value: Any
    pos: int

    def describe(self) -> str:
        if self.kind == "eof":
            return "<EOF>"
        if self.kind == "punct":
            return f'"{self.value}"'
        label = {"name": "Name", "int": "Int", "float": "Float", "string": "String", "spread": "..."}[self.kind]
        return f"{label} {json.dumps(self.value)}" if self.kind != "spread" else '"..."'


def _syntax(message: str) -> GraphQLError:
    return GraphQLError(f"Syntax Error: {message}")


def tokenize(source: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, end = 0, len(source)
    while i < end:
        ch = source[i]
        if ch in " \t\r\n,\ufeff":
            i += 1
        elif ch == "#":
            while i < end and source[i] not in "\r\n":
                i += 1
        elif source.startswith("...", i):
            tokens.append(_Token("spread", "...", i))
            i += 3
        elif ch in _PUNCTUATORS:
            tokens.append(_Token("punct", ch, i))
            i += 1
        elif source.startswith('"""', i):
            value, i = _block_string(source, i)
            tokens.append(_Token("string", value, i))
        elif ch == '"':
            value, i = _string(source, i)
            tokens.append(_Token("string", value, i))
        elif match := _NAME.match(source, i):
            tokens.append(_Token("name", match.group(), i))
            i = match.end()
        elif match := _NUMBER.match(source, i):
            if match.end() < end and (source[match.end()] in "._" or source[match.end()].isalnum()):
                raise _syntax(f"Invalid number, unexpected character {json.dumps(source[match.end()])}.")
            text = match.group()
            is_float = match.group(2) is not None or match.group(3) is not None
            tokens.append(_Token("float" if is_float else "int", float(text) if is_float else int(text), i))
            i = match.end()
        else:
            raise _syntax(f"Unexpected character: {json.dumps(ch)}.")
    tokens.append(_Token("eof", None, end))
    return tokens


def _string(source: str, start: int) -> tuple[str, int]:
    out: list[str] = []
    i = start + 1
    while i < len(source):
        ch = source[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch in "\r\n":
            break
        if ch == "\\":
            nxt = source[i + 1 : i + 2]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", source[i + 2 : i + 6]):
                out.append(chr(int(source[i + 2 : i + 6], 16)))
                i += 6
                continue
            raise _syntax(f"Invalid character escape sequence: {json.dumps(source[i : i + 2])}.")
        if ord(ch) < 0x20 and ch != "\t":
            raise _syntax(f"Invalid character within String: {json.dumps(ch)}.")
        out.append(ch)
        i += 1
    raise _syntax("Unterminated string.")


def _block_string(source: str, start: int) -> tuple[str, int]:
    i = start + 3
    out: list[str] = []
    while i < len(source):
        if source.startswith('"""', i):
            return "".join(out), i + 3
        if source.startswith('\\"""', i):
            out.append('"""')
            i += 4
            continue
        out.append(source[i])
        i += 1
    raise _syntax("Unterminated string.")


# -- parser --------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens = tokenize(source)
        self.i = 0

    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def is_punct(self, value: str) -> bool:
        return self.peek.kind == "punct" and self.peek.value == value

    def expect_punct(self, value: str) -> None:
        if not self.is_punct(value):
            raise _syntax(f'Expected "{value}", found {self.peek.describe()}.')
        self.i += 1

    def expect_name(self) -> str:
        if self.peek.kind != "name":
            raise _syntax(f"Expected Name, found {self.peek.describe()}.")
        return self.take().value

    def document(self) -> Operation:
        if self.peek.kind == "eof":
            raise _syntax("Unexpected <EOF>.")
        operation = self.operation()
        if self.peek.kind != "eof":
            token = self.peek
            starts_definition = token.kind == "name" and token.value in (
                "query",
                "mutation",
                "subscription",
                "fragment",
            )
            if starts_definition or (token.kind == "punct" and token.value == "{"):
                raise GraphQLError("The simulator answers one operation per document.")
            raise _syntax(f"Unexpected {token.describe()}.")
        return operation

    def operation(self) -> Operation:
        if self.is_punct("{"):
            return Operation("query", None, self.selection_set())
        kind = self.expect_name()
        if kind == "subscription":
            raise GraphQLError("Subscriptions are not supported.")
        if kind == "fragment":
            raise GraphQLError("Fragments are not supported by the simulator.")
        if kind not in ("query", "mutation"):
            raise _syntax(f"Unexpected Name {json.dumps(kind)}.")
        name = self.take().value if self.peek.kind == "name" else None
        if self.is_punct("("):
            raise GraphQLError("Variables are not supported by the simulator.")
        if self.is_punct("@"):
            raise GraphQLError("Directives are not supported by the simulator.")
        return Operation(kind, name, self.selection_set())

    def selection_set(self) -> list[Field]:
        self.expect_punct("{")
        fields = [self.field()]
        while not self.is_punct("}"):
            fields.append(self.field())
        self.take()
        return fields

    def field(self) -> Field:
        if self.peek.kind == "spread":
            raise GraphQLError("Fragments are not supported by the simulator.")
        name = self.expect_name()
        alias = None
        if self.is_punct(":"):
            self.take()
            alias, name = name, self.expect_name()
        args: dict[str, Any] = {}
        if self.is_punct("("):
            self.take()
            args = self.pairs(")", "argument")
        if self.is_punct("@"):
            raise GraphQLError("Directives are not supported by the simulator.")
        selections = self.selection_set() if self.is_punct("{") else None
        return Field(name, alias, args, selections)

    def pairs(self, closer: str, what: str) -> dict[str, Any]:
        """``name: value`` pairs up to ``closer``; GraphQL forbids a name twice."""
        values: dict[str, Any] = {}
        if what == "argument" and self.is_punct(closer):
            raise _syntax(f"Expected Name, found {self.peek.describe()}.")
        while not self.is_punct(closer):
            key = self.expect_name()
            self.expect_punct(":")
            if key in values:
                raise GraphQLError(f'There can be only one {what} named "{key}".')
            values[key] = self.value()
        self.take()
        return values

    def value(self) -> Any:
        token = self.peek
        if token.kind == "punct" and token.value == "$":
            raise GraphQLError("Variables are not supported by the simulator.")
        if token.kind == "punct" and token.value == "[":
            self.take()
            items = []
            while not self.is_punct("]"):
                items.append(self.value())
            self.take()
            return items
        if token.kind == "punct" and token.value == "{":
            self.take()
            return self.pairs("}", "input field")
        if token.kind in ("int", "float", "string"):
            return self.take().value
        if token.kind == "name":
            self.take()
            return {"true": True, "false": False, "null": None}.get(token.value, EnumValue(token.value))
        raise _syntax(f"Unexpected {token.describe()}.")


def parse(source: str) -> Operation:
    return _Parser(source).document()


# -- schema checks and result shaping --------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """Object types (field -> type name, None for scalars), input types, field arguments, enums."""

    objects: Mapping[str, Mapping[str, str | None]]
    inputs: Mapping[str, Mapping[str, str]]
    arguments: Mapping[str, Mapping[str, str]]  # "Type.field" -> {argument: type ref}
    enums: Mapping[str, frozenset[str]]


def validate(operation: Operation, schema: Schema) -> None:
    """Refuse unknown fields, missing or extra sub-selections, and badly typed arguments."""
    root = "Query" if operation.kind == "query" else "Mutation"
    _validate_selections(operation.selections, root, schema)


def _validate_selections(selections: list[Field], type_name: str, schema: Schema) -> None:
    fields = schema.objects[type_name]
    for selected in selections:
        if selected.name == "__typename":
            if selected.args or selected.selections is not None:
                raise GraphQLError('Field "__typename" takes no arguments or sub-selection.')
            continue
        if selected.name not in fields:
            raise GraphQLError(f'Cannot query field "{selected.name}" on type "{type_name}".')
        allowed = schema.arguments.get(f"{type_name}.{selected.name}", {})
        for arg, value in selected.args.items():
            if arg not in allowed:
                raise GraphQLError(f'Unknown argument "{arg}" on field "{type_name}.{selected.name}".')
            selected.args[arg] = coerce(value, allowed[arg], schema, f'argument "{arg}"')
        for arg, type_ref in allowed.items():
            if type_ref.endswith("!") and arg not in selected.args:
                raise GraphQLError(f'Field "{selected.name}" argument "{arg}" of type "{type_ref}" is required.')
        child = fields[selected.name]
        if child is None and selected.selections is not None:
            raise GraphQLError(f'Field "{selected.name}" must not have a selection since it is a scalar.')
        if child is not None:
            if selected.selections is None:
                raise GraphQLError(f'Field "{selected.name}" of type "{child}" must have a selection of subfields.')
            _validate_selections(selected.selections, child, schema)


_SCALARS: dict[str, Callable[[Any], bool]] = {
    "String": lambda v: isinstance(v, str) and not isinstance(v, EnumValue),
    "ID": lambda v: (isinstance(v, str) and not isinstance(v, EnumValue)) or (isinstance(v, int) and v is not True),
    "Int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "Float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "Boolean": lambda v: isinstance(v, bool),
}


def coerce(value: Any, type_ref: str, schema: Schema, where: str) -> Any:
    """Check a literal against a type reference like ``String!``, ``[EnvInput]`` or ``CloudTypeEnum``."""
    if type_ref.endswith("!"):
        if value is None:
            raise GraphQLError(f'Expected value of type "{type_ref}", found null in {where}.')
        type_ref = type_ref[:-1]
    if value is None:
        return None
    if type_ref.startswith("["):
        inner = type_ref[1:-1]
        items = value if isinstance(value, list) else [value]  # GraphQL coerces one value to a list
        return [coerce(item, inner, schema, where) for item in items]
    found = _describe_value(value)
    if type_ref in _SCALARS:
        if not _SCALARS[type_ref](value):
            raise GraphQLError(f'Expected value of type "{type_ref}", found {found} in {where}.')
        return float(value) if type_ref == "Float" else value
    if type_ref in schema.enums:
        if not isinstance(value, EnumValue) or value not in schema.enums[type_ref]:
            raise GraphQLError(f'Value {found} does not exist in "{type_ref}" enum ({where}).')
        return str(value)
    fields = schema.inputs[type_ref]
    if not isinstance(value, dict):
        raise GraphQLError(f'Expected value of type "{type_ref}", found {found} in {where}.')
    for key in value:
        if key not in fields:
            raise GraphQLError(f'Field "{key}" is not defined by type "{type_ref}".')
    result = {}
    for key, field_type in fields.items():
        if key in value:
            result[key] = coerce(value[key], field_type, schema, f'{where}, field "{key}"')
        elif field_type.endswith("!"):
            raise GraphQLError(f'Field "{type_ref}.{key}" of required type "{field_type}" was not provided.')
    return result


def _describe_value(value: Any) -> str:
    if isinstance(value, EnumValue):
        return str(value)
    if isinstance(value, dict):
        return "an object"
    return json.dumps(value)


def project(value: Any, selections: list[Field] | None, type_name: str | None, schema: Schema) -> Any:
    """Keep only the selected fields of a resolved value (dicts, lists, scalars)."""
    if value is None or selections is None or type_name is None:
        return value
    if isinstance(value, list):
        return [project(item, selections, type_name, schema) for item in value]
    fields = schema.objects[type_name]
    out: dict[str, Any] = {}
    for selected in selections:
        if selected.name == "__typename":
            out[selected.response_key] = type_name
            continue
        raw = value.get(selected.name)
        if callable(raw):
            raw = raw(selected.args)
        out[selected.response_key] = project(raw, selected.selections, fields[selected.name], schema)
    return out
