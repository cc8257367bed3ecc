"""The model's frozen types as plain JSON and back, directed by their own annotations.

A shard's part travels between processes, machines and users, so it is data: JSON that
:func:`decode` turns into model objects only as the *type asked for* says (each dataclass
field's annotation), never as the bytes say. Nothing in a document names a class, a
module or a function; a value of the wrong JSON type, a missing or an extra field, an
unknown enum value, a list of the wrong length or nesting deeper than the types is a
:class:`CodecError` naming where. :func:`encode` is one ``orjson.dumps`` (dataclasses,
enums and tuples are native to it). What JSON cannot hold exactly is spelled out and read
back exactly: an integer past 64 bits (which JSON parsers read as a float) as
``{"__int__": "DIGITS"}``, a string that is not Unicode text (a file name's undecodable
bytes, held as lone surrogates) as ``{"__str__": [CODE POINTS]}``, and a mapping with such a
key as ``{"__dict__": [[KEY, VALUE], ...]}``. An integer field of a model type holds a signed
64-bit integer, as every collector reads one (a larger one is refused); only a value the types
leave open (a finding's) may be larger.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import orjson

from auditor.model import INT64_MAX, INT64_MIN
from auditor.model.study import Listing

T = TypeVar("T")
_BIG, _TEXT, _PAIRS = "__int__", "__str__", "__dict__"
MAX_DIGITS = 400
"""Digits of the longest integer a document may spell (a 64-bit one has 20)."""
_Decoder = Callable[[Any, str], Any]


class CodecError(ValueError):
    """A document that is not a value of the type asked for; ``str()`` says where."""


def encode(value: object) -> bytes:
    """``value`` (a model object, or tuples, dicts and scalars of them) as one line of JSON."""
    try:
        return orjson.dumps(value, default=_default)
    except orjson.JSONEncodeError:  # (a big integer or a lone surrogate: spelled out)
        return orjson.dumps(_spelled(value), default=_default)


def decode(document: Any, kind: type[T] | Any, where: str = "$") -> T:
    """``document`` (parsed JSON) as a value of ``kind``; :class:`CodecError` otherwise."""
    try:
        result: T = _decoder(typing.cast(Any, kind))(document, where)
    except RecursionError:  # (a type that holds itself, nested as deep as JSON allows)
        raise CodecError(f"{where}: nested deeper than a part can be") from None
    return result


def _default(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Listing):
        return {"joined": value.joined(), "irregular": sorted(value.irregular)}
    if isinstance(value, frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not part of a part")


def _spelled(value: object) -> object:
    """``value`` as plain JSON values, what JSON cannot hold exactly spelled out."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return {_TEXT: [ord(char) for char in value]}
        return value
    if isinstance(value, int):
        return value if -(2 ** 63) <= value < 2 ** 64 else {_BIG: str(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _spelled(getattr(value, f.name))
                for f in dataclasses.fields(value) if f.init}
    if isinstance(value, tuple | list):
        return [_spelled(item) for item in value]
    if isinstance(value, dict):
        pairs = [(_spelled(key), _spelled(item)) for key, item in value.items()]
        if all(isinstance(key, str) for key, _ in pairs):
            return dict(pairs)
        return {_PAIRS: [list(pair) for pair in pairs]}
    return _spelled(_default(value))


@cache
def _decoder(kind: Any) -> _Decoder:
    """How to make a ``kind`` (made once per type, kept)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or kind is object:
        return _plain
    if origin in (typing.Union, types.UnionType):
        others = [arg for arg in args if arg is not type(None)]
        if len(others) != 1 or len(args) != 2:
            raise TypeError(f"only X | None unions decode, not {kind}")
        inner = _decoder(others[0])
        return lambda doc, where: None if doc is None else inner(doc, where)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _decoder(args[0])
            return lambda doc, where: tuple(
                item(x, f"{where}[{n}]") for n, x in enumerate(_list(doc, where)))
        items = tuple(_decoder(arg) for arg in args)
        return lambda doc, where: _fixed(items, doc, where)
    if origin is frozenset:
        member = _decoder(args[0])
        return lambda doc, where: frozenset(
            member(x, f"{where}[{n}]") for n, x in enumerate(_list(doc, where)))
    if origin is dict:
        key, value = _decoder(args[0]), _decoder(args[1])
        return lambda doc, where: {key(k, where): value(v, f"{where}.{k}")
                                   for k, v in _pairs(doc, where)}
    if kind is Listing:
        return _listing
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return lambda doc, where: _enum(kind, doc, where)
    scalar = _SCALARS.get(kind)
    if scalar is None:
        raise TypeError(f"{kind} does not decode")
    return scalar


def _dataclass(kind: type[Any]) -> _Decoder:
    fields = [f for f in dataclasses.fields(kind) if f.init]
    names = frozenset(f.name for f in fields)
    decoders: list[tuple[str, _Decoder, frozenset[type]]] = []
    label = kind.__name__

    def make(doc: Any, where: str) -> Any:
        if not decoders:  # (made at first use: a type may hold itself, as a job its attempts)
            hints = typing.get_type_hints(kind)
            decoders.extend((f.name, _decoder(hints[f.name]), _plain_types(hints[f.name]))
                            for f in fields)
        if type(doc) is not dict or doc.keys() != names:
            if type(doc) is not dict:
                raise CodecError(f"{where}: expected a {label} object, got {_what(doc)}")
            wrong = sorted(doc.keys() ^ names)
            raise CodecError(f"{where}: {label} fields differ ({', '.join(wrong[:3])})")
        values = {}
        for name, field, plain in decoders:
            value = doc[name]
            # (a str, int, bool or None where the field takes one as it is: most fields,
            # kept without a call; anything else is decoded, or refused, by its decoder)
            values[name] = value if type(value) in plain else field(value, f"{where}.{name}")
        return kind(**values)
    return make


def _plain_types(kind: Any) -> frozenset[type]:
    """The JSON value types a field of ``kind`` takes as they are (none for the others)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 2 \
            and type(None) in args:
        inner = next(arg for arg in args if arg is not type(None))
        return frozenset({type(None)}) | _plain_types(inner) if _plain_types(inner) \
            else frozenset()
    return frozenset({kind}) if kind in (str, int, bool) else frozenset()


def _fixed(items: tuple[_Decoder, ...], doc: Any, where: str) -> tuple[Any, ...]:
    values = _list(doc, where)
    if len(values) != len(items):
        raise CodecError(f"{where}: expected {len(items)} items, got {len(values)}")
    pairs = enumerate(zip(items, values, strict=True))
    return tuple(item(x, f"{where}[{n}]") for n, (item, x) in pairs)


def _list(doc: Any, where: str) -> list[Any]:
    if type(doc) is not list:
        raise CodecError(f"{where}: expected a list, got {_what(doc)}")
    return doc


def _dict(doc: Any, where: str) -> dict[str, Any]:
    if type(doc) is not dict:
        raise CodecError(f"{where}: expected an object, got {_what(doc)}")
    return doc


def _pairs(doc: Any, where: str) -> list[tuple[Any, Any]]:
    """A mapping's (key, value) pairs: an object's, or those spelled out."""
    body = _dict(doc, where)
    if body.keys() != {_PAIRS}:
        return list(body.items())
    pairs = _list(body[_PAIRS], where)
    if not all(type(pair) is list and len(pair) == 2 for pair in pairs):
        raise CodecError(f"{where}: expected [key, value] pairs")
    return [(key, value) for key, value in pairs]


def _enum(kind: type[enum.Enum], doc: Any, where: str) -> enum.Enum:
    try:
        return kind(doc)
    except (ValueError, TypeError):
        raise CodecError(f"{where}: {_what(doc)} is no {kind.__name__}") from None


def _listing(doc: Any, where: str) -> Listing:
    body = _dict(doc, where)
    if body.keys() != {"joined", "irregular"}:
        raise CodecError(f"{where}: expected a listing's joined and irregular")
    joined = _decoder(dict[str, str])(body["joined"], f"{where}.joined")
    irregular = _decoder(frozenset[str])(body["irregular"], f"{where}.irregular")
    return Listing(joined, irregular)


def _int(doc: Any, where: str) -> int:
    if type(doc) is int:
        return doc
    if type(doc) is dict and doc.keys() == {_BIG} and type(doc[_BIG]) is str:
        digits = doc[_BIG]
        if 0 < len(digits) <= MAX_DIGITS and digits.lstrip("-").isdigit() \
                and digits.isascii():
            return int(digits)
    raise CodecError(f"{where}: expected an integer, got {_what(doc)}")


def _int64(doc: Any, where: str) -> int:
    """An integer field of a model type: a signed 64-bit one, as every collector reads them
    (``as_int``): a larger one is no audit's, and no table could hold it."""
    value = _int(doc, where)
    if not INT64_MIN <= value <= INT64_MAX:
        raise CodecError(f"{where}: {value} is past a signed 64-bit integer")
    return value


def _str(doc: Any, where: str) -> str:
    if type(doc) is str:
        return doc
    if type(doc) is dict and doc.keys() == {_TEXT} and type(doc[_TEXT]) is list \
            and all(type(code) is int and 0 <= code < 0x110000 for code in doc[_TEXT]):
        return "".join(map(chr, doc[_TEXT]))
    raise CodecError(f"{where}: expected a string, got {_what(doc)}")


def _scalar(kind: type[Any], label: str) -> _Decoder:
    def make(doc: Any, where: str) -> Any:
        if type(doc) is not kind:
            raise CodecError(f"{where}: expected {label}, got {_what(doc)}")
        return doc
    return make


def _path(doc: Any, where: str) -> Path:
    return Path(_str(doc, where))


def _plain(doc: Any, where: str) -> Any:
    """A value the types leave open (a finding's values): JSON's own, big integers
    spelled out made integers again."""
    if type(doc) is dict:
        if doc.keys() == {_BIG}:
            return _int(doc, where)
        if doc.keys() == {_TEXT}:
            return _str(doc, where)
        pairs = [(_plain(key, where), value) for key, value in _pairs(doc, where)]
        if not all(type(key) in (str, int, float, bool) or key is None for key, _ in pairs):
            raise CodecError(f"{where}: a mapping's key is not a JSON scalar")
        return {key: _plain(value, f"{where}.{key}") for key, value in pairs}
    if type(doc) is list:
        return [_plain(value, f"{where}[{n}]") for n, value in enumerate(doc)]
    return doc


def _what(doc: Any) -> str:
    """What a JSON value is, for a message (never the value itself, which may be huge)."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(doc), "?")


_SCALARS: dict[Any, _Decoder] = {
    int: _int64, str: _str, bool: _scalar(bool, "a boolean"),
    float: _scalar(float, "a number"), Path: _path, type(None): _scalar(type(None), "null"),
}
