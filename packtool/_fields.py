"""A record's named attributes as a dict: the JSON form the result records give
(``to_dict``, ``describe``, ``to_record``), written as the names, not as one line a key."""

from __future__ import annotations

from typing import Any

__all__ = ["attributes"]


def attributes(record: Any, names: str) -> dict[str, Any]:
    """``{name: record.name}`` for each of the space-separated ``names``, in their order.

    >>> from types import SimpleNamespace
    >>> attributes(SimpleNamespace(rows=3, feed="plain", seconds=0.5), "feed rows")
    {'feed': 'plain', 'rows': 3}
    """
    return {name: getattr(record, name) for name in names.split()}
