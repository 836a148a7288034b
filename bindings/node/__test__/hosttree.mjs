// Fake host trees for the tests: real directories, files and symlinks laid out as the kernel
// lays out /sys (device directories under sys/devices, bus and class views as symlinks), so the
// real discovery code runs against them. Mirrors gpu-sysfs' TreeBuilder.
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'

const BUS_PCI = 'sys/bus/pci'
const hex = (n, width) => n.toString(16).padStart(width, '0')

export class HostTree {
  constructor(root) {
    this.root = root
    for (const d of [
      'sys/devices/pci0000:00',
      'sys/bus/pci/devices',
      'sys/bus/pci/drivers',
      'sys/bus/mdev/devices',
      'sys/class/mdev_bus',
      'sys/kernel/iommu_groups',
      'proc',
      'dev/vfio',
      'run',
    ]) {
      this.mkdir(d)
    }
    this.file(`${BUS_PCI}/drivers_probe`, '')
  }

  static temp() {
    return new HostTree(fs.mkdtempSync(path.join(os.tmpdir(), 'gpuslice-host-')))
  }

  remove() {
    fs.rmSync(this.root, { recursive: true, force: true })
  }

  mkdir(rel) {
    fs.mkdirSync(path.join(this.root, rel), { recursive: true })
  }

  file(rel, content) {
    const p = path.join(this.root, rel)
    fs.mkdirSync(path.dirname(p), { recursive: true })
    fs.writeFileSync(p, content)
  }

  link(rel, target) {
    const p = path.join(this.root, rel)
    fs.mkdirSync(path.dirname(p), { recursive: true })
    fs.rmSync(p, { force: true })
    fs.symlinkSync(target, p)
  }

  static pciDir(addr) {
    return `sys/devices/pci0000:00/${addr}`
  }

  pci(addr, { vendor, device, cls, driver, group, numa, link }) {
    const d = HostTree.pciDir(addr)
    this.file(`${d}/vendor`, `0x${hex(vendor, 4)}\n`)
    this.file(`${d}/device`, `0x${hex(device, 4)}\n`)
    this.file(`${d}/class`, `0x${hex(cls, 6)}\n`)
    this.file(`${d}/driver_override`, '(null)\n')
    if (numa !== undefined) this.file(`${d}/numa_node`, `${numa}\n`)
    if (link) {
      const [cw, mw, cs, ms] = link
      this.file(`${d}/current_link_width`, `${cw}\n`)
      this.file(`${d}/max_link_width`, `${mw}\n`)
      this.file(`${d}/current_link_speed`, `${cs}\n`)
      this.file(`${d}/max_link_speed`, `${ms}\n`)
    }
    this.link(`${BUS_PCI}/devices/${addr}`, `../../../devices/pci0000:00/${addr}`)
    if (driver) {
      this.mkdir(`${BUS_PCI}/drivers/${driver}`)
      this.link(`${d}/driver`, `../../../bus/pci/drivers/${driver}`)
      this.link(`${BUS_PCI}/drivers/${driver}/${addr}`, `../../../../devices/pci0000:00/${addr}`)
    }
    if (group !== undefined) {
      this.mkdir(`sys/kernel/iommu_groups/${group}/devices`)
      this.link(`${d}/iommu_group`, `../../../kernel/iommu_groups/${group}`)
      this.link(`sys/kernel/iommu_groups/${group}/devices/${addr}`, `../../../../devices/pci0000:00/${addr}`)
    }
    return this
  }

  /** Registers a PCI function as an mdev parent offering `[id, name, available, description]`. */
  mdevParent(addr, types) {
    const d = HostTree.pciDir(addr)
    this.link(`sys/class/mdev_bus/${addr}`, `../../devices/pci0000:00/${addr}`)
    for (const [id, name, available, description] of types) {
      const t = `${d}/mdev_supported_types/${id}`
      this.mkdir(`${t}/devices`)
      this.file(`${t}/name`, `${name}\n`)
      this.file(`${t}/available_instances`, `${available}\n`)
      this.file(`${t}/device_api`, 'vfio-pci\n')
      if (description) this.file(`${t}/description`, `${description}\n`)
      this.file(`${t}/create`, '')
    }
    return this
  }

  mdevInstance(uuid, addr, typeId) {
    const d = HostTree.pciDir(addr)
    const i = `${d}/${uuid}`
    this.mkdir(i)
    this.link(`${i}/mdev_type`, `../mdev_supported_types/${typeId}`)
    this.file(`${i}/remove`, '')
    this.link(`sys/bus/mdev/devices/${uuid}`, `../../../devices/pci0000:00/${addr}/${uuid}`)
    this.link(`${d}/mdev_supported_types/${typeId}/devices/${uuid}`, `../../../${uuid}`)
    return this
  }
}

const T4_TYPES = [
  ['nvidia-222', 'GRID T4-1B', 16, 'num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16'],
  ['nvidia-230', 'GRID T4-8Q', 2, 'num_heads=4, frl_config=60, framebuffer=8192M, max_resolution=7680x4320, max_instance=2'],
  ['nvidia-231', 'GRID T4-16Q', 1, 'num_heads=4, frl_config=60, framebuffer=16384M, max_resolution=7680x4320, max_instance=1'],
  ['nvidia-234', 'GRID T4-4C', 4, 'num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2160, max_instance=4'],
]

/** A host with an NVIDIA T4 sharing vGPUs through mdev and an AMD GPU free for passthrough. */
export function twoGpuHost() {
  const tree = HostTree.temp()
  tree.pci('0000:3b:00.0', {
    vendor: 0x10de, device: 0x1eb8, cls: 0x030200, driver: 'nvidia', group: 10, numa: 0,
    link: [16, 16, '8.0 GT/s PCIe', '8.0 GT/s PCIe'],
  })
  tree.mdevParent('0000:3b:00.0', T4_TYPES)
  tree.pci('0000:af:00.0', {
    vendor: 0x1002, device: 0x744c, cls: 0x030000, driver: 'amdgpu', group: 30, numa: 1,
    link: [16, 16, '16.0 GT/s PCIe', '16.0 GT/s PCIe'],
  })
  return tree
}
