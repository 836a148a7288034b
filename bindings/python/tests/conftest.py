import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hosttree import HostTree, two_gpu_host  # noqa: E402


@pytest.fixture
def host(tmp_path: Path) -> HostTree:
    """A two-GPU host: an NVIDIA T4 offering mdev vGPUs and a free AMD GPU."""
    return two_gpu_host(tmp_path / "host")
