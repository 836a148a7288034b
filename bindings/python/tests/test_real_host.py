"""The real host: whatever this machine has, discovery answers with data or a HostError."""

from pathlib import Path

import gpuslice


def test_discover_of_this_machine_returns_a_topology_or_a_host_error():
    try:
        topology = gpuslice.discover()
    except gpuslice.HostError as e:
        assert not Path("/sys/bus/pci/devices").is_dir(), e
    else:
        assert isinstance(topology["gpus"], list)
        assert topology["node"]
