"""The Python side of the cross-front-end error cases (``tests/error-cases.json``): every bad
input raises the class and ``error_kind`` the CLI and the Node package report for it too."""

import json
from pathlib import Path

import pytest

import gpuslice

CASES = json.loads(
    (Path(__file__).resolve().parents[3] / "tests" / "error-cases.json").read_text()
)["cases"]


def run(case, tmp_path):
    call = case["call"]
    if call == "place":
        fleet = gpuslice.Fleet.from_dict(case["fleet"])
        fleet.place(case["machine"])
    elif call == "layout":
        gpuslice.plan_vgpu_config(case["layout"], case["config"], case["topology"])
    elif call == "policy":
        root = tmp_path / "root"
        (root / "sys").mkdir(parents=True)
        gpuslice.health(str(root), policy=case["policy"])
    elif call == "discover":
        gpuslice.discover(case["root"])
    else:
        raise AssertionError(f"unknown call {call}")


def test_there_are_six_cases():
    assert len(CASES) == 7


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_bad_input_raises_the_class_and_kind_every_front_end_agrees_on(case, tmp_path):
    with pytest.raises(gpuslice.Error) as info:
        run(case, tmp_path)
    assert type(info.value).__name__ == case["python"], info.value
    assert info.value.error_kind == case["kind"], info.value
