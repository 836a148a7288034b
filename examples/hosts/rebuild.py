#!/usr/bin/env python3
"""Writes the rebuilt bundled hosts of examples/hosts/ (umockdev-record format).

Run from the repository root: `python3 examples/hosts/rebuild.py`. It rewrites
workstation-passthrough.umockdev, l40s-vendor-vfio.umockdev, h200-mig.umockdev,
h100-sxm-mig-off.umockdev, hgx-h100-nvswitch.umockdev, hgx-h100-vgpu.umockdev and
mixed-a2-l40s.umockdev from the facts named in
examples/hosts/README.md (and the captures under gpu-sysfs/tests/data and
examples/hosts/a2-sriov-mdev.umockdev). Output is deterministic: running it twice gives
the same files, and the committed files are what it writes.
"""

import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

AER_COR = ("RxErr 0\\nBadTLP 0\\nBadDLLP 0\\nRollover 0\\nTimeout 0\\nNonFatalErr 0\\n"
           "CorrIntErr 0\\nHeaderOF 0\\nTOTAL_ERR_COR 0\\n")
AER_UNCOR = ("Undefined 0\\nDLP 0\\nSDES 0\\nTLP 0\\nFCP 0\\nCmpltTO 0\\nCmpltAbrt 0\\n"
             "UnxCmplt 0\\nRxOF 0\\nMalfTLP 0\\nECRC 0\\nUnsupReq 0\\nACSViol 0\\n"
             "UncorrIntErr 0\\nBlockedTLP 0\\nAtomicOpBlocked 0\\nTLPBlockedErr 0\\n"
             "PoisonTLPBlocked 0\\n")

# The L40S VF's vendor-VFIO files, as captured (gpu-sysfs/tests/data/l40s-vf-0000-26-00.4).
L40S_CAPTURE = os.path.join(ROOT, "gpu-sysfs/tests/data/l40s-vf-0000-26-00.4/nvidia")

# H200 SXM MIG-backed vGPU types: names from NVIDIA vgpu-device-manager's
# examples/config-example.yaml (Apache-2.0); 1414 = H200X-1-18C is a published ID, the other
# IDs follow it in that order (not published; resolve names, never IDs).
H200_MIG_NAMES = ["1-18C", "1-18CME", "1-35C", "2-35C", "3-71C", "4-71C", "7-141C"]
H200_MIG_TYPES = [(1414 + i, f"NVIDIA H200X-{n}") for i, n in enumerate(H200_MIG_NAMES)]


def bdf(bus, dev=0, fn=0, dom=0):
    return f"{dom:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def esc(v):
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def record(path, vendor, device, cls, driver=None, group=None, numa=0, subsys=None,
           link=None, aer=False, boot_vga=None, attrs=(), links=()):
    """One PCI function. `path` is under /sys (`/devices/pci0000:00/...`)."""
    name = path.rsplit("/", 1)[1]
    depth = path.count("/")  # from the device directory up to /sys
    up = "../" * depth
    sv, sd = subsys if subsys else (None, None)
    lines = [f"P: {path}"]
    if driver:
        lines.append(f"E: DRIVER={driver}")
    lines.append(f"E: PCI_CLASS={cls:X}")
    lines.append(f"E: PCI_ID={vendor:04X}:{device:04X}")
    lines.append(f"E: PCI_SLOT_NAME={name}")
    if subsys:
        lines.append(f"E: PCI_SUBSYS_ID={sv:04X}:{sd:04X}")
    lines.append("E: SUBSYSTEM=pci")
    a = [("class", f"0x{cls:06x}\n"), ("vendor", f"0x{vendor:04x}\n"),
         ("device", f"0x{device:04x}\n"), ("driver_override", "(null)\n"),
         ("numa_node", f"{numa}\n")]
    if subsys:
        a += [("subsystem_vendor", f"0x{sv:04x}\n"), ("subsystem_device", f"0x{sd:04x}\n")]
    if link:
        cw, mw, cs, ms = link
        a += [("current_link_width", f"{cw}\n"), ("max_link_width", f"{mw}\n"),
              ("current_link_speed", f"{cs}\n"), ("max_link_speed", f"{ms}\n")]
    if aer:
        a += [("aer_dev_correctable", AER_COR.replace("\\n", "\n")),
              ("aer_dev_nonfatal", (AER_UNCOR + "TOTAL_ERR_NONFATAL 0\\n").replace("\\n", "\n")),
              ("aer_dev_fatal", (AER_UNCOR + "TOTAL_ERR_FATAL 0\\n").replace("\\n", "\n"))]
    if boot_vga is not None:
        a.append(("boot_vga", "1\n" if boot_vga else "0\n"))
    a += list(attrs)
    for k, v in sorted(a):
        lines.append(f"A: {k}={esc(v)}")
    ls = []
    if driver:
        ls.append(("driver", f"{up}bus/pci/drivers/{driver}"))
    if group is not None:
        ls.append(("iommu_group", f"{up}kernel/iommu_groups/{group}"))
    ls += list(links)
    for k, v in sorted(ls):
        lines.append(f"L: {k}={v}")
    return "\n".join(lines) + "\n"


def root_port(rc, port, vendor, device, group, numa=0):
    return record(f"/devices/pci{rc}/{port}", vendor, device, 0x060400, driver="pcieport",
                  group=group, numa=numa, aer=True)


def sriov_pf(path, vendor, device, cls, total, numvfs, offset, stride, group, numa, subsys,
             link, vf_group, vf_attrs):
    """A PF with `numvfs` VFs beside it; returns the records. `vf_attrs(i)` gives VF i's
    extra attributes."""
    parent, pf = path.rsplit("/", 1)
    dom, bus, rest = pf.split(":")
    dev, fn = rest.split(".")
    rid = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn, 16)
    vfs = []
    for i in range(numvfs):
        r = rid + offset + i * stride
        vfs.append(f"{dom}:{(r >> 8) & 0xff:02x}:{(r >> 3) & 0x1f:02x}.{r & 7:x}")
    out = [record(path, vendor, device, cls, driver="nvidia", group=group, numa=numa,
                  subsys=subsys, link=link, aer=True,
                  attrs=[("sriov_totalvfs", f"{total}\n"), ("sriov_numvfs", f"{numvfs}\n"),
                         ("sriov_offset", f"{offset}\n"), ("sriov_stride", f"{stride}\n"),
                         ("sriov_vf_device", f"{device:04x}\n")],
                  links=[(f"virtfn{i}", f"../{vf}") for i, vf in enumerate(vfs)])]
    for i, vf in enumerate(vfs):
        out.append(record(f"{parent}/{vf}", vendor, device, cls, driver="nvidia",
                          group=vf_group + i, numa=numa, subsys=(0x10de, 0x0000),
                          attrs=vf_attrs(i), links=[("physfn", f"../{pf}")]))
    return out


def creatable(types):
    text = "ID    : vGPU Name\n"
    for i, n in types:
        text += f"{i:<6}: {n}\n"
    return text


def vendor_vfio_attrs(listed, current=0):
    return [("nvidia/creatable_vgpu_types", creatable(listed) if current == 0
             else "ID    : vGPU Name\n"),
            ("nvidia/current_vgpu_type", f"{current}\n"),
            ("nvidia/gpu_instance_id", ""), ("nvidia/placement_id", ""),
            ("nvidia/vgpu_params", "")]


def l40s_capture():
    files = {}
    for f in ["creatable_vgpu_types", "current_vgpu_type", "gpu_instance_id",
              "placement_id", "vgpu_params"]:
        with open(os.path.join(L40S_CAPTURE, f)) as h:
            files[f] = h.read()
    return [(f"nvidia/{k}", v) for k, v in files.items()]


# Root ports stand in for the host's bridges: Xeon E5 v3 root port IDs, as in the A2 capture.
XEON_PORT = (0x8086, 0x2f08)


def l40s(rc, port, bus, group, numa, with_port=True):
    """An L40S (10de:26b9) below root port `port`, 32 VFs enabled, each as the captured VF."""
    cap = l40s_capture()
    recs = [root_port(rc, port, *XEON_PORT, group, numa)] if with_port else []
    recs += sriov_pf(f"/devices/pci{rc}/{port}/{bdf(bus)}", 0x10de, 0x26b9, 0x030200,
                     32, 32, 4, 1, group + 1, numa, None,
                     (16, 16, "16.0 GT/s PCIe", "16.0 GT/s PCIe"), group + 2, lambda i: cap)
    return recs


def workstation():
    rc = "0000:00"
    ports = {"gpu0": "0000:00:01.1", "chipset": "0000:00:01.2", "gpu1": "0000:00:03.1"}
    x16 = (16, 16, "16.0 GT/s PCIe", "16.0 GT/s PCIe")
    r = [root_port(rc, ports["gpu0"], 0x1022, 0x1483, 2),
         root_port(rc, ports["chipset"], 0x1022, 0x1483, 3),
         root_port(rc, ports["gpu1"], 0x1022, 0x1483, 5)]
    g0 = f"/devices/pci{rc}/{ports['gpu0']}"
    r.append(record(f"{g0}/0000:01:00.0", 0x10de, 0x2230, 0x030000, driver="nvidia", group=14,
                    link=x16, aer=True, boot_vga=False))
    r.append(record(f"{g0}/0000:01:00.1", 0x10de, 0x1aef, 0x040300, driver="snd_hda_intel",
                    group=14, link=x16))
    g1 = f"/devices/pci{rc}/{ports['gpu1']}"
    r.append(record(f"{g1}/0000:02:00.0", 0x10de, 0x26b1, 0x030000, driver="nvidia",
                    group=15, link=x16, aer=True, boot_vga=False))
    r.append(record(f"{g1}/0000:02:00.1", 0x10de, 0x22ba, 0x040300, driver="snd_hda_intel",
                    group=15, link=x16))
    # The chipset: a switch whose downstream ports lack ACS, so everything behind it is one group.
    up = f"/devices/pci{rc}/{ports['chipset']}/0000:03:00.0"
    r.append(record(up, 0x1022, 0x57ad, 0x060400, driver="pcieport", group=16,
                    link=(4, 4, "16.0 GT/s PCIe", "16.0 GT/s PCIe")))
    for dev, (ep, vend, devid, cls, drv) in {
        0x01: ("0000:05:00.0", 0x1022, 0x149c, 0x0c0330, "xhci_hcd"),
        0x08: ("0000:06:00.0", 0x1022, 0x7901, 0x010601, "ahci"),
        0x09: ("0000:07:00.0", 0x10de, 0x2204, 0x030000, "nvidia"),
    }.items():
        dp = f"{up}/0000:04:{dev:02x}.0"
        r.append(record(dp, 0x1022, 0x57a4, 0x060400, driver="pcieport", group=16,
                        link=(4, 4, "16.0 GT/s PCIe", "16.0 GT/s PCIe")))
        r.append(record(f"{dp}/{ep}", vend, devid, cls, driver=drv, group=16,
                        aer=vend == 0x10de, boot_vga=True if vend == 0x10de else None))
        if vend == 0x10de:
            r.append(record(f"{dp}/0000:07:00.1", 0x10de, 0x1aef, 0x040300,
                            driver="snd_hda_intel", group=16))
    return r


def h200():
    rc = "0000:17"
    recs = [root_port(rc, "0000:17:01.0", *XEON_PORT, 20, 0)]
    recs += sriov_pf(f"/devices/pci{rc}/0000:17:01.0/0000:18:00.0", 0x10de, 0x2335, 0x030200,
                     16, 16, 4, 1, 21, 0, None,
                     (16, 16, "32.0 GT/s PCIe", "32.0 GT/s PCIe"), 22,
                     lambda i: vendor_vfio_attrs(H200_MIG_TYPES))
    return recs


def h100_mig_off():
    """An H100 SXM5 80GB, MIG mode off, SR-IOV capable with no VF enabled yet: NVIDIA's order
    for MIG-backed vGPUs is MIG mode first, then `sriov-manage -e`."""
    rc = "0000:17"
    recs = [root_port(rc, "0000:17:01.0", *XEON_PORT, 20, 0)]
    recs += sriov_pf(f"/devices/pci{rc}/0000:17:01.0/0000:18:00.0", 0x10de, 0x2330, 0x030200,
                     16, 0, 4, 1, 21, 0, None,
                     (16, 16, "32.0 GT/s PCIe", "32.0 GT/s PCIe"), 22,
                     lambda i: [])
    return recs


HGX_GPU_BUSES = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb]
HGX_NVSWITCH_BUSES = [0x05, 0x06, 0x07, 0x08]


def hgx_board(gpu_recs):
    """An HGX 8-GPU baseboard: four NVSwitches, then each GPU below its root port, made by
    `gpu_recs(rc, port, bus, group, numa)` (the records and how many IOMMU groups they use)."""
    recs = []
    group = 10
    for i, bus in enumerate(HGX_NVSWITCH_BUSES):
        rc = "0000:00"
        port = f"0000:00:{0x01 + i:02x}.0"
        recs.append(root_port(rc, port, *XEON_PORT, group, 0))
        recs.append(record(f"/devices/pci{rc}/{port}/{bdf(bus)}", 0x10de, 0x22a3, 0x068000,
                           driver="nvidia", group=group + 1, numa=0,
                           link=(2, 2, "16.0 GT/s PCIe", "16.0 GT/s PCIe"), aer=True))
        group += 2
    for i, bus in enumerate(HGX_GPU_BUSES):
        rc = f"0000:{bus - 1:02x}"
        port = f"0000:{bus - 1:02x}:01.0"
        numa = 0 if i < 4 else 1
        recs.append(root_port(rc, port, *XEON_PORT, group, numa))
        gpu, used = gpu_recs(rc, port, bus, group + 1, numa)
        recs += gpu
        group += 1 + used
    return recs


HGX_LINK = (16, 16, "32.0 GT/s PCIe", "32.0 GT/s PCIe")


def hgx():
    return hgx_board(lambda rc, port, bus, group, numa: (
        [record(f"/devices/pci{rc}/{port}/{bdf(bus)}", 0x10de, 0x2330, 0x030200,
                driver="nvidia", group=group, numa=numa, link=HGX_LINK, aer=True)], 1))


# H100 SXM5 80GB time-sliced vGPU types for the vGPU-mode HGX host: names as NVIDIA's vGPU type
# tables spell them for the SXM5 board (H100XM); the IDs are not published (resolve names, never
# IDs). 80C takes the whole framebuffer (one per GPU), 40C half of it.
H100XM_TYPES = [(1100, "NVIDIA H100XM-80C"), (1101, "NVIDIA H100XM-40C")]


def hgx_vgpu():
    """The HGX H100 baseboard of hgx() with SR-IOV on every GPU (4 VFs each, vendor-specific
    VFIO, time-sliced types): a host whose Fabric Manager runs in vGPU mode."""
    return hgx_board(lambda rc, port, bus, group, numa: (
        sriov_pf(f"/devices/pci{rc}/{port}/{bdf(bus)}", 0x10de, 0x2330, 0x030200,
                 16, 4, 4, 1, group, numa, None, HGX_LINK, group + 1,
                 lambda i: vendor_vfio_attrs(H100XM_TYPES)), 5))


def mixed():
    with open(os.path.join(HERE, "a2-sriov-mdev.umockdev")) as h:
        a2 = h.read().rstrip("\n") + "\n"
    # Below the recorded host's free root port 0000:80:02.0 (socket 1), groups after its last.
    return [a2] + l40s("0000:80", "0000:80:02.0", 0x84, 120, 1, with_port=False)


def write(name, recs):
    text = "\n".join(recs)
    with open(os.path.join(HERE, name), "w") as h:
        h.write(text)


def main():
    write("workstation-passthrough.umockdev", workstation())
    write("l40s-vendor-vfio.umockdev", l40s("0000:25", "0000:25:01.0", 0x26, 40, 0))
    write("h200-mig.umockdev", h200())
    write("h100-sxm-mig-off.umockdev", h100_mig_off())
    write("hgx-h100-nvswitch.umockdev", hgx())
    write("mixed-a2-l40s.umockdev", mixed())
    write("hgx-h100-vgpu.umockdev", hgx_vgpu())


if __name__ == "__main__":
    main()
