"""Helpers shared by the rawnind tests: the ground truth that `synth` writes beside its files."""
import json
import pathlib


def truth(root: pathlib.Path) -> dict:
    return json.loads((root / "synth_truth.json").read_text())
