"""The stubs are precise enough for a type checker: typed client code checks, wrong code does not.
Needs mypy (installed by scripts/test-python)."""

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "typing"

mypy = pytest.importorskip("mypy", reason="mypy is not installed")


def run_mypy(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir=/dev/null",
         "--python-version=3.10", str(path)],
        capture_output=True,
        text=True,
    )


def test_typed_client_code_checks_against_the_stubs():
    result = run_mypy(HERE / "usage.py")

    assert result.returncode == 0, result.stdout


def test_wrong_calls_are_type_errors():
    result = run_mypy(HERE / "wrong.py")

    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert {int(line.split(":")[1]) for line in errors} == {6, 7, 8}, result.stdout
