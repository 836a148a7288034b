//! Facts mode: writes straight to the kernel's sysfs (no gpuslice) and prints what it answered, as
//! `LAB-FACT <what>: <answer>` lines. This is how `FINDINGS.md` was made: the edge cases a fake
//! kernel must reproduce. Run with `GPUSLICE_LAB_MODES="facts facts-noiommu" lab/run`.

use std::fs::{self, OpenOptions};
use std::io::Write;

use crate::sys::{self, SYS};

fn fact(what: &str, answer: impl std::fmt::Display) {
    println!("\nLAB-FACT {what}: {answer}");
}

/// The errno name of a failed write, or `ok (N bytes)`.
fn write_raw(path: &str, data: &[u8]) -> String {
    let mut f = match OpenOptions::new().write(true).open(path) {
        Ok(f) => f,
        Err(e) => return format!("open failed: {}", errno_name(&e)),
    };
    match f.write(data) {
        Ok(n) => format!("ok ({n} bytes)"),
        Err(e) => errno_name(&e),
    }
}

fn errno_name(e: &std::io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(1) => "EPERM",
        Some(2) => "ENOENT",
        Some(5) => "EIO",
        Some(16) => "EBUSY",
        Some(17) => "EEXIST",
        Some(19) => "ENODEV",
        Some(22) => "EINVAL",
        Some(28) => "ENOSPC",
        Some(34) => "ERANGE",
        Some(87) => "EUSERS",
        Some(95) => "EOPNOTSUPP",
        _ => "other",
    };
    format!("{name} ({e})")
}

fn create_path(parent: &str, ty: &str) -> String {
    format!("{SYS}/class/mdev_bus/{parent}/mdev_supported_types/{ty}/create")
}

fn remove_path(uuid: &str) -> String {
    format!("{SYS}/bus/mdev/devices/{uuid}/remove")
}

fn exists(uuid: &str) -> bool {
    fs::symlink_metadata(format!("{SYS}/bus/mdev/devices/{uuid}")).is_ok()
}

fn counts(parent: &str) -> String {
    sys::mdev_types()
        .map(|t| {
            t.get(parent)
                .map(|ts| {
                    ts.iter()
                        .map(|(k, v)| format!("{k}={}", v.available))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        })
        .unwrap_or_else(|e| e)
}

fn links_of(dir: &str) -> String {
    sys::list(dir)
        .iter()
        .map(|n| {
            let p = format!("{dir}/{n}");
            match fs::read_link(&p) {
                Ok(t) => format!("{n}->{}", t.display()),
                Err(_) if fs::metadata(&p).is_ok_and(|m| m.is_dir()) => format!("{n}/"),
                Err(_) => n.clone(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn uuid() -> String {
    sys::new_uuid().unwrap_or_default()
}

/// Runs every probe and prints the facts.
pub fn run(iommu: bool) {
    let groups = sys::list(format!("{SYS}/kernel/iommu_groups"));
    fact("iommu groups at start", groups.join(" "));
    fact(
        "mdev_bus parents",
        links_of(&format!("{SYS}/class/mdev_bus")),
    );
    fact(
        "mbochs parent dir",
        links_of(&format!("{SYS}/class/mdev_bus/mbochs")),
    );

    // Create: accepted spellings.
    let u = uuid();
    let small = create_path("mbochs", "mbochs-small");
    fact(
        "create with trailing newline",
        write_raw(&small, format!("{u}\n").as_bytes()),
    );
    fact(
        "instance dir",
        links_of(&format!("{SYS}/bus/mdev/devices/{u}")),
    );
    fact(
        "bus/mdev/devices link",
        fs::read_link(format!("{SYS}/bus/mdev/devices/{u}"))
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
    );
    fact(
        "type devices/ dir",
        links_of(&format!(
            "{SYS}/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/devices"
        )),
    );
    fact(
        "instance iommu_group",
        fs::read_link(format!("{SYS}/bus/mdev/devices/{u}/iommu_group"))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| e.to_string()),
    );
    fact(
        "iommu groups with one mdev",
        sys::list(format!("{SYS}/kernel/iommu_groups")).join(" "),
    );
    fact(
        "class/iommu (hardware IOMMUs)",
        links_of(&format!("{SYS}/class/iommu")),
    );
    if let Some(g) = sys::link_name(format!("{SYS}/bus/mdev/devices/{u}/iommu_group")) {
        let gd = format!("{SYS}/kernel/iommu_groups/{g}");
        fact("mdev group dir", links_of(&gd));
        fact(
            "mdev group type",
            sys::read(format!("{gd}/type")).unwrap_or_else(|e| e),
        );
        fact(
            "mdev group name",
            sys::read(format!("{gd}/name")).unwrap_or_else(|e| e),
        );
        fact(
            "a PCI group's type",
            sys::read(format!("{SYS}/kernel/iommu_groups/1/type")).unwrap_or_else(|e| e),
        );
        fact("mdev group devices", links_of(&format!("{gd}/devices")));
    }
    fact(
        "vfio-dev of instance",
        links_of(&format!("{SYS}/bus/mdev/devices/{u}/vfio-dev")),
    );
    fact("/dev/vfio with one mdev", sys::list("/dev/vfio").join(" "));
    let v = uuid();
    fact(
        "create with trailing 'x' (37 bytes)",
        write_raw(&small, format!("{v}x").as_bytes()),
    );
    fact("  exists after", exists(&v));
    let w = uuid();
    fact(
        "create with two newlines (38 bytes)",
        write_raw(&small, format!("{w}\n\n").as_bytes()),
    );
    fact("  exists after", exists(&w));
    let up = uuid().to_uppercase();
    fact(
        "create upper-case new uuid",
        write_raw(&small, up.as_bytes()),
    );
    fact(
        "  listed as",
        sys::list(format!("{SYS}/bus/mdev/devices"))
            .into_iter()
            .filter(|n| n.eq_ignore_ascii_case(&up))
            .collect::<Vec<_>>()
            .join(" "),
    );
    let braces = format!("{{{}}}", uuid());
    fact(
        "create {uuid} in braces",
        write_raw(&small, braces.as_bytes()),
    );
    let nohyphen = uuid().replace('-', "");
    fact(
        "create uuid without hyphens",
        write_raw(&small, nohyphen.as_bytes()),
    );
    fact(
        "create leading space",
        write_raw(&small, format!(" {}", &uuid()[..35]).as_bytes()),
    );
    fact("create empty", write_raw(&small, b""));
    fact("counts after creates", counts("mbochs"));

    // Remove: accepted values.
    for val in ["0", "y", "n", "on", "off", "2", "0x1", "1\n"] {
        let x = uuid();
        let c = write_raw(&small, x.as_bytes());
        let r = write_raw(&remove_path(&x), val.as_bytes());
        fact(
            &format!("remove with {val:?}"),
            format!("{r}; create was {c}; still exists: {}", exists(&x)),
        );
        if exists(&x) {
            let _ = write_raw(&remove_path(&x), b"1");
        }
    }

    // Error precedence on a full pool.
    let mut filled = Vec::new();
    loop {
        let x = uuid();
        if !write_raw(&create_path("mbochs", "mbochs-large"), x.as_bytes()).starts_with("ok") {
            break;
        }
        filled.push(x);
    }
    fact("mbochs after filling large", counts("mbochs"));
    fact(
        "full type: duplicate uuid",
        write_raw(&create_path("mbochs", "mbochs-large"), u.as_bytes()),
    );
    fact(
        "full type: malformed uuid",
        write_raw(&create_path("mbochs", "mbochs-large"), b"not-a-uuid"),
    );
    fact(
        "full type: fresh uuid",
        write_raw(&create_path("mbochs", "mbochs-large"), uuid().as_bytes()),
    );
    fact(
        "unknown type dir create",
        write_raw(&create_path("mbochs", "mbochs-huge"), uuid().as_bytes()),
    );
    for x in filled {
        let _ = write_raw(&remove_path(&x), b"1");
    }
    let mut all: Vec<String> = sys::list(format!("{SYS}/bus/mdev/devices"));
    all.retain(|x| x != &u);
    for x in all {
        let _ = write_raw(&remove_path(&x), b"1");
    }
    fact("remove twice (second write)", {
        let _ = write_raw(&remove_path(&u), b"1");
        write_raw(&remove_path(&u), b"1")
    });
    fact(
        "iommu groups after removing all",
        sys::list(format!("{SYS}/kernel/iommu_groups")).join(" "),
    );
    let again = uuid();
    let _ = write_raw(&small, again.as_bytes());
    fact(
        "group of a new mdev after removes",
        fs::read_link(format!("{SYS}/bus/mdev/devices/{again}/iommu_group"))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| e.to_string()),
    );
    let _ = write_raw(&remove_path(&again), b"1");
    fact(
        "counts at end",
        format!(
            "{} | {} | {}",
            counts("mbochs"),
            counts("mtty"),
            counts("mdpy")
        ),
    );

    // PCI binding edge cases on a display device behind the root port.
    let dev = "0000:02:00.0";
    let d = format!("{SYS}/bus/pci/devices/{dev}");
    let drv = || sys::link_name(format!("{d}/driver")).unwrap_or_else(|| "none".into());
    fact("pci: driver at start", drv());
    fact(
        "pci: bind to vfio-pci without override while bound",
        write_raw(
            &format!("{SYS}/bus/pci/drivers/vfio-pci/bind"),
            dev.as_bytes(),
        ),
    );
    fact(
        "pci: unbind from a driver it is not bound to",
        write_raw(
            &format!("{SYS}/bus/pci/drivers/vfio-pci/unbind"),
            dev.as_bytes(),
        ),
    );
    fact(
        "pci: override vfio-pci",
        write_raw(&format!("{d}/driver_override"), b"vfio-pci"),
    );
    fact(
        "pci: unbind",
        write_raw(&format!("{d}/driver/unbind"), dev.as_bytes()),
    );
    fact(
        "pci: unbind when unbound",
        write_raw(
            &format!("{SYS}/bus/pci/drivers/bochs-drm/unbind"),
            dev.as_bytes(),
        ),
    );
    fact(
        "pci: bind host driver while override says vfio-pci",
        write_raw(
            &format!("{SYS}/bus/pci/drivers/bochs-drm/bind"),
            dev.as_bytes(),
        ),
    );
    fact(
        "pci: drivers_probe",
        write_raw(&format!("{SYS}/bus/pci/drivers_probe"), dev.as_bytes()),
    );
    fact("pci: driver after probe", drv());
    fact("pci: /dev/vfio", sys::list("/dev/vfio").join(" "));
    if !iommu {
        fact(
            "pci: explicit vfio-pci/bind without IOMMU",
            write_raw(
                &format!("{SYS}/bus/pci/drivers/vfio-pci/bind"),
                dev.as_bytes(),
            ),
        );
        fact("pci: driver after explicit bind", drv());
    }
    fact(
        "pci: drivers_probe of a bound device",
        write_raw(&format!("{SYS}/bus/pci/drivers_probe"), dev.as_bytes()),
    );
    fact(
        "pci: drivers_probe of a bad address",
        write_raw(&format!("{SYS}/bus/pci/drivers_probe"), b"0000:09:00.0"),
    );
    fact(
        "pci: override to a driver that does not exist",
        write_raw(&format!("{d}/driver_override"), b"no-such-driver"),
    );
    fact(
        "pci: override read back",
        sys::read(format!("{d}/driver_override")).unwrap_or_default(),
    );
    fact("pci: override write of 'vfio-pci\\n' reads", {
        let _ = write_raw(&format!("{d}/driver_override"), b"vfio-pci\n");
        sys::read(format!("{d}/driver_override")).unwrap_or_default()
    });
    // Back to the host driver.
    if sys::link_name(format!("{d}/driver")).is_some() {
        let _ = write_raw(&format!("{d}/driver/unbind"), dev.as_bytes());
    }
    let _ = write_raw(&format!("{d}/driver_override"), b"\n");
    fact(
        "pci: drivers_probe after clearing the override",
        write_raw(&format!("{SYS}/bus/pci/drivers_probe"), dev.as_bytes()),
    );
    fact("pci: driver at end", drv());
    fact(
        "pci: boot_vga of 00:02.0",
        sys::read(format!("{SYS}/bus/pci/devices/0000:00:02.0/boot_vga")).unwrap_or_else(|e| e),
    );
    fact(
        "pci: bridge 00:04.0 driver",
        sys::link_name(format!("{SYS}/bus/pci/devices/0000:00:04.0/driver"))
            .unwrap_or_else(|| "none".into()),
    );
    fact(
        "pci: numa_node of 02:00.0",
        sys::read(format!("{d}/numa_node")).unwrap_or_else(|e| e),
    );
}
