"""Sizes in bytes as people write them: the one reader of `256MB`, `1GiB`, `65536`.

Used by every option that takes a size (`--shard-bytes`, `--max-raw-bytes`, `upload --part-bytes`,
...). Invariants: K/M/G/T are powers of 1000 and Ki/Mi/Gi/Ti powers of 1024 (a trailing `B` is
optional, letters in either case); an int is taken as it is; anything else is one `ConfigError`
naming the option when the caller gives its name. Depends on nothing but `errors`, so any module
(sources included) may import it.
"""
from __future__ import annotations

import re

from .errors import ConfigError

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*", re.I)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(text: str | int, option: str | None = None) -> int:
    """Bytes from `256MB`, `1GiB`, `65536` (K/M/G/T: powers of 1000, Ki/Mi/...: of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = None if isinstance(text, bool) else _SIZE.fullmatch(str(text))
    if not match:
        raise ConfigError(f"{option + ': ' if option else ''}cannot read size {text!r} (e.g. 256MB, 1GiB, 65536)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    letter = unit[:1] if unit[:1] in "KMGT" and unit else ""
    base = 1024 if "I" in unit else 1000
    return int(number * base ** _POWERS[letter])
