"""Fake host trees for the tests: real directories, files and symlinks laid out as the kernel lays
out ``/sys`` (device directories under ``sys/devices``, bus and class views as symlinks), so the
real discovery code runs against them. Mirrors gpu-sysfs' ``TreeBuilder``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Tuple

BUS_PCI = "sys/bus/pci"


class HostTree:
    """A host root under ``root`` (standing for ``/``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        for d in [
            "sys/devices/pci0000:00",
            "sys/bus/pci/devices",
            "sys/bus/pci/drivers",
            "sys/bus/mdev/devices",
            "sys/class/mdev_bus",
            "sys/kernel/iommu_groups",
            "proc",
            "dev/vfio",
            "run",
        ]:
            self.mkdir(d)
        self.file(f"{BUS_PCI}/drivers_probe", "")

    def mkdir(self, rel: str) -> None:
        (self.root / rel).mkdir(parents=True, exist_ok=True)

    def file(self, rel: str, content: str) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)

    def link(self, rel: str, target: str) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        os.symlink(target, p)

    @staticmethod
    def pci_dir(addr: str) -> str:
        return f"sys/devices/pci0000:00/{addr}"

    def pci(
        self,
        addr: str,
        vendor: int,
        device: int,
        cls: int,
        driver: Optional[str] = None,
        group: Optional[int] = None,
        numa: Optional[int] = None,
        link: Optional[Tuple[int, int, str, str]] = None,
    ) -> "HostTree":
        d = self.pci_dir(addr)
        self.file(f"{d}/vendor", f"0x{vendor:04x}\n")
        self.file(f"{d}/device", f"0x{device:04x}\n")
        self.file(f"{d}/class", f"0x{cls:06x}\n")
        self.file(f"{d}/driver_override", "(null)\n")
        if numa is not None:
            self.file(f"{d}/numa_node", f"{numa}\n")
        if link is not None:
            cw, mw, cs, ms = link
            self.file(f"{d}/current_link_width", f"{cw}\n")
            self.file(f"{d}/max_link_width", f"{mw}\n")
            self.file(f"{d}/current_link_speed", f"{cs}\n")
            self.file(f"{d}/max_link_speed", f"{ms}\n")
        self.link(f"{BUS_PCI}/devices/{addr}", f"../../../devices/pci0000:00/{addr}")
        if driver is not None:
            self.mkdir(f"{BUS_PCI}/drivers/{driver}")
            self.link(f"{d}/driver", f"../../../bus/pci/drivers/{driver}")
            self.link(f"{BUS_PCI}/drivers/{driver}/{addr}", f"../../../../devices/pci0000:00/{addr}")
        if group is not None:
            self.mkdir(f"sys/kernel/iommu_groups/{group}/devices")
            self.link(f"{d}/iommu_group", f"../../../kernel/iommu_groups/{group}")
            self.link(
                f"sys/kernel/iommu_groups/{group}/devices/{addr}",
                f"../../../../devices/pci0000:00/{addr}",
            )
        return self

    def mdev_parent(
        self, addr: str, types: Iterable[Tuple[str, str, int, Optional[str]]]
    ) -> "HostTree":
        """Registers a PCI function as an mdev parent offering ``(id, name, available, description)``."""
        d = self.pci_dir(addr)
        self.link(f"sys/class/mdev_bus/{addr}", f"../../devices/pci0000:00/{addr}")
        for type_id, name, available, description in types:
            t = f"{d}/mdev_supported_types/{type_id}"
            self.mkdir(f"{t}/devices")
            self.file(f"{t}/name", f"{name}\n")
            self.file(f"{t}/available_instances", f"{available}\n")
            self.file(f"{t}/device_api", "vfio-pci\n")
            if description is not None:
                self.file(f"{t}/description", f"{description}\n")
            self.file(f"{t}/create", "")
        return self

    def mdev_instance(self, uuid: str, addr: str, type_id: str) -> "HostTree":
        d = self.pci_dir(addr)
        i = f"{d}/{uuid}"
        self.mkdir(i)
        self.link(f"{i}/mdev_type", f"../mdev_supported_types/{type_id}")
        self.file(f"{i}/remove", "")
        self.link(f"sys/bus/mdev/devices/{uuid}", f"../../../devices/pci0000:00/{addr}/{uuid}")
        self.link(f"{d}/mdev_supported_types/{type_id}/devices/{uuid}", f"../../../{uuid}")
        return self


T4_TYPES = [
    ("nvidia-222", "GRID T4-1B", 16, "num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16"),
    ("nvidia-230", "GRID T4-8Q", 2, "num_heads=4, frl_config=60, framebuffer=8192M, max_resolution=7680x4320, max_instance=2"),
    ("nvidia-231", "GRID T4-16Q", 1, "num_heads=4, frl_config=60, framebuffer=16384M, max_resolution=7680x4320, max_instance=1"),
    ("nvidia-234", "GRID T4-4C", 4, "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2160, max_instance=4"),
]


def two_gpu_host(root: Path) -> HostTree:
    """A host with an NVIDIA T4 sharing vGPUs through mdev and an AMD GPU free for passthrough."""
    tree = HostTree(root)
    tree.pci(
        "0000:3b:00.0", 0x10DE, 0x1EB8, 0x030200, driver="nvidia", group=10, numa=0,
        link=(16, 16, "8.0 GT/s PCIe", "8.0 GT/s PCIe"),
    )
    tree.mdev_parent("0000:3b:00.0", T4_TYPES)
    tree.pci(
        "0000:af:00.0", 0x1002, 0x744C, 0x030000, driver="amdgpu", group=30, numa=1,
        link=(16, 16, "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
    )
    return tree
