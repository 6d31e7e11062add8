"""packtool's exceptions.

The library raises these; the CLI turns each into a one-line message and a non-zero exit.
Every message names where the problem is (file, line, row) and, where there is one, the
option that fixes it.
"""

from __future__ import annotations

__all__ = [
    "BadRecordError",
    "ChatTemplateError",
    "FieldError",
    "FormatError",
    "InputError",
    "NothingToPackError",
    "OptionError",
    "OutputExistsError",
    "PacktoolError",
    "RowIndexError",
    "StoreError",
    "TokenizerError",
]


class PacktoolError(Exception):
    """Base class: a user-facing problem with a message fit to print as is."""

    exit_code: int = 1


class OptionError(PacktoolError, ValueError):
    """An option value is invalid (e.g. ``max_len < 2``)."""

    exit_code = 2


class FieldError(OptionError):
    """A field named by an option (``--text-field``, ``--ids-field``...) is not in the first
    record of the inputs: a mistyped name, or (``verify --against``) another input."""


class InputError(PacktoolError):
    """An input cannot be found or read as a whole."""


class NothingToPackError(InputError):
    """The inputs hold no document with tokens to pack (empty files, empty documents...)."""


class BadRecordError(InputError):
    """One record of an input is malformed (bad JSON, missing or non-string text field).

    ``--skip-bad-records`` counts and skips these instead of stopping.
    """

    def __init__(self, location: str, problem: str, hint: str = "") -> None:
        self.location = location
        self.problem = problem
        self.hint = hint
        message = f"{location}: {problem}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)

    def with_skip_hint(self) -> BadRecordError:
        """The same error, its hint also naming ``--skip-bad-records``."""
        skip = "or pass --skip-bad-records to skip such records"
        return BadRecordError(
            self.location, self.problem, f"{self.hint}; {skip}" if self.hint else skip
        )


class TokenizerError(PacktoolError):
    """The tokenizer cannot be found, loaded, or lacks a needed special token."""


class OutputExistsError(PacktoolError):
    """The output directory exists and ``overwrite`` was not given."""


class StoreError(PacktoolError):
    """An object store (an fsspec URL) cannot be used: unknown protocol or its package missing,
    no such bucket, no credentials, access denied."""


class RowIndexError(PacktoolError, IndexError):
    """A row number outside a packed dataset (also an ``IndexError``, as sequences raise)."""

    exit_code = 2


class FormatError(PacktoolError):
    """A directory is not a packtool output, or its manifest or shards are not readable."""


class ChatTemplateError(PacktoolError):
    """A chat template cannot be found or compiled, or tried something the sandbox forbids.

    An error raised while rendering one record (``raise_exception`` in the template, a missing
    key) is a :class:`BadRecordError` instead, naming the record.
    """
