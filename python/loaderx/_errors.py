"""The storage error type shared by the native extension and the Python layer."""

from __future__ import annotations

__all__ = ["ArgumentTypeError", "SchemaError", "ZrecordError"]


class ZrecordError(RuntimeError):
    """A storage failure, with loaderx 2.0.0's integer ``code``.

    Codes: -1 out of memory, -2 I/O failed, -4 record too large, -5 store
    full, -6 buffer too small, -7 a stored record failed to decode (or has the
    wrong size), -8 invalid store format, -9 dictionary training failed,
    -12 store already exists, -13 store busy.
    """

    OUT_OF_MEMORY = -1
    IO = -2
    RECORD_TOO_LARGE = -4
    STORE_FULL = -5
    BUFFER_TOO_SMALL = -6
    CORRUPT = -7
    INVALID_FORMAT = -8
    DICT_TRAINING = -9
    ALREADY_EXISTS = -12
    BUSY = -13

    code: int

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = int(code)

    # Keep the code across pickling (e.g. to a parent process).
    def __reduce__(self) -> tuple[type[ZrecordError], tuple[str, int]]:
        return (type(self), (str(self), self.code))


class SchemaError(ValueError):
    """A store whose schema is not the one the store kind expects: e.g.
    ``Dense.open`` of a Ragged store (``invalid dense schema fields, expected
    ['dtype', 'item_shape']: ...``), or a store set whose manifest names the
    other kind.

    loaderx 2.0.0 raises ``ValueError`` here, so this is a ``ValueError``
    subclass: ``except ValueError`` still catches it. It has no ``code``:
    the store's files are well formed, they hold the other kind of store
    (a malformed schema is ``ZrecordError`` -8).
    """


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type where loaderx 2.0.0 raises TypeError but
    the API contract promises ValueError (e.g. ``DataLoader(None)``): both
    ``except TypeError`` and ``except ValueError`` catch it."""
