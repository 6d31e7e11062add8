"""The command line's option values converted without a pydantic model per option.

typer converts every option of the command that runs, given or not, through a pydantic
``TypeAdapter`` it builds for that option on each run: for ``pack``'s 40 options, importing
pydantic and building the adapters took about 0.05 s of every run (measured on this machine:
0.084 s to parse ``pack``'s command line, 0.038 s without). packtool's options are plain:
``str``, ``int``, ``float``, ``bool`` and paths read by a parser function, or lists of them.

:func:`plain_values` gives each such option a ``process_value`` (click's own hook) that
converts as typer's adapters do: an option left at its default keeps it, a parser is called
on each value (its ``ValueError`` said as pydantic says it), a string is the string, and an
integer or a number written plainly is read with ``int``/``float``. Anything else (a value in
another spelling, a required option that is missing, or a path without a parser) goes to
typer's own conversion, so what is accepted and every error message
stay typer's. ``tests/test_params.py`` checks both agree on generated values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, get_args, get_origin

import typer

__all__ = ["plain_values"]

_INT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
_FLOAT = re.compile(r"\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*", re.ASCII)
_TYPER = object()  # a value this module leaves to typer


def _str(value: Any) -> Any:
    return value if isinstance(value, str) else _TYPER


def _int(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and _INT.fullmatch(value) else _TYPER


def _float(value: Any) -> Any:
    if isinstance(value, float):
        return value
    return float(value) if isinstance(value, str) and _FLOAT.fullmatch(value) else _TYPER


def _bool(value: Any) -> Any:
    return value if isinstance(value, bool) else _TYPER


def _parsed(parser: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        try:
            return parser(value)
        except ValueError as e:  # as a pydantic validator's error reads
            raise typer.BadParameter(f"Value error, {e}") from None

    return convert


_PLAIN: dict[Any, Callable[[Any], Any]] = {str: _str, int: _int, float: _float, bool: _bool}


def _converter(param: Any) -> Callable[[Any], Any] | None:
    """How to convert one value of ``param``, or ``None``: typer converts them all."""
    descriptor = getattr(param, "type_descriptor", None)
    info = getattr(descriptor, "parameter_info", None)
    if descriptor is None or info is None:
        return None
    if getattr(descriptor, "file_annotation", None) is not None:
        return None
    if info.min is not None or info.max is not None or getattr(descriptor, "is_choice", True):
        return None
    annotation = descriptor.annotation
    multi = param.multiple or param.nargs == -1
    if multi:
        if get_origin(annotation) is not list or len(get_args(annotation)) != 1:
            return None
        annotation = get_args(annotation)[0]
    if info.parser is not None:
        return _parsed(info.parser)
    if annotation is Path:
        return None  # typer's own checks of a path
    return _PLAIN.get(annotation)


def _process(param: Any, convert: Callable[[Any], Any], typer_process: Any) -> Any:
    multi = param.multiple or param.nargs == -1

    def converted(value: Any) -> Any:
        if value is None:  # not given, no default
            return () if multi else None
        if value is param.default and not multi:
            return value  # left at its default, already the declared type
        if multi and not isinstance(value, (list, tuple)):
            return _TYPER
        out = []
        for item in value if multi else (value,):
            one = convert(item)
            if one is _TYPER:
                return _TYPER
            out.append(one)
        return out if multi else out[0]

    def process_value(ctx: Any, value: Any) -> Any:
        result = converted(value)
        if result is _TYPER or (param.required and param.value_is_missing(result)):
            return typer_process(ctx, value)  # typer's conversion, or its missing error
        if param.callback is not None:
            result = param.callback(ctx, param, result)
        return result

    return process_value


def plain_values(params: Iterable[Any]) -> None:
    """Give each plain option of ``params`` (a command's) the conversion above."""
    for param in params:
        convert = None if "process_value" in vars(param) else _converter(param)
        if convert is not None:
            param.process_value = _process(param, convert, param.process_value)
