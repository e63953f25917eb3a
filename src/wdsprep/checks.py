"""The generic checks of a setting's value, one wording for every layer: a value a setting cannot take
is one `ConfigError` line, `NAME=VALUE: must be RULE (MEANING)`.

    whole_number(value, name, minimum)   an int >= minimum (and <= maximum): `must be a whole number >= 1`
    number(value, name, minimum)         a finite number >= minimum (> it with `above`; <= maximum)
    size(value, name, minimum)           bytes, an int or a size as `sizes.parse_size` reads it (`64MiB`),
                                         <= maximum
    one_of(value, name, choices)         one of a few values: `must be one of 'pad', 'drop', None`
    function(value, name)                a callable (None allowed with `optional`)

`name` is what the user wrote: a keyword (`retries`), an environment variable (`WDSPREP_RETRIES`),
or a place and a field (`mix: part 1: weight`); None leaves it out, where the caller says it already
(argparse's `argument --fraction: ...`). `meaning` says what the setting does and its default, in
the parentheses after the rule. Text is taken where a number may be written as text (environment
variables, command lines): `text=False` refuses it where a number must be a number (a mix file's
weight). Numbers are Python's or numpy's (`numbers.Integral`, `numbers.Real`), never a bool.

Used by the read side's settings (readoptions.py), the stream's options (stream/), the Ray executor
and the command line. Depends on nothing but `errors` and `sizes`: the ground floor (docs/layout.md).
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable

from .errors import ConfigError
from .sizes import parse_size


def refuse(value: Any, name: str | None, rule: str, meaning: str = "") -> ConfigError:
    """The one line of a value `name` cannot take: `name=value: must be ... (meaning)`."""
    label = shown(value) if name is None else f"{name}={shown(value)}"
    return ConfigError(f"{label}: {rule}{f' ({meaning})' if meaning else ''}")


def shown(value: Any) -> str:
    """A value as an error line shows it: its repr, cut to 80 characters; an integer too long to print
    by its digits (Python makes no text of one past 4300 digits) by their number."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)).bit_length() > 64:
        return f"an integer of about {int(abs(int(value)).bit_length() * 0.30103) + 1} digits"
    return f"{value!r:.80}"


def whole_number(value: Any, name: str | None, minimum: int, meaning: str = "", *, maximum: int | None = None,
                 text: bool = True) -> int:
    """`value` (an integer, an integral float, or with `text` its decimal text) as an int >= `minimum`
    (and <= `maximum`, said after the meaning); else one ConfigError line."""
    rule = f"must be a whole number >= {minimum}"
    if maximum is not None:
        meaning = f"{meaning}; at most {maximum}" if meaning else f"at most {maximum}"
    number = None
    if isinstance(value, str) and text:
        try:
            number = int(value.strip(), 10)
        except ValueError:
            pass
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        raise refuse(value, name, rule, meaning)
    return number


def number(value: Any, name: str | None, minimum: float, meaning: str = "", *, above: bool = False,
           maximum: float | None = None, text: bool = True) -> float:
    """`value` (a finite number, or with `text` its text: `30`, `0.5`, `1e3`) as a float >= `minimum`
    (> it with `above`) and <= `maximum`; else one ConfigError line."""
    rule = f"must be a number {'>' if above else '>='} {minimum:g}" + ("" if maximum is None else f" and <= {maximum:g}")
    if isinstance(value, bool) or not (isinstance(value, numbers.Real) or (text and isinstance(value, str))):
        raise refuse(value, name, rule, meaning)
    try:
        result = float(value)
    except (ValueError, OverflowError):
        raise refuse(value, name, rule, meaning) from None
    if not math.isfinite(result) or result < minimum or (above and result == minimum) or (
            maximum is not None and result > maximum):
        raise refuse(value, name, rule, meaning)
    return result


def size(value: Any, name: str | None, minimum: int, meaning: str = "", *, zero: str = "",
         maximum: int | None = None) -> int:
    """`value` (bytes: an int, or a size as `parse_size` reads it, `64MiB`) as an int >= `minimum`
    (and <= `maximum`), or 0 when `zero` says what 0 means; else one ConfigError line."""
    floor = f"a size of at least {spelled(minimum)}" if minimum > 1 else f"a size >= {minimum} bytes"
    ceiling = f" and at most {spelled(maximum)}" if maximum is not None else ""
    rule = f"must be {f'0 ({zero}) or ' if zero else ''}{floor}{ceiling}, e.g. 64MiB"
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float, str)):
        raise refuse(value, name, rule, meaning)
    if isinstance(value, float) and not math.isfinite(value):
        raise refuse(value, name, rule, meaning)
    try:
        count = int(value) if isinstance(value, (float, numbers.Integral)) else parse_size(value)
    except ConfigError:
        raise refuse(value, name, rule, meaning) from None
    if (count < minimum and not (zero and count == 0)) or (maximum is not None and count > maximum):
        raise refuse(value, name, rule, meaning)
    return count


def spelled(count: int) -> str:
    """`131072` -> `128KiB`: a byte count as a user would write it."""
    for unit, power in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count and count % (1 << power) == 0:
            return f"{count >> power}{unit}"
    return f"{count} bytes"


def one_of(value: Any, name: str | None, choices: Iterable, meaning: str = "") -> Any:
    """`value` when it is one of `choices` (compared with ==, never a bool for a number); else one
    ConfigError line listing them."""
    choices = tuple(choices)
    if not any(value == choice and type(value) is type(choice) for choice in choices):
        raise refuse(value, name, f"must be one of {', '.join(map(repr, choices))}", meaning)
    return value


def function(value: Any, name: str | None, meaning: str = "", *, optional: bool = False) -> Any:
    """`value` when it is callable (or None with `optional`); else one ConfigError line."""
    if not callable(value) and not (optional and value is None):
        raise refuse(value, name, "must be a function" + (" or None" if optional else ""), meaning)
    return value
