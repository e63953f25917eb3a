"""`--executor` choices come from one table, `wdsprep.executors.EXECUTORS`: an executor entered
there (here one defined in the test) is accepted by the CLI and converts to the same bytes as the
local pool; a name not in the table is refused by the CLI, naming the ones that are."""
from __future__ import annotations

import os

import pytest

from wdsprep import cli
from wdsprep.executors import EXECUTORS
from wdsprep.sources.generic import SOURCE as GENERIC


class ReversedExecutor:
    """Runs the tasks in-process, last first: the completion order must not matter."""

    def map_unordered(self, fn, tasks):
        for index in reversed(range(len(tasks))):
            yield index, fn(*tasks[index])


def _files(directory) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if name.endswith(".tar")}


def test_an_executor_entered_in_the_table_is_a_cli_choice(monkeypatch, tmp_path):
    GENERIC.synth(str(tmp_path / "in"), seed=2, splits={"train": 12})
    monkeypatch.setitem(EXECUTORS, "reversed", lambda workers=1, **options: ReversedExecutor())
    common = ["convert", "generic", str(tmp_path / "in")]
    assert cli.main([*common, str(tmp_path / "local"), "--shard-bytes", "40KB", "--quiet"]) == 0
    assert cli.main([*common, str(tmp_path / "rev"), "--shard-bytes", "40KB", "--executor", "reversed", "--quiet"]) == 0
    local, reversed_ = _files(tmp_path / "local"), _files(tmp_path / "rev")
    assert len(local) > 2 and local == reversed_


def test_a_name_outside_the_table_is_refused_naming_the_choices(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["convert", "generic", str(tmp_path), str(tmp_path / "out"), "--executor", "nope"])
    error = capsys.readouterr().err
    assert "invalid choice: 'nope'" in error and all(f"'{name}'" in error for name in EXECUTORS)
