"""Helpers shared by the rawnind tests (a uniquely named module: `from conftest import` is ambiguous
when several test folders have a conftest.py)."""
import json
import pathlib


def truth(root: pathlib.Path) -> dict:
    return json.loads((root / "synth_truth.json").read_text())
