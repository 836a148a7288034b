"""Every ```python block of the guide runs as written, from the repository's root.

A block's standalone comment lines (`# text` on a line of their own) show what it prints: each
must appear in its output. Nothing it prints may be a bare `repr` without content.
"""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
PAGES = ["README.md", "docs/bindings.md", "bindings/python/README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks():
    for page in PAGES:
        text = (ROOT / page).read_text()
        found = list(BLOCK.finditer(text))
        assert found, f"{page} shows no python block"
        for m in found:
            line = text[: m.start()].count("\n") + 1
            yield pytest.param(m.group(1), id=f"{page}:{line}")


@pytest.mark.parametrize("code", list(blocks()))
def test_snippet_runs_as_written(code: str) -> None:
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert out.strip(), "the snippet prints nothing"
    assert not re.search(r"<gpuslice\.\w+ (of|at|object) ", out), out
    for shown in re.findall(r"^\s*# (.+)$", code, re.M):
        assert shown in out, f"{shown!r} not printed:\n{out}"
