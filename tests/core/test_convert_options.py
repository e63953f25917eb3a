"""The core's options have one home: `wdsprep convert` with no flag and `convert()` with no keyword
mean the same documented defaults; a source gets its own options apart from the core's; each
executor's flags come from its entry in `EXECUTORS`; and the step-by-step driver (`wdsprep.Conversion`)
reuses exactly the units whose digest still matches, recording each built unit durably."""
from __future__ import annotations

import json
import os

import pytest

import wdsprep
from wdsprep import cli
from wdsprep.commands.convert import convert_options_from, source_parser
from wdsprep.conversion import convert
from wdsprep.executors import EXECUTORS, ExecutorKind
from wdsprep.sources.base import PlanContext, Source
from wdsprep.sources.generic import SOURCE as GENERIC
from wdsprep.storage import open_store

# the defaults README.md documents for `wdsprep convert` (256MB shards, zstd level 3, stop at a bad item)
DOCUMENTED = {"shard_bytes": 256_000_000, "codec": "zstd", "zstd_level": 3, "on_error": "raise"}


def _tars(directory) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if name.endswith(".tar")}


def test_the_cli_and_convert_mean_the_same_documented_defaults(tmp_path):
    GENERIC.synth(str(tmp_path / "in"), seed=3, splits={"train": 6})
    assert cli.main(["convert", "generic", str(tmp_path / "in"), str(tmp_path / "cli"), "--quiet"]) == 0
    manifest = convert("generic", str(tmp_path / "in"), str(tmp_path / "py"))
    by_cli = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert by_cli["config"] == manifest.config and {k: manifest.config[k] for k in DOCUMENTED} == DOCUMENTED
    assert _tars(tmp_path / "cli") == _tars(tmp_path / "py") and _tars(tmp_path / "py")


def test_the_ray_flags_become_the_ray_executors_options_only():
    parser = source_parser("generic")
    core, own = convert_options_from(parser.parse_args(
        ["in", "out", "--executor", "ray", "--ray-address", "10.0.0.1:6379", "--ray-retries", "0"]))
    assert (core.executor, core.executor_options, own) == ("ray", {"address": "10.0.0.1:6379", "retries": 0}, {})
    core, own = convert_options_from(parser.parse_args(["in", "out", "--ray-address", "10.0.0.1:6379"]))
    assert (core.executor, core.executor_options, own) == ("local", {}, {})  # another executor's flag is not passed on


class Recorded:
    """An executor that runs units in-process and remembers the options its factory got."""

    options: list = []

    def __init__(self, **options):
        Recorded.options.append(options)

    def map_unordered(self, fn, tasks):
        for index, args in enumerate(tasks):
            yield index, fn(*args)


def test_an_executor_declares_its_own_flags(monkeypatch, tmp_path, capsys):
    kind = ExecutorKind(lambda workers=1, **options: Recorded(workers=workers, **options),
                        lambda parser: parser.add_argument("--depth", type=int, default=None, help="how deep"),
                        lambda args: {} if args.depth is None else {"depth": args.depth})
    monkeypatch.setitem(EXECUTORS, "recorded", kind)
    monkeypatch.setattr(Recorded, "options", [])
    with pytest.raises(SystemExit):
        cli.main(["convert", "generic", "--help"])
    assert "--depth" in capsys.readouterr().out
    GENERIC.synth(str(tmp_path / "in"), seed=1, splits={"train": 4})
    assert cli.main(["convert", "generic", str(tmp_path / "in"), str(tmp_path / "out"), "--executor", "recorded",
                     "--depth", "3", "--workers", "2", "--quiet"]) == 0
    assert Recorded.options == [{"workers": 2, "depth": 3}]


class OwnOptions(Source):
    """The plugin contract on options: `check_options` and `ctx.options` see the source's own only."""

    id = "own-options"
    seen: list = []

    def check_options(self, options):
        OwnOptions.seen.append(("check", dict(options)))

    def plan(self, input, ctx):
        OwnOptions.seen.append(("plan", dict(ctx.options), ctx.core.shard_bytes, ctx.core.on_error))
        return GENERIC.plan(input, ctx)

    def inputs(self, item):
        return GENERIC.inputs(item)

    def build(self, unit, ctx):
        OwnOptions.seen.append(("build", dict(ctx.options), ctx.core.codec))
        yield from GENERIC.build(unit, ctx)


def test_a_source_gets_its_own_options_apart_from_the_cores(monkeypatch, tmp_path):
    GENERIC.synth(str(tmp_path / "in"), seed=2, splits={"train": 3})
    monkeypatch.setattr(OwnOptions, "seen", [])
    monkeypatch.setattr("wdsprep.conversion.load_source", lambda source_id: OwnOptions())
    convert("own", str(tmp_path / "in"), str(tmp_path / "out"), shard_bytes="1MB", on_error="skip", codec="none",
            colour="blue")
    assert OwnOptions.seen == [("check", {"colour": "blue"}), ("plan", {"colour": "blue"}, 1_000_000, "skip"),
                               ("build", {"colour": "blue"}, "none")]
    assert PlanContext({"shard_bytes": "2KB", "colour": "red"}).core.shard_bytes == 2000  # one mapping, taken apart


def _driver(tmp_path, output, changed=()):
    """A driver over the generic source's plan, each unit's inputs named "a" (or "changed")."""
    plan = GENERIC.plan(str(tmp_path / "in"), PlanContext({"shard_bytes": 4000}))
    inputs = ["changed" if unit.index in changed else "a" for unit in plan.units]
    core = wdsprep.ConvertOptions(shard_bytes=4000).checked()
    return plan, wdsprep.Conversion("generic", str(tmp_path / "in"), open_store(output), plan, core, {}, inputs,
                                    input_mode="test")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_driver_reuses_exactly_the_units_whose_digest_matches(tmp_path, where, request):
    if where == "s3":  # a store that cannot append: every built unit is still recorded before `build` returns
        s3 = request.getfixturevalue("s3_server")
        for name, value in s3.env.items():
            request.getfixturevalue("monkeypatch").setenv(name, value)
        output = f"s3://{s3.create_bucket(f'driver-{os.getpid()}')}/out"
    else:
        output = str(tmp_path / "out")
    GENERIC.synth(str(tmp_path / "in"), seed=5, splits={"train": 12})
    plan, first = _driver(tmp_path, output)
    assert len(plan.units) >= 4 and first.todo == plan.units
    for unit in plan.units[:3]:
        first.build(unit)
    # a driver opened now (the next run of a killed one) finds both, and reuses the one whose inputs are the same
    plan, again = _driver(tmp_path, output, changed={plan.units[1].index})
    assert again.done(plan.units[0]) and again.done(plan.units[2]) and again.reused == 2
    assert again.done(plan.units[1]) is None  # its input changed: built again
    assert again.todo == [plan.units[1], *plan.units[3:]]
    assert open_store(output).read_bytes("manifest.json") is None
    for unit in again.todo:
        again.build(unit)
    manifest = again.finish()
    assert manifest.timing["units_reused"] == 2 and manifest.samples("train") == 12
