"""A typed task's payload type, as a :class:`Shape`: how a value of it becomes the plain
JSON value a producer in any language would write (``dump``), how that value becomes one of
it again in the worker (``load``), and its JSON Schema. Pure: no I/O.

Dataclasses and ``TypedDict``\\ s are read here, field by field, from their annotations,
which must use a small set of types (:data:`SCALARS`, ``list[X]``, ``dict[str, X]``,
``X | None``, ``Literal``, ``Any``, an ``Enum``, a nested dataclass or TypedDict): any other
is refused when the :class:`~delayq.TaskType` is made, naming the field. Pydantic models and
msgspec ``Struct``\\ s bring their own conversion: they are recognised only when their
package is already imported (a user's model imported it), so delayq never imports either.

``load`` ignores fields the type does not have (a producer on a newer type buries nothing
on a worker still on the old one) and raises :class:`ShapeError`, naming the field, for a
required one missing or a value of the wrong type.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import (
    Annotated,
    Any,
    Literal,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from delayq.errors import ConfigurationError

Dump = Callable[[Any, str], Any]  # (value, where) -> JSON value
Load = Callable[[Any, str], Any]  # (JSON value, where) -> value
Fields = tuple[dict[str, Any], list[str], set[str]]  # annotations, names, required names
# The dataclasses and TypedDicts met reading a payload type, by the type itself (two
# classes may share a name: billing.Item and shop.Item), in the order met: their fields,
# or None while they are being read (met again then, the type contains itself).
Records = dict[Any, Fields | None]

SCALARS = (str, int, float, bool, type(None), datetime, date, uuid.UUID, Decimal)


class ShapeError(ValueError):
    """A value does not match its type; the message names the field (``items[2].sku``)."""


def _where(where: str) -> str:
    return where or "the payload"


def _got(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _wrong(where: str, expected: str, value: Any) -> ShapeError:
    return ShapeError(f"{_where(where)}: expected {expected}, got {_got(value)}")


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a :class:`~delayq.TaskType` does with its payload type."""

    name: str  # the type's name, for messages
    dump: Callable[[Any], Any]
    load: Callable[[Any], Any]
    schema: Callable[[], dict[str, Any]]


def shape_of(tp: Any) -> Shape:
    """The :class:`Shape` of a payload type; ConfigurationError for a type delayq cannot
    check, or a field of a type outside the supported set (the message names it)."""
    name = getattr(tp, "__name__", repr(tp))
    model = _pydantic_model(tp)
    if model is not None:
        return model
    struct = _msgspec_struct(tp)
    if struct is not None:
        return struct
    if not (isinstance(tp, type) and (dataclasses.is_dataclass(tp) or is_typeddict(tp))):
        raise ConfigurationError(
            f"a TaskType's payload type must be a dataclass, a TypedDict, a pydantic model "
            f"or a msgspec Struct, got {tp!r}; for a payload of any JSON value, schedule a "
            "plain kind (a str) instead"
        )
    records: Records = {}
    dump, load = _converters(tp, name, records)
    refs = _def_names(records)
    top = _schema(tp, refs)
    defs = {refs[t]: _record_schema(t, fields, refs) for t, fields in records.items() if fields}

    def schema() -> dict[str, Any]:
        out = dict(top)
        if defs:
            out["$defs"] = dict(defs)
        return out

    def dumps(value: Any) -> Any:
        return dump(value, "")

    def loads(value: Any) -> Any:
        return load(value, "")

    return Shape(name, dumps, loads, schema)


# -- dataclasses and TypedDicts ------------------------------------------------------------


def _converters(tp: Any, where: str, records: Records) -> tuple[Dump, Load]:
    """(dump, load) of one annotation; ConfigurationError naming ``where`` otherwise."""
    if tp is Any:
        return _same, _same
    if tp in (type(None), None):
        return _scalar(type(None), "null")
    if isinstance(tp, type) and tp in _SCALAR_CONVERTERS:
        return _SCALAR_CONVERTERS[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp)
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or is_typeddict(tp)):
        return _record(tp, where, records)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal and all(type(a) in (str, int, bool) for a in args):
        return _literal(args)
    if origin is list and len(args) == 1:
        return _list(*_converters(args[0], f"{where}[]", records))
    if origin is dict and len(args) == 2 and args[0] is str:
        return _dict(*_converters(args[1], f"{where}[]", records))
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        return _optional(*_converters(inner, where, records))
    raise ConfigurationError(
        f"{where}: {tp!r} is not a payload type delayq encodes; use str, int, float, bool, "
        "None, datetime, date, UUID, Decimal, an Enum, Literal[...], list[X], dict[str, X], "
        "X | None, Any, or a nested dataclass or TypedDict (docs/concepts.md, 'Typed tasks')"
    )


def _same(value: Any, where: str) -> Any:
    return value


# A value of a subclass mypy lets stand for a field's type is taken as one, and written as
# the plain value json.dumps writes for it: a StrEnum member or Django's SafeString for a
# str, an IntEnum member for an int, freezegun's FakeDatetime for a datetime. Not a bool for
# an int or a float (JSON tells them apart), nor a datetime for a date (its time would be
# lost): subclasses too, but not what the field means.


def _scalar(tp: type, expected: str) -> tuple[Dump, Load]:
    def check(value: Any, where: str) -> Any:
        if type(value) is tp:
            return value
        raise _wrong(where, expected, value)

    return check, check


def _text(value: Any, where: str) -> Any:
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)  # its text (Django's SafeString's own str() is itself)
    raise _wrong(where, "a string", value)


def _int(value: Any, where: str) -> Any:
    if type(value) is int:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__int__(value)
    raise _wrong(where, "an integer", value)


def _number() -> tuple[Dump, Load]:
    def dump(value: Any, where: str) -> Any:
        if type(value) in (int, float):
            return value
        if isinstance(value, float):
            return float.__float__(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return int.__int__(value)
        raise _wrong(where, "a number", value)

    def load(value: Any, where: str) -> Any:
        return float(dump(value, where))

    return dump, load


def _text_of(
    tp: type, parse: Callable[[str], Any], expected: str, but: type | None = None
) -> tuple[Dump, Load]:
    """A value written as a string: ``str(value)`` (an ISO 8601 text for times), ``tp``'s
    own for one of a subclass; ``but``: a subclass refused."""
    write: Callable[[Any], str] = tp.isoformat if issubclass(tp, date) else tp.__str__

    def dump(value: Any, where: str) -> Any:
        if type(value) is tp or (isinstance(value, tp) and not (but and isinstance(value, but))):
            return write(value)
        raise _wrong(where, expected, value)

    def load(value: Any, where: str) -> Any:
        if not isinstance(value, str):
            raise _wrong(where, expected, value)
        try:
            return parse(value)
        except (ValueError, InvalidOperation):
            raise _wrong(where, expected, value) from None

    return dump, load


def _decimal(text: str) -> Decimal:
    out = Decimal(text)
    if not out.is_finite():
        raise ValueError(text)
    return out


def _decimal_converters() -> tuple[Dump, Load]:
    dump, load = _text_of(Decimal, _decimal, "a decimal number as a string ('12.50')")

    def dump_finite(value: Any, where: str) -> Any:
        if isinstance(value, Decimal) and not value.is_finite():
            raise _wrong(where, "a finite decimal", value)
        return dump(value, where)

    return dump_finite, load


def _date(text: str) -> date:
    if len(text) != 10:  # fromisoformat takes a few other forms on 3.11+; a date is this one
        raise ValueError(text)
    return date.fromisoformat(text)


_SCALAR_CONVERTERS: dict[type, tuple[Dump, Load]] = {
    str: (_text, _text),
    int: (_int, _int),
    bool: _scalar(bool, "true or false"),
    float: _number(),
    datetime: _text_of(datetime, datetime.fromisoformat, "an ISO 8601 date and time"),
    date: _text_of(date, _date, "an ISO 8601 date (YYYY-MM-DD)", but=datetime),
    uuid.UUID: _text_of(uuid.UUID, uuid.UUID, "a UUID as a string"),
    Decimal: _decimal_converters(),
}


def _enum(tp: type[enum.Enum]) -> tuple[Dump, Load]:
    values = {m.value: m for m in tp}
    for member in tp:
        if type(member.value) not in (str, int):
            raise ConfigurationError(
                f"{tp.__name__}.{member.name}: an Enum in a payload is written as its "
                f"value, which must be a str or an int, got {member.value!r}"
            )
    expected = f"one of {sorted(values, key=str)!r} ({tp.__name__})"

    def dump(value: Any, where: str) -> Any:
        if isinstance(value, tp):
            return value.value
        raise _wrong(where, f"an instance of {tp.__name__}", value)

    def load(value: Any, where: str) -> Any:
        if type(value) in (str, int):
            member = values.get(value)
            if member is not None:
                return member
        raise _wrong(where, expected, value)

    return dump, load


def _literal(allowed: tuple[Any, ...]) -> tuple[Dump, Load]:
    def check(value: Any, where: str) -> Any:
        if any(type(value) is type(a) and value == a for a in allowed):
            return value
        raise _wrong(where, f"one of {list(allowed)!r}", value)

    return check, check


def _list(dump_item: Dump, load_item: Load) -> tuple[Dump, Load]:
    def dump(value: Any, where: str) -> Any:
        if not isinstance(value, list | tuple):
            raise _wrong(where, "a list", value)
        return [dump_item(v, f"{where}[{i}]") for i, v in enumerate(value)]

    def load(value: Any, where: str) -> Any:
        if type(value) is not list:
            raise _wrong(where, "a list", value)
        return [load_item(v, f"{where}[{i}]") for i, v in enumerate(value)]

    return dump, load


def _dict(dump_item: Dump, load_item: Load) -> tuple[Dump, Load]:
    def convert(item: Dump) -> Dump:
        def run(value: Any, where: str) -> Any:
            if not isinstance(value, dict):
                raise _wrong(where, "an object", value)
            out = {}
            for k, v in value.items():
                if type(k) is not str:
                    if not isinstance(k, str):
                        raise _wrong(where, "an object with string keys", k)
                    k = str.__str__(k)
                out[k] = item(v, f"{where}[{k!r}]")
            return out

        return run

    return convert(dump_item), convert(load_item)


def _optional(dump_inner: Dump, load_inner: Load) -> tuple[Dump, Load]:
    def dump(value: Any, where: str) -> Any:
        return None if value is None else dump_inner(value, where)

    def load(value: Any, where: str) -> Any:
        return None if value is None else load_inner(value, where)

    return dump, load


def _fields(tp: Any, where: str) -> Fields:
    """A dataclass's or TypedDict's (annotations, field names, required names)."""
    try:
        hints = get_type_hints(tp, include_extras=True)
    except Exception as e:  # a forward reference that does not resolve, say
        raise ConfigurationError(f"{where}: cannot read the annotations of {tp!r}: {e}") from e
    marks: dict[str, Any] = {}
    for name, hint in hints.items():  # Annotated[...] dropped; Required, NotRequired noted
        while get_origin(hint) in (Annotated, typing.Required, typing.NotRequired):
            if get_origin(hint) is not Annotated:
                marks[name] = get_origin(hint)
            hint = get_args(hint)[0]
        hints[name] = hint
    if dataclasses.is_dataclass(tp):
        fields = [f for f in dataclasses.fields(tp) if f.init]
        missing = dataclasses.MISSING
        required = {f.name for f in fields if f.default is missing and f.default_factory is missing}
        return hints, [f.name for f in fields], required
    # The marks read from the annotations: a module with ``from __future__ import
    # annotations`` leaves them strings when the class is made, and __required_keys__
    # (on Python 3.11) then counts a NotRequired key as required.
    required = {
        name
        for name in hints
        if marks.get(name) is typing.Required
        or (marks.get(name) is None and name in tp.__required_keys__)
    }
    return hints, list(hints), required


def _path(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _record(tp: Any, where: str, records: Records) -> tuple[Dump, Load]:
    """A dataclass or TypedDict: an object whose fields are converted one by one."""
    label = tp.__name__
    if tp in records and records[tp] is None:
        raise ConfigurationError(
            f"{where or label}: {label} contains itself; a payload type cannot be recursive"
        )
    records[tp] = None  # being read: met again inside itself, it is recursive
    hints, names, required = _fields(tp, where or label)
    inner = {name: _converters(hints[name], _path(where, name), records) for name in names}
    records[tp] = hints, names, required
    dumps = {name: pair[0] for name, pair in inner.items()}
    loads = {name: pair[1] for name, pair in inner.items()}
    if dataclasses.is_dataclass(tp):
        return _dump_dataclass(tp, dumps), _load_record(tp, loads, required)
    return _dump_typeddict(label, dumps, required), _load_record(None, loads, required)


def _dump_dataclass(tp: Any, dumps: dict[str, Dump]) -> Dump:
    label = tp.__name__

    def dump(value: Any, where: str) -> Any:
        if type(value) is not tp:
            raise _wrong(where, f"an instance of {label}", value)
        return {name: fn(getattr(value, name), _path(where, name)) for name, fn in dumps.items()}

    return dump


def _dump_typeddict(label: str, dumps: dict[str, Dump], required: set[str]) -> Dump:
    def dump(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise _wrong(where, f"a {label} (a dict)", value)
        out: dict[str, Any] = {}
        for name, v in value.items():  # in the dict's order, as json.dumps writes it
            fn = dumps.get(name)
            if fn is None:
                raise ShapeError(f"{_where(where)}: {label} has no field {name!r}")
            out[name] = fn(v, _path(where, name))
        for name in sorted(required - out.keys()):
            raise ShapeError(f"{_path(where, name)}: required field missing")
        return out

    return dump


def _load_record(tp: Any, loads: dict[str, Load], required: set[str]) -> Load:
    """A dataclass (``tp``) or TypedDict (None: the dict itself) from an object; fields it
    does not have are left out: ignored."""

    def load(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        kwargs: dict[str, Any] = {}
        for name, fn in loads.items():
            if name in value:
                kwargs[name] = fn(value[name], _path(where, name))
            elif name in required:
                raise ShapeError(f"{_path(where, name)}: required field missing")
        if tp is None:
            return kwargs
        try:
            return tp(**kwargs)
        except Exception as e:  # its __post_init__ refused it
            raise ShapeError(f"{_where(where)}: {tp.__name__} refused it: {e!r}") from None

    return load


def _def_names(records: Records) -> dict[Any, str]:
    """The ``$defs`` name of each record type: its ``__name__``, or, when another type met
    has that name too, its module and qualified name (``billing.models.Item``), numbered
    in the order met when even that is shared (``types.Item``, ``types.Item-2``: what
    ``make_dataclass`` gives). Only the characters OpenAPI allows in a component's name.
    The same each time the TaskType is made: the order met is the annotations' order."""
    counts: dict[str, int] = {}
    for tp in records:
        counts[tp.__name__] = counts.get(tp.__name__, 0) + 1
    out: dict[Any, str] = {}
    taken: set[str] = set()
    for tp in records:
        name = tp.__name__
        if counts[name] > 1:
            name = f"{tp.__module__}.{tp.__qualname__}"
        name = re.sub(r"[^A-Za-z0-9._-]", "_", name)
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}-{n}"
        taken.add(unique)
        out[tp] = unique
    return out


def _record_schema(tp: Any, fields: Fields, refs: Mapping[Any, str]) -> dict[str, Any]:
    hints, names, required = fields
    return {
        "type": "object",
        "title": tp.__name__,
        "properties": {n: _schema(hints[n], refs) for n in names},
        "required": [n for n in names if n in required],
    }


def _schema(tp: Any, refs: Mapping[Any, str]) -> dict[str, Any]:
    """The JSON Schema of an annotation _converters accepted (``refs``: each record type's
    name in ``$defs``)."""
    if get_origin(tp) in (typing.Required, typing.NotRequired):
        (tp,) = get_args(tp)
    simple = {
        str: {"type": "string"},
        int: {"type": "integer"},
        float: {"type": "number"},
        bool: {"type": "boolean"},
        type(None): {"type": "null"},
        datetime: {"type": "string", "format": "date-time"},
        date: {"type": "string", "format": "date"},
        uuid.UUID: {"type": "string", "format": "uuid"},
        Decimal: {"type": "string", "pattern": r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$"},
    }
    if tp is Any:
        return {}
    if isinstance(tp, type) and tp in simple:
        return dict(simple[tp])
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or is_typeddict(tp)):
        return {"$ref": f"#/$defs/{refs[tp]}"}
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _schema(args[0], refs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1], refs)}
    (inner,) = (a for a in args if a is not type(None))  # X | None
    return {"anyOf": [_schema(inner, refs), {"type": "null"}]}


# -- pydantic models and msgspec Structs, when their package is already imported -----------


def _pydantic_model(tp: Any) -> Shape | None:
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not (isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)):
        return None
    model: Any = tp
    invalid = pydantic.ValidationError

    def dump(value: Any) -> Any:
        if not isinstance(value, model):
            raise _wrong("", f"an instance of {model.__name__}", value)
        return value.model_dump(mode="json")

    def load(value: Any) -> Any:
        try:
            return model.model_validate(value)
        except invalid as e:
            raise ShapeError(_pydantic_text(e)) from None

    return Shape(model.__name__, dump, load, model.model_json_schema)


def _pydantic_text(e: Any) -> str:
    """``loc: msg`` of each error, without pydantic's links to its docs."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "the payload"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts) or str(e)


def _msgspec_struct(tp: Any) -> Shape | None:
    msgspec = sys.modules.get("msgspec")
    if msgspec is None or not (isinstance(tp, type) and issubclass(tp, msgspec.Struct)):
        return None

    def dump(value: Any) -> Any:
        if not isinstance(value, tp):
            raise _wrong("", f"an instance of {tp.__name__}", value)
        return msgspec.to_builtins(value)

    def load(value: Any) -> Any:
        try:
            return msgspec.convert(value, tp)
        except msgspec.ValidationError as e:
            raise ShapeError(str(e)) from None

    def schema() -> dict[str, Any]:
        out: dict[str, Any] = msgspec.json.schema(tp)
        return out

    return Shape(tp.__name__, dump, load, schema)
