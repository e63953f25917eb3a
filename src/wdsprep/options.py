"""The one home of the conversion options' rules: every value is checked before any work starts.

`wdsprep convert`, `wdsprep.conversion.convert`, a `wdsprep pipeline` spec and `wdsprep fetch rawnind
--convert` all pass their options through `check_core_options` (shard size, codec, zstd level,
`--on-error`) and, for a conversion, `check_run_options` (fingerprint mode, split names, where the
output lies, and the executor, whose factory in `wdsprep.executors` owns the rules of `--workers`
and the Ray options); a source's own options go through its `Source.check_options` hook.
So a bad value is one `ConfigError` line naming the option, raised before any input is read or any
output written (never once per unit, from inside a worker), and no other module repeats a rule.

Invariants:
- `shard_bytes` is a positive whole number of bytes (`256MB`, `1GiB`, `65536`; `0` is refused);
- `zstd_level` is an integer zstd accepts, `MIN_ZSTD_LEVEL` (fastest) to `MAX_ZSTD_LEVEL` (smallest);
- a local output directory never lies inside (or is) the local input directory: its shards would
  be read back as input by the next run.
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable

from .errors import ConfigError
from .executors import get_executor
from .inputs import MODES as FINGERPRINT_MODES
from .shards.codec import Encoder
from .sources.base import DEFAULT_ON_ERROR, ON_ERROR, check_split_name
from .storage import local_path

MIN_ZSTD_LEVEL = -(1 << 17)  # zstd's ZSTD_minCLevel(): negative levels trade size for speed
MAX_ZSTD_LEVEL = 22  # zstd's ZSTD_maxCLevel()
CORE_DEFAULTS = {"shard_bytes": "256MB", "codec": "zstd", "zstd_level": 3, "on_error": DEFAULT_ON_ERROR}


def parse_size(text: str | int, option: str | None = None) -> int:
    """Bytes from `256MB`, `1GiB`, `65536` (K/M/G/T: powers of 1000, Ki/Mi/...: of 1024)."""
    match = None if isinstance(text, (bool, int)) else re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*", str(text), re.I)
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if not match:
        raise ConfigError(f"{option + ': ' if option else ''}cannot read size {text!r} (e.g. 256MB, 1GiB, 65536)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    powers = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
    letter = unit[:1] if unit[:1] in "KMGT" and unit else ""
    base = 1024 if "I" in unit else 1000
    return int(number * base ** powers[letter])


def _integer(value: Any, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{option} must be an integer (got {value!r})")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{option} must be an integer (got {value!r})") from None


def check_core_options(options: dict) -> dict:
    """`options` with `shard_bytes`, `codec`, `zstd_level` and `on_error` checked and normalised
    (missing ones take `CORE_DEFAULTS`); a bad value is a ConfigError naming the option."""
    options = {**CORE_DEFAULTS, **options}
    shard_bytes = parse_size(options["shard_bytes"], "--shard-bytes")
    if shard_bytes < 1:
        raise ConfigError(f"--shard-bytes must be a positive size such as 256MB (got {options['shard_bytes']!r})")
    level = _integer(options["zstd_level"], "--zstd-level")
    if not MIN_ZSTD_LEVEL <= level <= MAX_ZSTD_LEVEL:
        raise ConfigError(f"--zstd-level must be from {MIN_ZSTD_LEVEL} to {MAX_ZSTD_LEVEL} "
                          f"(1-22: higher is smaller and slower; negative: faster still), got {level}")
    Encoder(options["codec"], level)  # the codec table's own rule names the codecs it knows
    on_error = options["on_error"] or DEFAULT_ON_ERROR
    if on_error not in ON_ERROR:
        raise ConfigError(f"--on-error must be one of {', '.join(ON_ERROR)} (got {on_error!r})")
    return dict(options, shard_bytes=shard_bytes, zstd_level=level, on_error=on_error)


def check_run_options(*, input: str, output: str, workers: Any, executor: str, fingerprint: str | None,
                      splits: Iterable[str] | None, executor_options: dict | None = None):
    """The options of one conversion run besides the core ones; returns `(workers, executor)`, the
    executor made here so that its factory's rules (`--workers` at least 1, the Ray options) also
    apply before any work."""
    if fingerprint is not None and fingerprint not in FINGERPRINT_MODES:
        raise ConfigError(f"--fingerprint must be one of {', '.join(FINGERPRINT_MODES)} (got {fingerprint!r})")
    for split in splits or ():
        check_split_name(split, "--split", ConfigError)
    check_output_outside_input(input, output)
    workers = _integer(workers, "--workers")
    return workers, get_executor(executor, workers=workers, **(executor_options or {}))


def check_output_outside_input(input: str, output: str) -> None:
    """Refuse a local output directory that is (or lies inside) the local input directory."""
    source, target = local_path(str(input)), local_path(str(output))
    if source is None or target is None or not os.path.isdir(source):
        return
    source, target = os.path.realpath(source), os.path.realpath(target)
    if target == source or target.startswith(source.rstrip(os.sep) + os.sep):
        raise ConfigError(f"{output}: the output directory lies inside the input {input}; "
                          "its shards would be read back as input (choose an output outside it)")
