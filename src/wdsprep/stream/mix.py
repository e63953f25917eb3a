"""`wdsprep.mix(parts, ...)`: several datasets as one stream, planned per (seed, epoch) before the
rank/worker split, so every rank and worker gets the same number of training samples in exact
proportions, and a state resumes the mix exactly (on the same world or another).

The rules (docs/mixing.md says them for users; tests/core/test_mix_oracle.py models them, and
tests/core/test_mix_schedule.py the schedules, M7 and M8):

M1. Parts p = 0..P-1, each one split of one manifest narrowed by its selection (a `Catalog`), with
    its own reader stages and, when a stage turns a sample into several training samples, its
    `outputs_per_sample`. A part's size is its samples, or its outputs when it declares them. Its
    weight (repeat) is a real number > 0 that a float can hold (numpy scalars too), kept exactly as a
    Fraction; its name a non-empty string. Two parts keeping the same samples of the same shards and
    split (however their selections are written) are one part read twice: refused, naming both.
M2. How many of each part an epoch holds (n_p, in the part's unit):
    - weighted: the shares q_p = w_p / sum(w). For a total S, n_p(S) is the largest-remainder
      apportionment of S by the shares (ties to the lower part index). S is `samples_per_epoch`
      when given; else with stop="first" the largest S with n_p(S) <= size_p for every part (the
      epoch ends when the first part runs out), with stop="all" the smallest S with n_p(S) >= size_p
      for every part (smaller parts cycle until every part was seen whole). Those S are found in a
      window computed in closed form (`_fitted`), at most MAX_TOTALS_TRIED totals, else refused.
    - epochized: n_p = size_p * repeat_p, rounded half up (a part it rounds to 0 is warned about).
    An epoch holds at most MAX_EPOCH_SAMPLES (2**32) samples of all parts: more is refused.
M3. Part p's epoch sequence: passes j = 0, 1, ..., pass j being every sample of the part in the shard
    order of PCG64([seed, epoch, 0x5EED, p, j]) (pass 0 of part 0 uses (seed, epoch) like
    `wdsprep.dataset`, so a one-part mix is that dataset), cut after n_p samples (with outputs:
    after the first sample that brings the outputs to n_p). A sample's identity is (pass, shard, index).
    It is held as the rule it is (stream/planning/plan.py's `Passes`): a pass is made when a position in it
    is dealt or read, so len(), the dealing and a worker's first sample cost no step per pass.
M4. Each part's sequence is dealt to ranks and workers by stream/planning/plan.py's rules 3-7 (equalize, the
    weighted cuts on outputs, elastic remainders), part by part: with equalize, worker k of every rank
    gets the same count c_p of each part. equalize="pad" gives a part with fewer samples in the epoch
    than ranks to every rank (repeats); "drop" would drop it on every rank, so such a mix is refused.
M5. A worker's stream interleaves its parts' outputs by the earliest-deadline schedule over (c_p):
    slot t = 1..T (T = sum c_p) goes, among the parts p with taken_p * T < t * c_p, to the one whose
    next output has the earliest deadline (taken_p + 1) / c_p (ties to the lower index). So after
    every slot, |taken_p - t * c_p / T| < 1 for every part. With `shuffle_buffer` B > 1 the parts of
    each block of B slots are permuted by PCG64([seed, epoch, rank, worker, block, 0x313C]) (the
    counts hold exactly at block ends), and each part's own stream is block-shuffled by rule 6 with
    its share of the buffer, B_p = max(1, round(B * n_p / sum(n))) (half up): the parts' blocks
    together hold about B samples, as one dataset's buffer of B does. The schedule has no closed
    form: it is made as the stream is read (kept when short), and a resumed worker makes its slots
    before its position again (about half a microsecond each: why an epoch is bounded, M2).
M6. Each output that is a dict names its part in `__part__` (and, in a mix of several phases, its
    phase in `__phase__`, M8). Stages composed on the mix run on the mixed stream, past the counting
    point (as batching does): they must map one sample to one.
M7. A schedule (weighted mode; the parts then have no weight of their own) is phases k = 0..K-1
    (K <= MAX_PHASES), phase k holding the epoch's positions [b_k, b_k+1) (b_K = S) with weights
    w_k,p >= 0, one > 0 in every phase and every part > 0 in some phase. Phase k's `start` is a
    sample position (a whole number: b_k = start, below S) or a fraction of the epoch (0 < f < 1,
    read as the decimal it prints as: b_k = floor(f * S)); the first start is 0, starts increase and
    are all of one kind. Phase k holds n_k,p = the apportionment (M2) of its L_k = b_k+1 - b_k samples
    by w_k, and the epoch n_p = sum_k n_k,p. S is `samples_per_epoch`, else the largest total whose
    n_p fit every size (stop="first") or the smallest whose n_p cover every size (stop="all"), with
    sample-position starts a total past the last start; n_p(S) is within 2K of a line A_p + B_p * S
    (each phase's length and apportionment off by less than one), so the answer lies in a window
    found in closed form, tried total by total (at most MAX_TOTALS_TRIED totals x phases, else
    refused naming a `samples_per_epoch`). A one-phase schedule is M2's weights, and a mix without
    a schedule is one phase (its states are the same).
M8. Part p's epoch sequence (M3, cut after n_p) is cut into consecutive segments, phase k's its next
    n_k,p samples (with outputs: up to the sample that brings its outputs to n_0,p + ... + n_k,p), so
    a part is read once an epoch unless its n_p passes its size, and each phase's segments are dealt
    (M4) and interleaved (M5) alone: every worker of every rank gets the same counts in every phase,
    and within ±1 of its phase's counts in every prefix of the phase (at block ends with a shuffle
    buffer, whose blocks start again at each phase, each part's buffer share by n_k,p / L_k). Phase
    0 is keyed as M4 and M5 say; phase k > 0 puts (0x9A5E, k) after the worker (after the part) in
    every key. A worker's stream is its phases one after the other; its position is its phase and
    that phase's per-part positions (M5's schedule restarts at each phase). An elastic resume deals
    each phase's remainder: a phase an old worker had passed counts as delivered whole by it, its
    current phase as its position says. With equalize="drop", a part with weight > 0 in a phase
    whose segment holds fewer samples than ranks is refused (M4).

A pass's part sequences (M3 cut into phases by M8, less what interrupted passes delivered) are
planned once per (epoch, interrupted passes, phase counts) and kept, the latest pass only
(`PlannedDataset.planned`): `wdsprep.Loader` plans them before it forks its workers, which inherit them.

Remote parts share the worker's read-ahead: its byte budget and connections are divided among them
by their share of the bytes it reads in the phase (`_read_ahead_shares`), so a mix holds and sends
no more than one dataset would.

A worker's stream takes each slot's sample out of its part's shards itself when every part is local
and decodes in its reader (`_taken_in_turn` over stream/worker.py's `Taker`s: one loop, the parts'
positions counted there as their own streams count them); else it pulls each slot's output from its
part's stream (`_pulled_in_turn`). Both give the same outputs and positions.

A worker's position is one `Position` per part (its skip, discard and delivered outputs; with
several phases, those of its phase, and the phase): a part is always consumed in its own order, so a
resumed worker restarts the phase's schedule at t = sum of delivered, and an elastic resume deals
each part's remainder afresh (M4) and schedules the new counts (M5).
A state names every part (data, split, selection, outputs), the mode, stop and weights (`shares`),
or the schedule (`schedule`: each phase's start and weights; a worker's position then names its
`phase`); one from another mix is refused naming the difference (the first phase that differs).
`load_state_dict(state, reweight=True)` accepts other weights or another schedule: the state's epoch
is read with the ones it was read with (kept in later states as `reweighted`), the next epochs with
the new ones, which is how a schedule changes from one epoch to the next. A mix file (TOML) is read
above the sources, by `wdsprep.mixfile`, which names a part's stage as a function of a built-in
source's `read` module (and a schedule's phases as `[[phase]]` tables).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import numbers
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterator, Sequence as Sequence_

import numpy as np
import webdataset as wds

from ..checks import number, one_of, refuse, shown, whole_number
from ..errors import ConfigError, ManifestError, ShardError
from ..kept import Kept
from ..shards.manifest import Manifest
from ..readoptions import ReadOptions
from .planning.catalog import Catalog, Selection
from .dataset import PlannedDataset, shard_weights
from .decode import END, ReaderStage
from .manifests import load_manifest
from ..shards.shardtable import ShardTable
from .planning.plan import Level, Passes, Sequence, epoch_order, keyed, remainder
from ..readoptions import MIN_RANGE
from .reading.readahead import reads_ahead, worker_connections
from .planning.state import EpochProgress, PhaseLevel, Position, Resume, parse_state, worker_level
from .worker import NOTHING_HELD, ShardReader, Taker, WorkerPlan, WorkerStream, stamp_kept, worker_plan

MODES = ("weighted", "epochized")
STOPS = ("first", "all")


@dataclass(frozen=True)
class Part:
    """One part of a mix: a location (a directory, `http(s)://`, `s3://`, or a loaded manifest) and
    split, its weight (weighted mode) or repeat (epochized mode), its own reader stages (applied to
    its samples only, before they are mixed) and, when they expand samples, `outputs_per_sample`;
    a selection (`keys`, `select`, `fraction`, `limit`) narrows it; `name` is what `__part__` says."""

    location: Any
    split: str = "train"
    weight: float | None = None
    repeat: float | None = None
    stages: tuple = ()
    outputs_per_sample: Any = None
    name: str | None = None
    keys: Any = None
    select: str | None = None
    fraction: float | None = None
    limit: int | None = None


@dataclass
class _Planned:
    """A part, loaded: its catalog and per-shard output counts, its stages, its size and share."""

    index: int
    name: str
    catalog: Catalog
    weights: list[np.ndarray] | None
    stages: list
    decode: ReaderStage | None
    size: int
    share: Fraction | None  # its weight (weighted) or repeat (epochized), exactly; None in a scheduled mix
    where: str = field(default="")
    given: str = field(default="")  # the weight or repeat as the user wrote it (what messages say)

    @property
    def bytes_per_sample(self) -> float:
        """The part's shard bytes per sample (what reading one of its samples costs, on average)."""
        sizes = self.catalog.sizes
        rows = self.catalog.rows
        total = int(rows.bytes.sum(dtype=np.uint64)) if isinstance(rows, ShardTable) else sum(row["bytes"] for row in rows)
        return total / max(1, int(sizes.sum()))


def _number(value: Any, what: str, where: str, zero: bool = False) -> Fraction:
    """A weight or repeat, exactly: a real number (int, float, a numpy scalar, a Fraction), finite
    as a float (so at most ~1.8e308) and > 0 (>= 0 with `zero`: a phase's weight); anything else is
    one ConfigError line."""
    number(value, f"{where}: {what}", 0, above=not zero, text=False)
    return Fraction(int(value)) if isinstance(value, numbers.Integral) else Fraction(
        value if isinstance(value, Fraction) else float(value))


def _spelled(share: str) -> str:
    """A weight as a state records it (an exact fraction, '5404319552844595/18014398509481984') the
    way a user writes it: '0.3' (the float it is exactly), '2', or the fraction when no float is it."""
    try:
        exact = Fraction(share)
        if exact.denominator == 1:
            return str(exact.numerator)
        return repr(float(exact)) if Fraction(float(exact)) == exact else share
    except (ValueError, ZeroDivisionError, OverflowError):
        return share


# -- schedules (rules M7, M8)
MAX_PHASES = 1024  # phases of a schedule: each is planned, dealt and interleaved on its own


@dataclass(frozen=True)
class Schedule:
    """An epoch's weights (rule M7): phase k from `starts[k]` (0 first; then whole numbers, sample
    positions, or Fractions of the epoch in (0, 1)) with `shares[k]`, one exact weight >= 0 per part.
    A mix without a schedule is one phase from 0 (epochized: its repeats). `given`: each phase's
    start and weights as the user wrote them (what messages say), left out of comparisons."""

    starts: tuple
    shares: tuple  # tuple[tuple[Fraction, ...], ...]
    given: tuple = field(default=(), compare=False)

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.starts, self.shares))

    def __hash__(self) -> int:
        """Hashed once: an epoch's counts are looked up by schedule at every phase start, and
        Fractions hash slowly."""
        return self._hash

    @property
    def phases(self) -> int:
        return len(self.starts)

    @property
    def phased(self) -> bool:
        """Several phases (one phase is plain weights, M7)."""
        return len(self.starts) > 1

    @property
    def fractions(self) -> bool:
        """Whether the starts are fractions of the epoch (else sample positions)."""
        return any(isinstance(start, Fraction) for start in self.starts)

    def layout(self) -> dict:
        """What a state records: `shares` (one phase), or `schedule`: [start, shares] per phase, a
        start a whole number (a sample position) or an exact fraction written 'n/d'."""
        if not self.phased:
            return {"shares": [str(share) for share in self.shares[0]]}
        return {"schedule": [[start if isinstance(start, int) else str(start), [str(share) for share in shares]]
                             for start, shares in zip(self.starts, self.shares)]}

    def bounds(self, total: int) -> list[int]:
        """b_0..b_K: where each phase starts in an epoch of `total` samples, then `total` (rule M7)."""
        return [start if isinstance(start, int) else start.numerator * total // start.denominator
                for start in self.starts] + [total]

    def words(self) -> str:
        """The phases as the user wrote them, [(start, [weights]), ...] (a schedule read from a state:
        as exact numbers, each written as the number it is)."""
        given = self.given or [(_spelled_start(start), [_spelled(str(share)) for share in shares])
                               for start, shares in zip(self.starts, self.shares)]
        return "[" + ", ".join(f"({start}, [{', '.join(weights)}])" for start, weights in given) + "]"


def schedule_of(value: Any, names: list[str]) -> Schedule:
    """A schedule as the user gives it, checked (rule M7): a list of (start, weights) pairs, weights a
    list of one number >= 0 per part or a dict of part name -> weight (a part left out weighs 0).
    Anything wrong is one ConfigError line naming the phase."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Sequence_) or not value:
        raise ConfigError(f"mix: schedule must be a non-empty list of (start, weights) phases, got {shown(value)}")
    if len(value) > MAX_PHASES:
        raise ConfigError(f"mix: schedule has {len(value)} phases, more than the {MAX_PHASES} a mix plans")
    starts, shares, given = [], [], []
    for k, phase in enumerate(value):
        where = f"mix: schedule phase {k}"
        if isinstance(phase, dict) and set(phase) <= {"start", "weights"} and "weights" in phase:
            phase = (phase.get("start", 0 if k == 0 else None), phase["weights"])  # a mix file's [[phase]] table
        if isinstance(phase, (str, bytes, dict)) or not isinstance(phase, Sequence_) or len(phase) != 2:
            raise ConfigError(f"{where}: a (start, weights) pair, got {shown(phase)}")
        start, weights = phase
        starts.append(_start(start, k, where, starts))
        shares.append(_phase_weights(weights, names, where))
        given.append((_shown_start(start), [str(w) for w in _weights_in_order(weights, names)]))
    for p, name in enumerate(names):
        if all(phase[p] == 0 for phase in shares):
            raise ConfigError(f"mix: part {p} ({name}): weight 0 in every phase of the schedule "
                              "(it would never be read)")
    return Schedule(tuple(starts), tuple(shares), tuple(given))


def _start(start: Any, k: int, where: str, before: list) -> int | Fraction:
    """Phase k's start: a sample position (a whole number) or a fraction of the epoch in (0, 1), read
    as the decimal it prints as (0.3 is 3/10); the first is 0, the rest increase, all of one kind."""
    rule = "a sample position (a whole number >= 0) or a fraction of the epoch (0 < start < 1)"
    if isinstance(start, bool) or not isinstance(start, numbers.Real):
        raise ConfigError(f"{where}: start must be {rule}, got {shown(start)}")
    if isinstance(start, numbers.Integral):
        exact: int | Fraction = int(start)
    else:
        try:
            exact = start if isinstance(start, Fraction) else Fraction(str(float(start)))
        except (OverflowError, ValueError):
            raise ConfigError(f"{where}: start must be {rule}, got {shown(start)}") from None
        if exact == 0 and k == 0:
            exact = 0
        elif not 0 < exact < 1:
            raise ConfigError(f"{where}: start must be {rule}, got {shown(start)}")
    if k == 0:
        if exact != 0:
            raise ConfigError(f"{where}: the first phase starts at 0 (the epoch's start), got {shown(start)}")
        return 0
    if isinstance(exact, int) and exact < 0:
        raise ConfigError(f"{where}: start must be {rule}, got {shown(start)}")
    kinds = {isinstance(s, Fraction) for s in [*before[1:], exact]}
    if len(kinds) > 1:
        raise ConfigError(f"{where}: starts are all sample positions (whole numbers) or all fractions of the epoch "
                          f"(0 < start < 1), got {shown(start)} after {_shown_start(before[-1])}")
    if exact <= before[-1]:
        raise ConfigError(f"{where}: starts must increase, got {shown(start)} after {_shown_start(before[-1])}")
    return exact


def _shown_start(start: Any) -> str:
    """A start as the user wrote it (a Fraction as the decimal it is, when it is one)."""
    if isinstance(start, Fraction):
        return _spelled_decimal(start)
    return shown(start) if not isinstance(start, (int, float, np.integer, np.floating)) else str(start)


def _spelled_decimal(value: Fraction) -> str:
    """An exact start (3/10) as the decimal a user writes (0.3), or 'n/d' when no float prints as it."""
    if value.denominator == 1:
        return str(value.numerator)
    text = repr(float(value))
    return text if Fraction(text) == value else f"{value.numerator}/{value.denominator}"


def _weights_in_order(weights: Any, names: list[str]) -> list:
    """A phase's weights, one per part in the parts' order (a dict: by name, a part left out 0)."""
    if isinstance(weights, dict):
        return [weights.get(name, 0) for name in names]
    return list(weights)


def _phase_weights(weights: Any, names: list[str], where: str) -> tuple[Fraction, ...]:
    if isinstance(weights, dict):
        unknown = [name for name in weights if name not in names]
        if unknown:
            raise ConfigError(f"{where}: no part named {unknown[0]!r} (parts: {', '.join(names)})")
    elif isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence_):
        raise ConfigError(f"{where}: weights must be a list of one number per part or a dict of part names, "
                          f"got {shown(weights)}")
    elif len(weights) != len(names):
        raise ConfigError(f"{where}: {len(weights)} weights for {len(names)} parts ({', '.join(names)})")
    exact = tuple(_number(weight, f"the weight of part {p} ({names[p]})", where, zero=True)
                  for p, weight in enumerate(_weights_in_order(weights, names)))
    if not any(exact):
        raise ConfigError(f"{where}: every weight is 0 (a phase reads at least one part)")
    return exact


# What an epoch may hold, and what planning it may try (rule M2). A worker resumed mid-epoch makes its
# schedule again up to its position (rule M5, about half a microsecond a slot), so an epoch is bounded;
# the search for stop's total tries each total of a window at most this many times.
MAX_EPOCH_SAMPLES = 1 << 32
MAX_TOTALS_TRIED = 100_000


def apportion(total: int, shares: list[Fraction]) -> list[int]:
    """Largest-remainder apportionment of `total` by `shares` (ties to the lower index)."""
    return _seats(total, *_scaled(shares))


def _scaled(shares: list[Fraction]) -> tuple[list[int], int]:
    """The shares as whole numbers over one denominator: (a_p, M) with a_p / M = share_p / sum(shares),
    so that sum(a_p) = M and a quota S * a_p / M is split into whole seats and a remainder exactly."""
    whole = sum(shares)
    normal = [Fraction(share) / whole for share in shares]
    denominator = math.lcm(*(fraction.denominator for fraction in normal))
    return [fraction.numerator * (denominator // fraction.denominator) for fraction in normal], denominator


def _seats(total: int, scaled: list[int], denominator: int) -> list[int]:
    """`apportion` of shares already `_scaled`: each part the whole seats of its quota, one more to
    the largest remainders (ties to the lower index)."""
    floors, remainders = zip(*(divmod(total * a, denominator) for a in scaled))
    counts = list(floors)
    for p in sorted(range(len(scaled)), key=lambda p: (-remainders[p], p))[: total - sum(counts)]:
        counts[p] += 1
    return counts


def epoch_counts(mode: str, sizes: list[int], shares: list[Fraction], stop: str,
                 samples_per_epoch: int | None) -> list[int]:
    """Rule M2: how many samples (outputs) of each part an epoch holds (at most MAX_EPOCH_SAMPLES
    together, else one ConfigError line)."""
    if mode == "epochized":
        counts = [int(size * share + Fraction(1, 2)) for size, share in zip(sizes, shares)]
        what = f"repeats {[_spelled(str(share)) for share in shares]}"
    elif samples_per_epoch is not None:
        counts, what = apportion(samples_per_epoch, shares), f"samples_per_epoch={samples_per_epoch}"
    else:
        counts, what = _fitted(sizes, shares, stop), f"stop={stop!r} and weights {[_spelled(str(s)) for s in shares]}"
    if sum(counts) > MAX_EPOCH_SAMPLES:
        raise _too_large(what, f"{sum(counts)}")
    return counts


def _too_large(what: str, held: str) -> ConfigError:
    return ConfigError(f"mix: with {what} an epoch holds {held} samples, more than the {MAX_EPOCH_SAMPLES} (2**32) "
                       "an epoch may hold: make the epochs smaller (samples_per_epoch, repeat) and read more of them")


def _fitted(sizes: list[int], shares: list[Fraction], stop: str) -> list[int]:
    """Rule M2 without samples_per_epoch: the largest total S whose counts fit every part's size
    (stop="first"), or the smallest whose counts cover every size (stop="all").

    A part's count is its quota S * a_p / M rounded down, plus one when its remainder is among the
    R = S - sum(floors) largest; so counts may shrink as S grows (the Alabama paradox) and S cannot be
    found by bisection. But with P parts a remainder below 1/P never gets the extra seat (the R seats
    go to remainders summing to R), and one above 1 - 1/P always does. So the answer lies in a window
    where some part's remainder is between those two: below it a part short of its size cannot get
    its missing seat (stop="all"), above it a part at its size gets one too many (stop="first"). The
    window is found in closed form and tried total by total, in the order the rule says; it holds
    about (1 - 2/P) / (the smallest share) totals: one or two for two parts, and past
    MAX_TOTALS_TRIED (weights 10^6:1:1) the mix is refused in one line naming a total that fits."""
    scaled, denominator = _scaled(shares)
    parts = len(sizes)
    bounds = [(parts * size, parts * a) for size, a in zip(sizes, scaled)]  # quotas in units of 1 / (P * M)
    if stop == "all":
        # below `low` some part short of its size has a remainder under 1/P; at `high` every part's
        # remainder is above 1 - 1/P or its floor is its size
        low = max(-(-(ps - parts + 1) * denominator // pa) for ps, pa in bounds)
        high = max((ps - 1) * denominator // pa + 1 for ps, pa in bounds)
        totals, holds = range(low, high + 1), (lambda counts: all(n >= size for n, size in zip(counts, sizes)))
        what, sure = "the smallest epoch that holds every part whole", high
    else:
        # above `high` some part at its size has a remainder over 1 - 1/P; at `low` every part's
        # remainder is under 1/P or its floor is below its size
        most = sum(sizes)
        high = min(most, *((ps + parts - 1) * denominator // pa for ps, pa in bounds))
        low = min(most, *(-(-(ps + 1) * denominator // pa) - 1 for ps, pa in bounds))
        totals, holds = range(high, low - 1, -1), (lambda counts: all(n <= size for n, size in zip(counts, sizes)))
        what, sure = "the largest epoch in which no part runs out", low
    weights = f"weights {[_spelled(str(share)) for share in shares]}"
    if min(totals) > MAX_EPOCH_SAMPLES:
        raise _too_large(f"stop={stop!r} and {weights}", f"at least {min(totals)}")
    if len(totals) > MAX_TOTALS_TRIED:
        hint = (f"samples_per_epoch={sure} {'covers every part' if stop == 'all' else 'runs no part out'}"
                if sure <= MAX_EPOCH_SAMPLES else "one that covers every part holds more than 2**32")
        raise ConfigError(f"mix: stop={stop!r} with {weights}: {what} is one of {len(totals)} totals, more than the "
                          f"{MAX_TOTALS_TRIED} a plan tries; give samples_per_epoch ({hint})")
    for total in totals:
        counts = _seats(total, scaled, denominator)
        if holds(counts):
            return counts
    raise AssertionError(f"rule M2: no total in [{totals.start}, {totals.stop}) fits")  # the window's end always does


def phase_counts(mode: str, sizes: list[int], schedule: Schedule, stop: str,
                 samples_per_epoch: int | None) -> list[list[int]]:
    """Rules M2 and M7: how many samples (outputs) of each part each phase of the epoch holds."""
    if not schedule.phased:
        return [epoch_counts(mode, sizes, list(schedule.shares[0]), stop, samples_per_epoch)]
    scaled = [_scaled(list(shares)) for shares in schedule.shares]
    if samples_per_epoch is not None:
        total = samples_per_epoch
        last = max(start for start in schedule.starts if isinstance(start, int))
        if last >= total:
            k = schedule.starts.index(last)
            raise ConfigError(f"mix: schedule phase {k} starts at sample {last}, past the epoch's end "
                              f"(samples_per_epoch={total})")
    else:
        total = _scheduled_total(sizes, schedule, scaled, stop)
        if total > MAX_EPOCH_SAMPLES:
            raise _too_large(f"stop={stop!r} and the schedule {schedule.words()}", f"{total}")
    return _phase_seats(total, schedule, scaled)


def _phase_seats(total: int, schedule: Schedule, scaled: list[tuple[list[int], int]]) -> list[list[int]]:
    """Each phase's counts in an epoch of `total` samples: its length apportioned by its weights."""
    bounds = schedule.bounds(total)
    return [_seats(end - begin, *shares) for begin, end, shares in zip(bounds, bounds[1:], scaled)]


def _scheduled_total(sizes: list[int], schedule: Schedule, scaled: list[tuple[list[int], int]], stop: str) -> int:
    """Rule M7's S without samples_per_epoch: the largest total whose counts fit every part
    (stop="first"), or the smallest that covers every part (stop="all"), past the last start when the
    starts are sample positions. n_p(S) = sum_k n_k,p(S) is within E = 2K of the line A_p + B_p * S
    (B_p: part p's share of the epoch's tail that grows with S; A_p what fixed phases hold beyond
    it), so the totals where the answer can lie form a window, tried one by one in the rule's order."""
    phases, parts = schedule.phases, len(sizes)
    normal = [[Fraction(a, m) for a in shares] for shares, m in scaled]  # each phase's shares, summing to 1
    if schedule.fractions:
        ends = [*schedule.starts[1:], Fraction(1)]
        slope = [sum((end - start) * normal[k][p] for k, (start, end) in enumerate(zip(schedule.starts, ends)))
                 for p in range(parts)]
        offset, least = [Fraction(0)] * parts, 1
    else:
        starts = list(schedule.starts)
        lengths = [end - start for start, end in zip(starts, starts[1:])]
        slope = [normal[-1][p] for p in range(parts)]
        offset = [sum(length * normal[k][p] for k, length in enumerate(lengths)) - starts[-1] * normal[-1][p]
                  for p in range(parts)]
        least = starts[-1] + 1  # the last phase starts inside the epoch
    error = 2 * phases
    weights = f"the schedule {schedule.words()}"
    fixed = [p for p in range(parts) if slope[p] == 0]  # parts the last phase leaves out: a count that does not grow

    def counts(total: int) -> list[int]:
        return [sum(column) for column in zip(*_phase_seats(total, schedule, scaled))]

    if stop == "all":
        for p in fixed:
            if counts(least)[p] < sizes[p]:
                raise ConfigError(f"mix: stop='all' with {weights}: part {p} has weight 0 in the last phase and the "
                                  f"phases before it hold {counts(least)[p]} of its {sizes[p]} samples, so no epoch "
                                  "holds it whole; give samples_per_epoch or stop='first'")
        growing = [p for p in range(parts) if slope[p]]
        low = max(least, *(math.ceil((sizes[p] - error - offset[p]) / slope[p]) for p in growing))
        high = max(least, *(math.ceil((sizes[p] + error - offset[p]) / slope[p]) for p in growing))
        totals, holds = range(low, high + 1), (lambda n: all(c >= size for c, size in zip(n, sizes)))
        what, sure = "the smallest epoch that holds every part whole", high
    else:
        growing = [p for p in range(parts) if slope[p]]
        most = sum(sizes)
        high = min(most, *(math.floor((sizes[p] + error - offset[p]) / slope[p]) for p in growing))
        low = max(least, min(most, *(math.floor((sizes[p] - error - offset[p]) / slope[p]) for p in growing)))
        totals, holds = range(high, low - 1, -1), (lambda n: all(c <= size for c, size in zip(n, sizes)))
        what, sure = "the largest epoch in which no part runs out", low
    if len(totals) and min(totals) > MAX_EPOCH_SAMPLES:
        raise _too_large(f"stop={stop!r} and {weights}", f"at least {min(totals)}")
    if len(totals) * phases > MAX_TOTALS_TRIED:
        hint = (f"samples_per_epoch={sure} {'covers every part' if stop == 'all' else 'runs no part out'}"
                if sure <= MAX_EPOCH_SAMPLES else "one that covers every part holds more than 2**32")
        raise ConfigError(f"mix: stop={stop!r} with {weights}: {what} is one of {len(totals)} totals of "
                          f"{phases} phases, more than the {MAX_TOTALS_TRIED} phase totals a plan tries; give "
                          f"samples_per_epoch ({hint})")
    for total in totals:
        if holds(counts(total)):
            return total
    # stop="first" only (the window's end covers every part): even the epoch that ends with the last
    # phase's first sample takes more of some part than it holds
    raise ConfigError(f"mix: stop='first' with {weights}: a part runs out before the last phase starts "
                      f"(sample {least - 1}); give samples_per_epoch or a schedule whose phases fit the parts")


def pass_order(shards: int, seed: int, epoch: int, shuffle: bool, part: int, cycle: int) -> np.ndarray:
    """Rule M3: the shard order of pass `cycle` of part `part`."""
    if not shuffle:
        return np.arange(shards, dtype=np.int64)
    if part == 0 and cycle == 0:
        return np.asarray(epoch_order(shards, seed, epoch, True), dtype=np.int64)
    rng = keyed([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED, part, cycle])
    return rng.permutation(shards).astype(np.int64)


@dataclass(frozen=True, eq=False)
class _PassOrder:
    """Rule M3's shard order of each pass over one part, its shards without samples left out: what
    the part's `Passes` asks for pass j (a picklable function, so a spawned worker makes the same)."""

    counts: np.ndarray
    seed: int
    epoch: int
    shuffle: bool
    part: int

    def __call__(self, cycle: int) -> np.ndarray:
        order = pass_order(len(self.counts), self.seed, self.epoch, self.shuffle, self.part, cycle)
        return order[self.counts[order] > 0]


def part_sequence(part: _Planned, count: int, seed: int, epoch: int, shuffle: bool) -> Sequence | Passes:
    """Rule M3: passes over the part, cut after `count` samples (outputs). A `Passes` (stream/planning/plan.py):
    a pass is made only when one of its positions is asked for, so the epoch's size costs nothing."""
    counts = part.catalog.counts
    if count <= 0:
        return Sequence()
    order = _PassOrder(counts, seed, epoch, shuffle, part.index)
    if part.weights is None:
        return Passes(counts, order, 0, count)
    passes = Passes(counts, order, 0, 0)
    return Passes(counts, order, 0, _output_end(part, passes, count))


def _output_end(part: _Planned, passes: Passes, outputs: int) -> int:
    """The position just past the sample that brings a part's outputs to `outputs` (0 for none):
    every pass makes the part's size in outputs, so whole passes, then the pass holding the
    outputs-th output (made now, that one pass), cut after the sample that completes it."""
    if outputs <= 0:
        return 0
    last = (outputs - 1) // part.size
    ends = np.cumsum(passes.pass_pieces(last, 0, passes.per_pass).weights(part.weights))
    cut = int(np.searchsorted(ends, outputs - last * part.size, side="left")) + 1
    return last * passes.per_pass + cut


def phase_segments(part: _Planned, sequence: Sequence | Passes, counts: list[int]) -> list:
    """Rule M8: the part's epoch sequence cut into consecutive segments, phase k's holding its next
    counts[k] samples (outputs: up to the sample that brings them to counts[0] + ... + counts[k])."""
    through = np.cumsum([0, *counts]).tolist()
    if part.weights is None or not len(sequence):
        cuts = through
    else:
        cuts = [_output_end(part, sequence, outputs) for outputs in through]
    return [sequence.slice(begin, end) for begin, end in zip(cuts, cuts[1:])]


# a worker's schedule of up to KEPT_SLOTS slots is made once and kept (the same counts recur every
# epoch, and a schedule's phases every pass), those of up to KEPT_TOTAL slots together (the least
# recently used go first); a longer one is made SLOTS_AT_ONCE at a time as its stream is read
KEPT_SLOTS = 1 << 20
KEPT_TOTAL = 1 << 24
SLOTS_AT_ONCE = 1 << 14


def interleave(counts: list[int], start: int = 0, block: int = 0, key: tuple = ()) -> Iterator[list[int]]:
    """Rule M5: the part of each slot of a worker's stream, from slot `start` on, in runs (lists, so
    that the mix takes each slot's part by a plain loop), with `block` > 1 one run per block of that
    many slots, permuted by (key, block); then, past the counts, each remaining output of the lowest
    part that still has one: see `MixStream`. The slots before `start` are made again (the schedule
    has no closed form), never those after it before they are read."""
    counts = tuple(counts)
    total, block = sum(counts), max(block, 1)
    made = [(0, _labels(counts))] if total <= KEPT_SLOTS else _made_slots(counts, total, block)
    for first, labels in made:  # slots first.. of the schedule, in whole blocks
        if first + len(labels) <= start:
            continue
        if block == 1:
            yield labels[max(0, start - first):].tolist()
            continue
        for at in range(max(0, start - start % block - first), len(labels), block):
            run = labels[at : at + block]
            order = keyed([*key, (first + at) // block, 0x313C]).permutation(len(run))
            yield run[order][max(0, start - first - at):].tolist()


class _KeptSchedules:
    """Every slot's part (rule M5) per worker's counts, made once and kept (`Kept`) while the kept
    ones hold at most KEPT_TOTAL slots together (a byte a slot up to 256 parts), the least recently
    used dropped first. A schedule's phases bring as many counts every pass: were only a few kept,
    the rest would be made again every pass, at about half a microsecond a slot."""

    def __init__(self):
        self.kept = Kept(KEPT_TOTAL, weight=len)

    def __call__(self, counts: tuple[int, ...]) -> np.ndarray:
        labels = self.kept.get(counts)
        if labels is None:
            total = sum(counts)
            labels = self.kept.put(counts, np.asarray(_slots(counts, total, 0, total, [0] * len(counts)),
                                                      dtype=np.uint8 if len(counts) <= 256 else np.int32))
        return labels


_labels = _KeptSchedules()


def _made_slots(counts: tuple[int, ...], total: int, block: int) -> Iterator[tuple[int, np.ndarray]]:
    """Every slot's part (rule M5), made about SLOTS_AT_ONCE at a time, in whole blocks of `block`
    slots, as they are asked for: (the first slot, their parts)."""
    taken = [0] * len(counts)
    step = block * max(1, SLOTS_AT_ONCE // block)
    for first in range(0, total, step):
        yield first, np.asarray(_slots(counts, total, first, min(total, first + step), taken), dtype=np.int32)


def _slots(counts: tuple[int, ...], total: int, first: int, stop: int, taken: list[int]) -> list[int]:
    """The parts of slots first+1..stop (rule M5), `taken` updated. Part p is eligible at slot t
    when taken_p * T < t * c_p (which also means taken_p < c_p); among those, the earliest
    deadline (taken_p + 1) / c_p wins, compared by cross-multiplying (exact), ties to the lower p."""
    parts = [(p, c) for p, c in enumerate(counts) if c]
    labels: list[int] = []
    append = labels.append
    due = period = 0  # the best part's (taken + 1, c) in the slot being decided
    for t in range(first + 1, stop + 1):
        best = -1
        for p, c in parts:
            k = taken[p]
            if k * total < t * c and (best < 0 or (k + 1) * period < due * c):
                best, due, period = p, k + 1, c
        taken[best] += 1
        append(best)
    return labels


@dataclass
class MixPosition:
    """A worker's position in a mix: one `Position` per part (of its current phase, `phase`, in a mix
    of several phases; None in a mix of one, whose states then say no phase)."""

    parts: list[Position]
    phase: int | None = None

    def as_dict(self) -> dict:
        saved = {"parts": [position.as_dict() for position in self.parts]}
        if self.phase is not None:
            saved["phase"] = self.phase
        return saved

    @property
    def delivered(self) -> int:
        return sum(position.delivered for position in self.parts)


def mix_level(position: dict) -> tuple[tuple[int, int], ...] | PhaseLevel:
    """What an elastic resume keeps of a worker's mix position: (skip, discard) per part, with its
    phase in a mix of several (a `PhaseLevel`)."""
    parts = tuple(worker_level(part) for part in position["parts"])
    phase = position.get("phase")
    return parts if phase is None else PhaseLevel(int(phase), parts)


@dataclass
class _Phase:
    """One phase of one worker's pass: its parts' streams, their output counts, what keys its blocks."""

    streams: list[WorkerStream]
    counts: list[int]
    key: tuple


class MixStream:
    """One worker's pass over a mix: its phases one after the other (rule M8), each its parts' streams
    (`WorkerStream`s) interleaved by rule M5. `make_phase(k, resume)` makes phase k, its parts from
    `resume`'s positions (None: from their start); a phase is made when the one before is done.
    `position` is the live position (the phase, its parts' positions). `after`: the stages past the
    counting point, run on the phases' outputs as one stream."""

    def __init__(self, make_phase: Callable[[int, MixPosition | None], _Phase], phases: int, resume: MixPosition,
                 names: list[str], *, block: int, after: list, invoke: Callable):
        self.make_phase, self.phases, self.names = make_phase, phases, names
        self.block, self.after, self.invoke = block, after, invoke
        first = resume.phase or 0
        self.current = make_phase(first, resume)
        self.position = MixPosition([stream.position for stream in self.current.streams],
                                    first if phases > 1 else None)

    def _mixed(self) -> Iterator:
        """The phases' outputs one after the other: each phase's parts' streams interleaved by rule
        M5 from the phase's position (in one generator a phase: an output passes through no other)."""
        return itertools.chain.from_iterable(self._phases())

    def _phases(self) -> Iterator[Iterator]:
        """Each phase's outputs (a generator), made when the phase before is done."""
        phase, current, names = self.position.phase or 0, self.current, self.names
        while True:
            stamp = phase if self.phases > 1 else None  # a mix of one phase says none
            runs = interleave(current.counts, self.position.delivered, self.block, current.key)
            if all(stream.takeable for stream in current.streams):  # (no reader made for a part read otherwise)
                yield _taken_in_turn([stream.taker() for stream in current.streams], names, runs, stamp)
            else:
                yield _pulled_in_turn([iter(stream) for stream in current.streams], names, runs, stamp)
            phase += 1
            if phase >= self.phases:
                return
            current = self.current = self.make_phase(phase, None)
            self.position.parts = [stream.position for stream in current.streams]
            self.position.phase = phase

    def __iter__(self) -> Iterator:
        source = self._mixed()
        for step in self.after:
            source = self.invoke(step, source)
        return source


def _pulled_in_turn(sources: list[Iterator], names: list[str], runs: Iterator[list[int]], stamp: int | None) -> Iterator:
    """One phase's outputs (rule M5): each slot's output pulled from its part's stream, named; then,
    past the declared counts, each part's remaining outputs, part by part."""
    parts = [(source.__next__, name) for source, name in zip(sources, names)]  # a slot's part: its pull, its name
    for run in runs:
        for pull, name in map(parts.__getitem__, run):
            try:
                output = pull()
            except StopIteration:
                continue  # a part whose stage made fewer outputs than it declared: its slots go
            if output.__class__ is dict or isinstance(output, dict):
                output["__part__"] = name
                if stamp is not None:
                    output["__phase__"] = stamp
            yield output
    for source, name in zip(sources, names):  # outputs past the declared counts, part by part
        for output in source:  # (nothing from a part that ran out)
            if isinstance(output, dict):
                output["__part__"] = name
                if stamp is not None:
                    output["__phase__"] = stamp
            yield output


def _taken_in_turn(takers: list[Taker], names: list[str], runs: Iterator[list[int]], stamp: int | None) -> Iterator:
    """`_pulled_in_turn` over parts whose samples are taken here (`Taker`s): each slot's sample taken
    from its part's shard as `ShardReader.samples` takes it, and counted as `WorkerStream._count_held`
    counts it, in this one loop: no generator of the part's is resumed but the one that gives its
    shards' sample numbers (`ShardReader.items`). The same outputs and positions as `_pulled_in_turn`
    over the parts' streams (tests/core/test_fused_decode.py).

    Counting: a part's output is held until its next is made, and its position then says the sample
    after it, `skip` = the items pulled less the one held: each output delivered and each item that
    gave none (skipped, or ending the part's stream) adds one."""
    parts = [(taker, taker.items, taker.held, taker.position, name, *taker.fused) for taker, name in zip(takers, names)]
    pending = [NOTHING_HELD] * len(parts)  # each part's next output, made before the one before it is handed over

    def past_the_counts() -> Iterator[tuple[int]]:  # then each part's remaining outputs, part by part
        for p in range(len(parts)):
            while pending[p] is not END:
                yield (p,)

    for run in itertools.chain(runs, past_the_counts()):
        for p in run:
            taker, items, held, position, name, strip, torch, kept, with_url = parts[p]
            output = pending[p]
            if output.__class__ is not dict:  # (its outputs are decoded samples: dicts)
                if output is END:
                    continue  # a part that ran out: its slots go
                output = pending[p] = taker.next_output()  # its first; the one after it is made before it goes
                taker.counter.start()  # (the consumer's first output is made; local shards read nothing ahead)
                if output is END:
                    continue
            for item in items:  # the part's next output
                if item.__class__ is not dict:  # a sample of a local shard, checked: taken where it lies
                    shard = held[item >> 32][0]
                    index = item & 0xFFFFFFFF
                    try:
                        following = shard.decode_members(index, shard.members(index), strip, torch, with_url)
                    except ShardError:
                        following = taker.taken(item)
                    else:
                        if kept:
                            following = stamp_kept(following, kept, index, held[item >> 32][1], taker.epoch)
                        break
                else:
                    following = taker.taken(item)
                if following.__class__ is dict:
                    break
                position.skip += 1  # an item that gave no output: passed
                if following is END:
                    break
            else:
                following = END
            pending[p] = following
            position.skip += 1
            position.delivered += 1
            output["__part__"] = name
            if stamp is not None:
                output["__phase__"] = stamp
            yield output


class MixDataset(PlannedDataset):
    """The pipeline `wdsprep.mix(...)` returns (see the module docstring): the same interface as
    `wdsprep.dataset(...)` (compose, batched, `wdsprep.Loader`, set_epoch, state_dict,
    load_state_dict with one state or the list of every rank's)."""

    def __init__(self, parts: Sequence_[Part | dict], *, mode: str = "weighted", samples_per_epoch: int | None = None,
                 stop: str = "first", seed: int = 0, epoch: int | None = None, shuffle_shards: bool = True,
                 shuffle_buffer: int = 0, equalize: str | None = "pad", rank: int | None = None,
                 world_size: int | None = None, handler: Callable = wds.reraise_exception,
                 read_options: ReadOptions | None = None, schedule: Sequence_ | None = None, **read: Any):
        super().__init__()
        self._init_reading(seed=seed, epoch=epoch, shuffle_shards=shuffle_shards, shuffle_buffer=shuffle_buffer,
                           equalize=equalize, rank=rank, world_size=world_size, handler=handler,
                           read_options=read_options, read=read)
        one_of(mode, "mix: mode", MODES)
        one_of(stop, "mix: stop", STOPS)
        if samples_per_epoch is not None:
            whole_number(samples_per_epoch, "mix: samples_per_epoch", 1, "what an epoch may hold, 2**32",
                         maximum=MAX_EPOCH_SAMPLES, text=False)
        if samples_per_epoch is not None and mode == "epochized":
            raise ConfigError("mix: samples_per_epoch is for mode='weighted' (an epochized mix is sized by each part's repeat)")
        if schedule is not None and mode != "weighted":
            raise ConfigError("mix: schedule is for mode='weighted' (an epochized mix is sized by each part's repeat)")
        self.mode, self.stop = mode, stop
        self.samples_per_epoch = None if samples_per_epoch is None else int(samples_per_epoch)
        if not parts:
            raise ConfigError("mix: no parts")
        self.scheduled = schedule is not None
        self.parts = [self._load(index, part) for index, part in enumerate(parts)]
        self._check_parts()
        if self.scheduled:
            self.schedule = schedule_of(schedule, [part.name for part in self.parts])
        else:  # one phase: the parts' weights (repeats)
            self.schedule = Schedule((0,), (tuple(part.share for part in self.parts),),
                                     ((0, [part.given for part in self.parts]),))
        self._saved_schedule: tuple[int, Schedule] | None = None  # (epoch, schedule) of a reweighted state
        self._counts: dict[Schedule, list[list[int]]] = {}
        self._check_counts()
        self._check_world()

    # -- parts
    def _load(self, index: int, part: Part | dict) -> _Planned:
        if not isinstance(part, (Part, dict)):
            raise ConfigError(f"mix: part {index}: a wdsprep.Part or a dict of its fields, got {part!r}")
        if isinstance(part, dict):
            unknown = set(part) - set(Part.__dataclass_fields__)
            if unknown:
                raise ConfigError(f"mix: part {index}: unknown field(s) {', '.join(sorted(unknown))}")
            if "location" not in part:
                raise ConfigError(f"mix: part {index}: no location")
            part = Part(**part)
        if part.name is not None and (not isinstance(part.name, str) or not part.name):
            raise refuse(part.name, f"mix: part {index}: name", "must be a non-empty string", "what __part__ says")
        where = f"mix: part {index}" + (f" ({part.name})" if part.name else "")
        if self.scheduled:
            if part.weight is not None or part.repeat is not None:
                raise ConfigError(f"{where}: its weight is given by the schedule (a part of a scheduled mix has none "
                                  "of its own)")
            given, share = "", None
        elif self.mode == "weighted":
            if part.repeat is not None:
                raise ConfigError(f"{where}: repeat is for mode='epochized' (a weighted part has a weight)")
            given = 1 if part.weight is None else part.weight
            share = _number(given, "weight", where)
        else:
            if part.weight is not None:
                raise ConfigError(f"{where}: weight is for mode='weighted' (an epochized part has a repeat)")
            given = 1 if part.repeat is None else part.repeat
            share = _number(given, "repeat", where)
        try:
            manifest = part.location if isinstance(part.location, Manifest) else load_manifest(str(part.location), self.read_options)
        except ManifestError as error:
            raise ManifestError(f"{where}: {error}") from None
        if part.split not in manifest.splits:
            raise ConfigError(f"{where}: no split {part.split!r} in {manifest.url or 'its manifest'} "
                              f"(splits: {', '.join(sorted(manifest.splits))})")
        try:
            selection = Selection.of(keys=part.keys, select=part.select, fraction=part.fraction, limit=part.limit,
                                     seed=self.seed + index)
            catalog = Catalog(manifest, part.split, selection)
            weights = shard_weights(catalog, part.outputs_per_sample)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
        stages = list(part.stages) if isinstance(part.stages, (list, tuple)) else [part.stages]
        if not all(callable(stage) for stage in stages):
            raise ConfigError(f"{where}: stages must be reader stages (functions of an iterator of samples), "
                              f"got {part.stages!r}")
        decode = stages.pop(0) if stages and isinstance(stages[0], ReaderStage) else None
        size = catalog.total if weights is None else int(sum(int(w.sum()) for w in weights))
        if size == 0:
            raise ConfigError(f"{where}: split {part.split!r} of {manifest.url or 'its manifest'} has no samples")
        name = part.name if part.name is not None else str(index)
        return _Planned(index, name, catalog, weights, stages, decode, size, share, where, str(given))

    def _check_parts(self) -> None:
        """Two parts reading the same samples (the same shards and split, and selections that keep the
        same samples, however written) are one part read twice: refused, naming both. Parts whose
        selections overlap but differ (a subset read again, to weigh it more) are a mix."""
        seen: dict[tuple, _Planned] = {}
        for part in self.parts:
            identity = (part.catalog.digest, part.catalog.split, part.catalog.selection_text)
            if identity in seen:
                raise ConfigError(f"{part.where}: the same part as part {seen[identity].index} (same shards, split and "
                                  "selection): give it one part with the sum of the weights")
            twin = next((other for other in seen.values() if other.catalog.same_samples(part.catalog)), None)
            if twin is not None:
                raise ConfigError(f"{part.where}: the same samples as {twin.where.removeprefix('mix: ')} (same shards and "
                                  f"split; selections {_selection_words(twin)} and {_selection_words(part)} keep the same "
                                  f"{part.catalog.total}): give it one part with the sum of the weights")
            seen[identity] = part
        names = [part.name for part in self.parts]
        if len(set(names)) != len(names):
            raise ConfigError(f"mix: part names must differ (got {names})")

    def _check_counts(self) -> None:
        """Rules M2 and M7 planned now (bounded: an epoch too large, or a stop= total past the search,
        is one ConfigError line); an epochized part whose repeat rounds to no sample is said (warned),
        as the rule gives it none."""
        counts = self.epoch_counts()
        for part, count in zip(self.parts, counts):
            if self.mode == "epochized" and count == 0:
                warnings.warn(f"{part.where}: repeat={part.given} of its {part.size} samples rounds to 0 (size x "
                              f"repeat, half up): the part is in no epoch; a repeat of at least "
                              f"{1 / (2 * part.size):.3g} gives it one sample", UserWarning, stacklevel=4)

    def _check_world(self, progress: EpochProgress | None = None) -> None:
        """equalize="drop" drops the extra sample of the ranks that have one: a part with fewer samples
        in the epoch (in a phase that weighs it) than ranks would be left out on every rank, so it is
        refused (before any read)."""
        _, world = self.rank_and_world()
        progress = self.progress if progress is None else progress
        if self.equalize != "drop" or world == 1 or progress.levels:
            return
        schedule = self._schedule_of_epoch(progress.epoch)
        for k, (shares, sequences) in enumerate(zip(schedule.shares, self.sequences(progress))):
            for part, share, sequence in zip(self.parts, shares, sequences):
                samples = len(sequence)
                if share and samples < world:
                    where = f" in phase {k} of" if schedule.phased else " in"
                    raise ConfigError(f"{part.where}: {samples} sample(s){where} the epoch for {world} ranks: "
                                      "equalize='drop' would leave it out on every rank (equalize='pad' repeats one "
                                      "on the ranks short of one)")

    # -- what an epoch holds
    def _schedule_of_epoch(self, epoch: int) -> Schedule:
        """The schedule an epoch is read with: this mix's, or a state's loaded with `reweight=True` for
        the state's own epoch."""
        if self._saved_schedule is not None and self._saved_schedule[0] == epoch:
            return self._saved_schedule[1]
        return self.schedule

    def phase_counts(self, epoch: int | None = None) -> list[list[int]]:
        """Rules M2 and M7: each phase's samples (outputs) of each part in the epoch (one phase without
        a schedule)."""
        schedule = self._schedule_of_epoch(self.progress.epoch if epoch is None else epoch)
        if schedule not in self._counts:
            self._counts[schedule] = phase_counts(self.mode, [part.size for part in self.parts], schedule, self.stop,
                                                  self.samples_per_epoch)
        return self._counts[schedule]

    def epoch_counts(self, epoch: int | None = None) -> list[int]:
        """Rule M2: each part's samples (outputs) in the epoch, every phase together."""
        return [sum(column) for column in zip(*self.phase_counts(epoch))]

    def sequences(self, progress: EpochProgress | None = None) -> list[list[Sequence]]:
        """Each phase's samples of each part in the pass: the part's epoch sequence (M3) cut into its
        phases (M8), less what interrupted passes delivered. Planned once per (epoch, interrupted
        passes, phase counts) and kept (`planned`)."""
        progress = self.progress if progress is None else progress
        counts = tuple(map(tuple, self.phase_counts(progress.epoch)))
        return self.planned((progress.epoch, progress.levels, counts), lambda: self._planned_sequences(progress, counts))

    def plan_pass(self, progress: EpochProgress | None = None) -> None:
        self._check_world(progress)
        self.sequences(progress)

    def _planned_sequences(self, progress: EpochProgress, counts: tuple[tuple[int, ...], ...]) -> list[list[Sequence]]:
        out: list[list] = [[] for _ in counts]
        buffers = self.part_buffers(progress.epoch)
        for part in self.parts:
            column = [phase[part.index] for phase in counts]
            whole = part_sequence(part, sum(column), self.seed, progress.epoch, self.shuffle_shards)
            for k, segment in enumerate(phase_segments(part, whole, column)):
                for level in progress.levels:
                    segment = remainder(segment, _part_level(level, part.index, k), seed=self.seed,
                                        epoch=progress.epoch, shuffle_buffer=buffers[k][part.index],
                                        equalize=self.equalize, shard_weights=part.weights,
                                        key=self._part_key(part.index, k))
                out[k].append(segment)
        return out

    def _read_ahead_shares(self, num_workers: int, counts: list[int]) -> list[tuple[ReadOptions, int]]:
        """Each part's read options and requests at once: the worker's one read-ahead budget and
        connections divided among its remote parts by their share of the bytes it reads (the phase's
        samples of the part, `counts`, times the part's bytes per sample), each at least the smallest
        working read-ahead (two requests of MIN_RANGE, one connection). Local parts use none."""
        options = self.read_options
        connections = worker_connections(options.max_connections, num_workers)
        remote = [any(reads_ahead(url, row) for url, row in zip(part.catalog.urls[:1], part.catalog.rows[:1]))
                  for part in self.parts]
        weights = [n * part.bytes_per_sample if is_remote else 0
                   for part, n, is_remote in zip(self.parts, counts, remote)]
        total = sum(weights)
        if not total or not options.prefetch_bytes:
            return [(options, connections)] * len(self.parts)
        # connections apportioned by largest remainder (they add up to the worker's), at least one each
        split = apportion(connections, [Fraction(weight) for weight in weights])
        out = []
        for weight, share in zip(weights, split):
            if not weight:
                out.append((options, connections))  # a local part (or one the phase does not read): no read-ahead
                continue
            budget = max(2 * MIN_RANGE, options.prefetch_bytes * weight // total)
            out.append((options.replace(prefetch_bytes=int(budget)), max(1, share)))
        return out

    def part_buffers(self, epoch: int | None = None) -> list[list[int]]:
        """Rules M5 and M8: each phase's share of the shuffle buffer for each part, by the part's share
        of the phase."""
        phases = self.phase_counts(epoch)
        if self.shuffle_buffer <= 1:
            return [[self.shuffle_buffer] * len(self.parts) for _ in phases]
        out = []
        for counts in phases:
            total = max(1, sum(counts))
            out.append([max(1, (2 * self.shuffle_buffer * n + total) // (2 * total)) for n in counts])
        return out

    def plans(self, worker: int = 0, num_workers: int = 1, progress: EpochProgress | None = None, phase: int = 0,
              rank: int | None = None) -> list[WorkerPlan]:
        """What `worker` of `rank` (default this one) reads of each part in a phase of the pass (the
        pass checked by `_check_world` first)."""
        here, world = self.rank_and_world()
        rank = here if rank is None else rank
        return [worker_plan(sequence, rank, world, worker, num_workers, self.equalize, part.weights)
                for part, sequence in zip(self.parts, self.sequences(progress)[phase])]

    def _part_key(self, index: int, phase: int = 0) -> tuple:
        """What keys part `index`'s shuffle blocks in a phase besides (seed, epoch, rank, worker) (rules M5, M8)."""
        return (*(() if index == 0 else (index,)), *_phase_key(phase))

    def samples_per_rank(self, epoch: int | None = None, num_workers: int = 1) -> int:
        return sum(sum(phase) for phase in self.rank_counts(epoch, num_workers))

    def part_counts(self, epoch: int | None = None, num_workers: int = 1) -> dict[str, int]:
        """Outputs of each part this rank yields in the epoch."""
        columns = zip(*self.rank_counts(epoch, num_workers))
        return {part.name: sum(column) for part, column in zip(self.parts, columns)}

    def rank_counts(self, epoch: int | None = None, num_workers: int = 1, rank: int | None = None) -> list[list[int]]:
        """Outputs of each part that `rank` (default this one) yields in each phase of the epoch."""
        progress = self.progress if epoch is None else self.progress.at_epoch(epoch)
        self._check_world(progress)
        phases = len(self.sequences(progress))
        counts = []
        for k in range(phases):
            workers = [[plan.outputs(part.weights) for part, plan in
                        zip(self.parts, self.plans(worker, num_workers, progress, k, rank))] for worker in range(num_workers)]
            counts.append([sum(column) for column in zip(*workers)])
        return counts

    # -- states
    @property
    def digest(self) -> str:
        """Of every part's shards, split, selection and outputs: what a state must have been read from."""
        return hashlib.sha256(json.dumps(self._part_layouts()).encode()).hexdigest()[:16]

    def _part_layouts(self) -> list[dict]:
        return [{"name": part.name, "dataset": part.catalog.digest, "split": part.catalog.split,
                 "selection": part.catalog.selection_text, "outputs": None if part.weights is None else part.size}
                for part in self.parts]

    def layout(self) -> dict:
        rank, world = self.rank_and_world()
        return {"dataset": self.digest, "split": [part.catalog.split for part in self.parts], "seed": self.seed,
                "shuffle_shards": self.shuffle_shards, "shuffle_buffer": self.shuffle_buffer,
                "equalize": self.equalize, "rank": rank, "world_size": world, "selection": None,
                "mix": {"mode": self.mode, "stop": self.stop, "samples_per_epoch": self.samples_per_epoch,
                        **self.schedule.layout(), "parts": self._part_layouts(), **self._reweighted()}}

    def _reweighted(self) -> dict:
        """The weights (schedule) a reweighted state's epoch is read with, when they are not this mix's
        (so a state saved inside that epoch finishes it with them too)."""
        if self._saved_schedule is None or self._saved_schedule[1] == self.schedule:
            return {}
        epoch, schedule = self._saved_schedule
        return {"reweighted": {"epoch": epoch, **schedule.layout()}}

    def parse_state(self, state: dict | list, num_workers: int, what: str = "mix", reweight: bool = False) -> Resume:
        """A state checked against this mix (each difference named: a part's data, split, selection,
        the mode, the weights or schedule), then as `wdsprep.dataset`'s. With `reweight`, the weights
        (the schedule) may differ: the saved epoch is then read with those it was read with (recorded
        here, and in the states saved from now on: `reweighted`), later ones with this mix's."""
        states = state if isinstance(state, list) else [state]
        here = self.layout()["mix"]
        for one in states:
            saved = one.get("mix") if isinstance(one, dict) else None
            if not isinstance(saved, dict):
                raise ConfigError(f"state was not saved from a mix (no 'mix' entry); this {what} is a mix")
            _check_mix(saved, here, reweight, what, self.schedule)
        resume = parse_state(state, self.layout(), num_workers, what, level_value=self.level_value)
        saved = states[0]["mix"]
        reweighted = saved.get("reweighted") or {}
        self._saved_schedule = (resume.epoch, _saved_schedule(reweighted if reweighted.get("epoch") == resume.epoch
                                                              else saved, len(self.parts)))
        return resume

    def position(self, saved: dict | None) -> MixPosition:
        if saved is None:
            return MixPosition([Position() for _ in self.parts])
        return MixPosition([Position(**part) for part in saved["parts"]], saved.get("phase"))

    level_value = staticmethod(mix_level)

    # -- iteration
    def stream(self, worker: int = 0, num_workers: int = 1, *, progress: EpochProgress | None = None,
               resume: MixPosition | None = None) -> MixStream:
        """One worker's pass over the mix (rules M5, M8), the one way it is iterated."""
        progress = self.progress if progress is None else progress
        resume = resume or self.position(None)
        self._check_world(progress)
        rank, _ = self.rank_and_world()
        decode, stages, after = self._stages()
        # a stage composed on the mix runs on the mixed stream, past the counting point (as batching
        # does), so it must map one sample to one; a part's own stages go in Part(stages=...)
        after = [*([] if decode is None else [decode]), *stages, *after]
        phases = len(self.sequences(progress))
        if not 0 <= (resume.phase or 0) < phases:
            raise ConfigError(f"state's worker position is in phase {resume.phase}, the epoch has {phases} phase(s)")
        buffers = self.part_buffers(progress.epoch)

        def make_phase(k: int, position: MixPosition | None) -> _Phase:
            plans = self.plans(worker, num_workers, progress, k, rank)
            counts = [plan.outputs(part.weights) for part, plan in zip(self.parts, plans)]
            shares = self._read_ahead_shares(num_workers, self.phase_counts(progress.epoch)[k])
            streams = []
            for part, plan in zip(self.parts, plans):
                options, connections = shares[part.index]
                reader = ShardReader(part.catalog, handler=self.handler, cache=self.cache, options=options,
                                     max_connections=connections, shuffle_buffer=buffers[k][part.index],
                                     key=(self.seed, progress.epoch, rank, worker, *self._part_key(part.index, k)))
                start = Position() if position is None else position.parts[part.index]
                streams.append(WorkerStream(reader, plan, start, stages=part.stages, after=[], invoke=_invoke,
                                            decode=part.decode, equalize=self.equalize, shard_weights=part.weights))
            return _Phase(streams, counts, (self.seed, progress.epoch, rank, worker, *_phase_key(k)))

        # the later phases are made now, one after the other: made between two samples, a phase's plans
        # and readers would find the caches cold and cost several times as much (they hold no bytes)
        later = {k: make_phase(k, None) for k in range((resume.phase or 0) + 1, phases)}

        def phase(k: int, position: MixPosition | None) -> _Phase:
            made = later.pop(k, None) if position is None else None
            return made if made is not None else make_phase(k, position)

        return MixStream(phase, phases, resume, [part.name for part in self.parts], block=self.shuffle_buffer,
                         after=after, invoke=self.invoke)


def _phase_key(phase: int) -> tuple:
    """What a phase adds to every key of its shuffles (rule M8): nothing for phase 0."""
    return () if phase == 0 else (0x9A5E, phase)


def _saved_schedule(saved: dict, parts: int) -> Schedule:
    """The schedule (weights) a state records, exactly; an edited one that is not one is one line."""
    if "schedule" not in saved:
        shares = saved.get("shares")
        try:
            exact = tuple(Fraction(share) for share in shares)
            if len(exact) != parts or min(exact) <= 0:
                raise ValueError
        except (TypeError, ValueError, ZeroDivisionError):
            raise ConfigError(f"state's weights {shares!r:.120} are not {parts} numbers > 0") from None
        return Schedule((0,), (exact,))
    phases = saved["schedule"]
    try:
        starts = tuple(start if isinstance(start, int) and not isinstance(start, bool) else Fraction(start)
                       for start, _ in phases)
        shares = tuple(tuple(Fraction(share) for share in weights) for _, weights in phases)
        if (starts[0] != 0 or any(len(weights) != parts or min(weights) < 0 or not any(weights) for weights in shares)
                or any(b <= a for a, b in zip(starts, starts[1:]))):
            raise ValueError
    except (TypeError, ValueError, ZeroDivisionError, IndexError):
        raise ConfigError(f"state's schedule {phases!r:.120} is not phases of {parts} weights >= 0") from None
    return Schedule(starts, shares)


def _check_mix(saved: dict, here: dict, reweight: bool, what: str, schedule: Schedule) -> None:
    """One `ConfigError` line naming the first way a saved mix differs from this one (`schedule`: this
    mix's, whose weights messages say as its user wrote them; the state's are written back from their
    exact fractions)."""
    for name in ("mode", "stop", "samples_per_epoch"):
        if saved.get(name) != here[name]:
            raise ConfigError(f"state was saved with {name}={saved.get(name)!r}, this {what} has {here[name]!r}")
    old, new = saved.get("parts") or [], here["parts"]
    if [p.get("name") for p in old] != [p["name"] for p in new]:
        raise ConfigError(f"state was saved from a mix of parts {[p.get('name') for p in old]}, "
                          f"this {what} has {[p['name'] for p in new]}")
    for before, now in zip(old, new):
        for name in ("split", "dataset", "selection", "outputs"):  # another split has other shards: say the split
            if before.get(name) != now[name]:
                thing = "data (shards)" if name == "dataset" else name
                raise ConfigError(f"part {now['name']!r}: its {thing} differs from the saved state's "
                                  f"({before.get(name)!r}, now {now[name]!r})")
    if (saved.get("shares") != here.get("shares") or saved.get("schedule") != here.get("schedule")) and not reweight:
        raise ConfigError(f"state was saved with {_weights_difference(saved, schedule, what)}; "
                          "load_state_dict(state, reweight=True) finishes the saved epoch with the saved "
                          f"{'schedule' if 'schedule' in saved or schedule.phased else 'weights'}")


def _weights_difference(saved: dict, schedule: Schedule, what: str) -> str:
    """How a state's weights or schedule differ from this mix's, in words: the first phase that differs."""
    given = [weights for _, weights in schedule.given]
    if "schedule" not in saved:
        shares = saved.get("shares")
        spelled = [_spelled(str(share)) for share in shares] if isinstance(shares, list) else shares
        if not schedule.phased:
            return f"weights {spelled}, this {what} has {given[0]}"
        return f"weights {spelled} (no schedule), this {what} has the schedule {schedule.words()}"
    phases = saved["schedule"]
    if not isinstance(phases, list) or not all(isinstance(phase, list) and len(phase) == 2 for phase in phases):
        return f"the schedule {phases!r:.120}, this {what} has {schedule.words() if schedule.phased else given[0]}"
    spelled = [(_spelled_start(start), [_spelled(str(share)) for share in weights] if isinstance(weights, list)
                else weights) for start, weights in phases]
    if not schedule.phased:
        return f"a schedule of {len(phases)} phases, this {what} has weights {given[0]} (no schedule)"
    if len(phases) != schedule.phases:
        return f"a schedule of {len(phases)} phases, this {what} has {schedule.phases}"
    for k, ((start, weights), (here_start, here_weights)) in enumerate(zip(spelled, schedule.given)):
        if start != _spelled_start(schedule.layout()["schedule"][k][0]):
            return f"phase {k} from {start}, this {what}'s phase {k} is from {here_start}"
        if weights != [_spelled(str(share)) for share in schedule.shares[k]]:
            return f"phase {k} weights {weights}, this {what}'s phase {k} has {here_weights}"
    return f"the schedule {spelled}, this {what} has {schedule.words()}"


def _spelled_start(start: Any) -> str:
    """A start as a state records it (a sample position, or an exact fraction 'n/d') as a user writes it."""
    if isinstance(start, int) and not isinstance(start, bool):
        return str(start)
    try:
        return _spelled_decimal(Fraction(start))
    except (TypeError, ValueError, ZeroDivisionError):
        return repr(start)


def _selection_words(part: _Planned) -> str:
    selection = part.catalog.selection
    return "(none)" if selection is None else f"({selection.describe()})"


def _invoke(stage: Callable, source: Iterator) -> Iterator:
    return stage(source)


# a run passed whole: what an elastic resume counts of a phase an old worker had passed (rule M8)
_WHOLE_RUN = 1 << 62


def _part_level(level: Level, part: int, phase: int = 0) -> Level:
    """An interrupted pass's positions of one part in one phase (rule M8): a worker's own, where it
    was in that phase; its whole run, where it had passed the phase; none, where it had not reached it."""
    return Level(level.world_size, level.num_workers,
                 {k: _phase_value(value, part, phase) for k, value in level.positions.items()})


def _phase_value(value, part: int, phase: int) -> tuple[int, int]:
    at, parts = (value.phase, value.parts) if isinstance(value, PhaseLevel) else (0, value)
    if at > phase:
        return (_WHOLE_RUN, 0)
    if at < phase:
        return (0, 0)
    return parts[part]
