"""The conversion's options: `ConvertOptions`, the one home of their defaults and their rules.

`ConvertOptions` is a frozen dataclass of the core's options: what the shards' bytes depend on
(`shard_bytes`, `codec`, `zstd_level`, `on_error`: `config()`, recorded in the manifest) and how the
run goes (`workers`, `executor` and its `executor_options`, `fingerprint`, `splits`), and `index_fields`, what
each split's sample table records besides the keys (shards/samples.py; not the shards' bytes). Its field
defaults are the only defaults: `wdsprep.conversion.convert`'s keywords, `wdsprep convert`'s flags
(`cli`), a `wdsprep pipeline` spec and rawnind's `fetch --convert` all start from them. A source's
own options (`--tile-size`, ...) are never mixed in: `ConvertOptions.split` takes a mapping apart
into the core options and the source's own, and a source gets them apart (`ctx.core`, `ctx.options`;
its `Source.check_options` hook sees only its own).

Every value is checked before any work starts (`checked()`, and `check_run_options` for where the
output lies and the executor, whose entry in `wdsprep.executors` owns the rules of `--workers` and
of its own flags), so a bad value is one `ConfigError` line naming the option, raised before any
input is read or any output written (never once per unit, from inside a worker).

Invariants of a checked `ConvertOptions`:
- `shard_bytes` is a positive whole number of bytes (`256MB`, `1GiB`, `65536` are read by
  `wdsprep.sizes.parse_size`; `0` is refused);
- `zstd_level` is an integer zstd accepts, `MIN_ZSTD_LEVEL` (fastest) to `MAX_ZSTD_LEVEL` (smallest);
- `pack` is a bool (`--pack`: small samples packed into blocks, shards/packed.py);
- `on_error` is one of `ON_ERROR`; `workers` an integer; `splits` a tuple of split names or None;
- `index_fields` is None (the source's `Source.index_fields`) or a tuple of distinct field names, each a
  field or a dotted path of Python identifiers (`label`, `meta.episode`: what a `select=` expression
  names), given as a list or as one comma-separated string (`"label,meta.iso"`; `""`: keys only);
- a local output directory never lies inside (or is) the local input directory (`check_run_options`):
  its shards would be read back as input by the next run.
"""
from __future__ import annotations

import dataclasses
import keyword
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from .errors import ConfigError
from .executors import get_executor
from .inputs import MODES as FINGERPRINT_MODES
from .shards.codec import Encoder
from .shards.manifest import check_split_name
from .sizes import parse_size
from .storage import check_url, local_path

MIN_ZSTD_LEVEL = -(1 << 17)  # zstd's ZSTD_minCLevel(): negative levels trade size for speed
MAX_ZSTD_LEVEL = 22  # zstd's ZSTD_maxCLevel()
ON_ERROR = ("raise", "skip")
DEFAULT_ON_ERROR = "raise"  # what `--on-error` and options without `on_error` mean


@dataclass(frozen=True)
class ConvertOptions:
    """The core's options of one conversion, with their defaults (see the module docstring)."""

    shard_bytes: int | str = "256MB"  # target shard size, tar headers included
    codec: str = "zstd"  # array member codec (`shards.codec.ARRAY_CODECS`)
    zstd_level: int = 3
    on_error: str = DEFAULT_ON_ERROR  # a bad input item: "raise" stops, "skip" reports it in the manifest
    workers: int = 1  # parallel unit builders (the bytes do not depend on it)
    executor: str = "local"  # a name of `wdsprep.executors.EXECUTORS`
    executor_options: dict = field(default_factory=dict)  # that executor's own options (Ray: address, retries, ...)
    fingerprint: str | None = None  # how changed inputs are found (`wdsprep.inputs.MODES`); None: the source's
    splits: tuple | None = None  # convert only these splits
    # per-sample fields recorded in each split's sample table for selections (`select="label == 3"`):
    # None: the source's defaults (`Source.index_fields`); () : keys only. Not in `config()`: the
    # shards' bytes do not depend on it (a unit recorded with other fields is built again)
    index_fields: tuple | None = None
    # small samples packed into blocks, one member each (shards/packed.py; `--pack`); off by default:
    # a packed shard's small samples are members of a block, which plain tar/HF readers see as such
    pack: bool = False

    CONFIG: ClassVar[tuple] = ("shard_bytes", "codec", "zstd_level", "on_error")  # what the bytes depend on

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def split(cls, options: Mapping[str, Any], base: "ConvertOptions | None" = None) -> tuple["ConvertOptions", dict]:
        """`options` taken apart: the core's, over `base` (default: the defaults), and the source's
        own. A None core value leaves the base value (an absent flag)."""
        names = cls.names()
        core = {name: value for name, value in options.items() if name in names and value is not None}
        return (base or cls()).replace(**core), {name: value for name, value in options.items() if name not in names}

    def replace(self, **changes: Any) -> "ConvertOptions":
        return dataclasses.replace(self, **changes)

    def config(self) -> dict:
        """The options the shards' bytes depend on, as the manifest's config records them (`pack` only
        when on: a conversion without it records what it did before packing existed)."""
        config = {name: getattr(self, name) for name in self.CONFIG}
        if self.pack:
            config["pack"] = True
        return config

    def checked(self) -> "ConvertOptions":
        """These options with every value checked and normalised; a bad value is a ConfigError naming
        the option. The executor and the output's place are `check_run_options`'s."""
        shard_bytes = parse_size(self.shard_bytes, "--shard-bytes")
        if shard_bytes < 1:
            raise ConfigError(f"--shard-bytes must be a positive size such as 256MB (got {self.shard_bytes!r})")
        level = _integer(self.zstd_level, "--zstd-level")
        if not MIN_ZSTD_LEVEL <= level <= MAX_ZSTD_LEVEL:
            raise ConfigError(f"--zstd-level must be from {MIN_ZSTD_LEVEL} to {MAX_ZSTD_LEVEL} "
                              f"(1-22: higher is smaller and slower; negative: faster still), got {level}")
        Encoder(self.codec, level)  # the codec table's own rule names the codecs it knows
        on_error = self.on_error or DEFAULT_ON_ERROR
        if on_error not in ON_ERROR:
            raise ConfigError(f"--on-error must be one of {', '.join(ON_ERROR)} (got {on_error!r})")
        if self.fingerprint is not None and self.fingerprint not in FINGERPRINT_MODES:
            raise ConfigError(f"--fingerprint must be one of {', '.join(FINGERPRINT_MODES)} (got {self.fingerprint!r})")
        if not isinstance(self.pack, bool):
            raise ConfigError(f"pack must be true or false (got {self.pack!r})")
        splits = None if self.splits is None else tuple(self.splits)
        for split in splits or ():
            check_split_name(split, "--split", ConfigError)
        return self.replace(shard_bytes=shard_bytes, zstd_level=level, on_error=on_error, splits=splits,
                            index_fields=check_index_fields(self.index_fields),
                            workers=_integer(self.workers, "--workers"), executor_options=dict(self.executor_options or {}))


DEFAULTS = ConvertOptions()  # what an option left out means, for help texts


def _integer(value: Any, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{option} must be an integer (got {value!r})")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{option} must be an integer (got {value!r})") from None


def check_index_fields(fields: Any) -> tuple[str, ...] | None:
    """`index_fields` as a tuple of checked names (None stays None: the source's defaults)."""
    if fields is None:
        return None
    if isinstance(fields, str):
        fields = [name.strip() for name in fields.split(",") if name.strip()]
    elif not isinstance(fields, (list, tuple)) or not all(isinstance(name, str) for name in fields):
        raise ConfigError(f"--index-fields must be field names, as a list or comma-separated (got {fields!r})")
    for name in fields:
        if not all(part.isidentifier() and not keyword.iskeyword(part) for part in name.split(".")):
            raise ConfigError(f"--index-fields: {name!r} is not a field name or a dotted path of names "
                              "(such as label or meta.episode)")
    if len(set(fields)) != len(fields):
        raise ConfigError(f"--index-fields: {next(n for n in fields if fields.count(n) > 1)!r} is named twice")
    return tuple(fields)


def check_run_options(options: ConvertOptions, *, input: str, output: str):
    """Where the output lies (a scheme that writes, outside the input), and the executor, made here
    so that its entry's rules (`--workers` at least 1, the Ray options) also apply before any work;
    returns the executor."""
    check_url(str(output), writable=True)
    check_output_outside_input(input, output)
    return get_executor(options.executor, workers=options.workers, **options.executor_options)


def check_output_outside_input(input: str, output: str) -> None:
    """Refuse a local output directory that is (or lies inside) the local input directory."""
    source, target = local_path(str(input)), local_path(str(output))
    if source is None or target is None or not os.path.isdir(source):
        return
    source, target = os.path.realpath(source), os.path.realpath(target)
    if target == source or target.startswith(source.rstrip(os.sep) + os.sep):
        raise ConfigError(f"{output}: the output directory lies inside the input {input}; "
                          "its shards would be read back as input (choose an output outside it)")
