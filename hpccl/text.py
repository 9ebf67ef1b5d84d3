"""Plain text from what other software hands hpccl (MPI, CUDA, NVML, UCX version strings, their error
messages, host names): control characters and terminal escapes removed, so what hpccl prints is text a
pipe, grep or a JSON reader takes as such (Open MPI's library version ends with a NUL byte)."""
from __future__ import annotations

import re
import unicodedata

_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def clean(line: str) -> str:
    """One line without terminal escapes, control characters (tabs become spaces) or bidi overrides."""
    line = _ESCAPE.sub("", line.replace("\t", " "))
    return "".join(c for c in line if c not in _BIDI and unicodedata.category(c) != "Cc").strip()


def lines(value: object) -> list:
    """The non-empty lines of ``value`` (str, bytes as UTF-8, or anything str() takes), each clean()."""
    text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return [x for x in (clean(part) for part in text.splitlines()) if x]


def one_line(value: object) -> str:
    """``value`` as one plain line: its first non-empty line (a library's version banner's first line)."""
    found = lines(value)
    return found[0] if found else ""


def plain(value: object, sep: str = " | ") -> str:
    """``value`` as one plain line with every non-empty line kept, joined by ``sep`` (a log record)."""
    return sep.join(lines(value))


def block(value: object) -> str:
    """A multi-line report (hpccl-info's) with every line clean; its indentation and empty lines kept."""
    text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    out = []
    for part in text.splitlines():
        indent = len(part) - len(part.lstrip(" "))
        out.append(" " * indent + clean(part))
    return "\n".join(out)
