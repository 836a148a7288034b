//! Replaying umockdev recordings (`umockdev-record` format) as real directory trees.
//!
//! A recording holds one record per device, records separated by a blank line:
//! `P: /devices/...` starts a record (a path under `/sys`), `E: KEY=value` are uevent properties,
//! `A: name=value` an attribute (C escapes such as `\n`), `H: name=HEX` a binary attribute,
//! `L: name=target` a symlink relative to the device directory, `N:`/`S:` device nodes and their
//! links (not needed here, accepted and skipped). Attribute names may contain `/`
//! (`power/control`, `nvidia/vm_name`).
//!
//! The recorder does not store the kernel's bus and class views, so [`materialize`] derives them
//! as the kernel lays them out: `sys/bus/pci/devices/<bdf>` for records with `SUBSYSTEM=pci`,
//! `sys/bus/mdev/devices/<uuid>` for `SUBSYSTEM=mdev`, `sys/class/mdev_bus/<parent>` for the
//! parent of every mdev and every device with `mdev_supported_types/` attributes,
//! `sys/kernel/iommu_groups/<N>/devices/<dev>` from the `iommu_group` links, and
//! `sys/class/iommu/<unit>` from the `iommu` links.
//!
//! A recording is untrusted input (a user sends one of a problem host): every path and link
//! target must stay inside `sys/` of the new tree, or loading fails with the offending line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::error::SysfsError;
use crate::host::{check_relative, normalize};

/// One device of a recording.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceRecord {
    /// Root-relative directory (`sys/devices/pci0000:00/0000:00:03.0/0000:08:00.0`).
    pub path: String,
    /// 1-based line of its `P:` line.
    pub line: usize,
    /// uevent properties (`SUBSYSTEM`, `DRIVER`, ...), literal values.
    pub properties: Vec<(String, String)>,
    /// Attribute files, unescaped.
    pub attributes: Vec<(String, Vec<u8>)>,
    /// Symlinks: name and target as written (relative to the device directory).
    pub links: Vec<(String, String)>,
}

impl DeviceRecord {
    /// A uevent property's value.
    pub fn property(&self, key: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The device's name (last path component).
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or("")
    }
}

/// A parsed recording.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recording {
    /// Devices in file order.
    pub devices: Vec<DeviceRecord>,
}

/// Decodes the C escapes umockdev writes in `A:` values: `\n \t \r \\ \" \' \a \b \f \v`,
/// `\xHH` and octal `\ooo`.
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file` and `line` for a dangling or unknown escape.
pub fn unescape(value: &str, file: &str, line: usize) -> Result<Vec<u8>, SysfsError> {
    let b = value.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let bad = |why: String| SysfsError::malformed(file, line, why);
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let Some(&c) = b.get(i + 1) else {
            return Err(bad("value ends with a lone backslash".to_owned()));
        };
        i += 2;
        let simple = match c {
            b'n' => Some(b'\n'),
            b't' => Some(b'\t'),
            b'r' => Some(b'\r'),
            b'\\' => Some(b'\\'),
            b'"' => Some(b'"'),
            b'\'' => Some(b'\''),
            b'a' => Some(7),
            b'b' => Some(8),
            b'f' => Some(12),
            b'v' => Some(11),
            _ => None,
        };
        if let Some(v) = simple {
            out.push(v);
            continue;
        }
        match c {
            b'x' => {
                let digits: Vec<u8> = b[i..]
                    .iter()
                    .take(2)
                    .take_while(|d| d.is_ascii_hexdigit())
                    .copied()
                    .collect();
                if digits.is_empty() {
                    return Err(bad("`\\x` without hex digits".to_owned()));
                }
                let s = String::from_utf8_lossy(&digits);
                let v =
                    u8::from_str_radix(&s, 16).map_err(|_| bad(format!("bad escape \\x{s}")))?;
                out.push(v);
                i += digits.len();
            }
            b'0'..=b'7' => {
                let mut v: u32 = u32::from(c - b'0');
                let mut n = 0;
                while n < 2 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + u32::from(b[i] - b'0');
                    i += 1;
                    n += 1;
                }
                let byte = u8::try_from(v)
                    .map_err(|_| bad(format!("octal escape {v:o} is above 0o377")))?;
                out.push(byte);
            }
            other => {
                return Err(bad(format!(
                    "unknown escape `\\{}`",
                    char::from(other).escape_default()
                )));
            }
        }
    }
    Ok(out)
}

/// Escapes bytes the way [`unescape`] reads them (for writing recordings).
pub fn escape(value: &[u8]) -> String {
    let mut s = String::with_capacity(value.len());
    for &b in value {
        match b {
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            b'\r' => s.push_str("\\r"),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(char::from(b)),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s
}

fn decode_hex(text: &str, file: &str, line: usize) -> Result<Vec<u8>, SysfsError> {
    let t = text.trim();
    if t.len() % 2 != 0 {
        return Err(SysfsError::malformed(
            file,
            line,
            "binary attribute has an odd number of hex digits",
        ));
    }
    (0..t.len())
        .step_by(2)
        .map(|i| {
            t.get(i..i + 2)
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| {
                    SysfsError::malformed(file, line, "binary attribute is not hexadecimal")
                })
        })
        .collect()
}

fn check_name(name: &str, what: &str, file: &str, line: usize) -> Result<(), SysfsError> {
    check_relative(name).map_err(|_| {
        SysfsError::malformed(
            file,
            line,
            format!("{what} {name:?} is not a plain relative path"),
        )
    })
}

/// Parses a recording. `file` names it in errors.
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file` and the line: a line outside a record, an unknown line
/// type, a missing `=`, a bad escape or hex value, a path that is not plain (`..`, empty parts).
pub fn parse(text: &str, file: &str) -> Result<Recording, SysfsError> {
    let mut rec = Recording::default();
    let mut cur: Option<DeviceRecord> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim_end_matches('\r');
        if l.trim().is_empty() {
            if let Some(d) = cur.take() {
                rec.devices.push(d);
            }
            continue;
        }
        let bad = |why: String| SysfsError::malformed(file, line, why);
        let (kind, rest) = match (l.get(..1), l.get(1..3)) {
            (Some(k), Some(": ")) => (k, &l[3..]),
            (Some(k), _) if l.len() == 2 && &l[1..] == ":" => (k, ""),
            _ => return Err(bad(format!("expected `X: ...`, got {l:?}"))),
        };
        if kind == "P" {
            if let Some(d) = cur.take() {
                rec.devices.push(d);
            }
            let p = rest.trim().trim_start_matches('/');
            check_name(p, "device path", file, line)?;
            cur = Some(DeviceRecord {
                path: format!("sys/{p}"),
                line,
                ..Default::default()
            });
            continue;
        }
        let Some(dev) = cur.as_mut() else {
            return Err(bad(format!(
                "{kind}: line outside a device record (no `P:` before it)"
            )));
        };
        match kind {
            "E" => {
                let (k, v) = rest
                    .split_once('=')
                    .ok_or_else(|| bad("property without `=`".to_owned()))?;
                dev.properties.push((k.to_owned(), v.to_owned()));
            }
            "A" | "H" | "L" => {
                let (k, v) = rest
                    .split_once('=')
                    .ok_or_else(|| bad(format!("{kind}: line without `=`")))?;
                check_name(k, "name", file, line)?;
                match kind {
                    "A" => dev
                        .attributes
                        .push((k.to_owned(), unescape(v, file, line)?)),
                    "H" => dev
                        .attributes
                        .push((k.to_owned(), decode_hex(v, file, line)?)),
                    _ => {
                        if v.is_empty() || v.starts_with('/') {
                            return Err(bad(format!(
                                "link {k} must have a relative target, got {v:?}"
                            )));
                        }
                        dev.links.push((k.to_owned(), v.to_owned()));
                    }
                }
            }
            "N" | "S" => {}
            other => return Err(bad(format!("unknown line type `{other}:`"))),
        }
    }
    if let Some(d) = cur.take() {
        rec.devices.push(d);
    }
    Ok(rec)
}

/// A materialized recording: a private temporary tree standing for the recorded host's `/`.
/// Removed when dropped.
#[derive(Debug)]
pub struct Replay {
    dir: tempfile::TempDir,
}

impl Replay {
    /// The root directory standing for `/`.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Gives up ownership of the temporary directory.
    pub fn into_tempdir(self) -> tempfile::TempDir {
        self.dir
    }
}

/// Reads a recording file and materializes it into a new temporary directory.
///
/// # Errors
/// [`SysfsError::Io`] when the file cannot be read or the tree written; [`SysfsError::Malformed`]
/// with the line for bad content (see [`parse`] and [`Recording::write_tree`]).
pub fn materialize(recording_path: &Path) -> Result<Replay, SysfsError> {
    let shown = recording_path.display().to_string();
    let text = std::fs::read(recording_path).map_err(|e| SysfsError::io(shown.clone(), e))?;
    let text = String::from_utf8_lossy(&text);
    let rec = parse(&text, &shown)?;
    let dir = tempfile::Builder::new()
        .prefix("gpuslice-replay-")
        .tempdir()
        .map_err(|e| SysfsError::io("temporary directory", e))?;
    rec.write_tree(dir.path(), &shown)?;
    Ok(Replay { dir })
}

fn up_to_root(from_dir: &str) -> String {
    "../".repeat(from_dir.split('/').filter(|p| !p.is_empty()).count())
}

struct Writer<'a> {
    root: &'a Path,
    file: &'a str,
    /// Directories known to exist: a recording has ~10 files per directory, so remembering them
    /// saves most `mkdir` calls.
    made: std::cell::RefCell<std::collections::HashSet<String>>,
}

impl Writer<'_> {
    fn at(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn io(&self, rel: &str, e: std::io::Error) -> SysfsError {
        SysfsError::io(self.at(rel).display().to_string(), e)
    }

    fn mkdir(&self, rel: &str) -> Result<(), SysfsError> {
        if self.made.borrow().contains(rel) {
            return Ok(());
        }
        std::fs::create_dir_all(self.at(rel)).map_err(|e| self.io(rel, e))?;
        self.made.borrow_mut().insert(rel.to_owned());
        Ok(())
    }

    fn parent_of(rel: &str) -> &str {
        rel.rsplit_once('/').map_or("", |(d, _)| d)
    }

    fn write(&self, rel: &str, data: &[u8], line: usize) -> Result<(), SysfsError> {
        self.mkdir(Self::parent_of(rel))?;
        let p = self.at(rel);
        std::fs::write(&p, data).map_err(|e| {
            if std::fs::symlink_metadata(&p).is_ok_and(|m| !m.is_file()) {
                SysfsError::malformed(
                    self.file,
                    line,
                    format!("{rel} is both a directory or link and an attribute"),
                )
            } else {
                self.io(rel, e)
            }
        })
    }

    /// Creates `rel` → `target`; an existing identical link is fine.
    /// Creates a directory whose every component must be a real directory, never a link: a
    /// recorded link must not redirect where the derived views are written.
    fn mkdir_checked(&self, rel: &str, line: usize) -> Result<(), SysfsError> {
        if self.made.borrow().contains(rel) {
            return Ok(());
        }
        let mut prefix = String::new();
        for part in rel.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.made.borrow().contains(&prefix) {
                continue;
            }
            let p = self.at(&prefix);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(SysfsError::malformed(
                        self.file,
                        line,
                        format!("{rel} passes through {prefix}, which is not a directory"),
                    ));
                }
                Err(_) => std::fs::create_dir(&p).map_err(|e| self.io(&prefix, e))?,
            }
            self.made.borrow_mut().insert(prefix.clone());
        }
        Ok(())
    }

    fn link(&self, rel: &str, target: &str, line: usize) -> Result<(), SysfsError> {
        self.mkdir_checked(Self::parent_of(rel), line)?;
        let p = self.at(rel);
        if let Ok(existing) = std::fs::read_link(&p) {
            if existing == Path::new(target) {
                return Ok(());
            }
        }
        if std::fs::symlink_metadata(&p).is_ok() {
            return Err(SysfsError::malformed(
                self.file,
                line,
                format!("{rel} exists already; cannot make it a link to {target}"),
            ));
        }
        std::os::unix::fs::symlink(target, &p).map_err(|e| self.io(rel, e))
    }
}

impl Recording {
    /// Writes the recorded devices and the derived bus, class and IOMMU views under `root`
    /// (an existing directory standing for `/`). `file` names the recording in errors.
    ///
    /// # Errors
    /// [`SysfsError::Malformed`] with the line of a link whose target leaves `sys/` or of a name
    /// that is both a file and a directory; [`SysfsError::Io`] for write failures.
    pub fn write_tree(&self, root: &Path, file: &str) -> Result<(), SysfsError> {
        let w = Writer {
            root,
            file,
            made: Default::default(),
        };
        for d in [
            "sys/devices",
            "sys/bus/pci/devices",
            "sys/bus/pci/drivers",
            "sys/bus/mdev/devices",
            "sys/class/mdev_bus",
            "sys/kernel/iommu_groups",
        ] {
            w.mkdir(d)?;
        }
        for dev in &self.devices {
            w.mkdir(&dev.path)?;
        }
        // Files first, while no recorded link exists that a path could pass through; links and
        // the derived views after, each checked not to pass through a link.
        let mut mdev_parents: BTreeSet<(String, usize)> = BTreeSet::new();
        for dev in &self.devices {
            for (name, value) in &dev.attributes {
                w.write(&format!("{}/{name}", dev.path), value, dev.line)?;
                if name.starts_with("mdev_supported_types/") {
                    mdev_parents.insert((dev.path.clone(), dev.line));
                }
            }
        }
        for dev in &self.devices {
            for (name, target) in &dev.links {
                let at = format!("{}/{name}", dev.path);
                let link_dir = Writer::parent_of(&at);
                let resolved = normalize(&format!("{link_dir}/{target}"))
                    .filter(|r| r.starts_with("sys/"))
                    .ok_or_else(|| {
                        SysfsError::malformed(
                            file,
                            dev.line,
                            format!("link {name} of {} leaves sys/: {target:?}", dev.path),
                        )
                    })?;
                w.link(&at, target, dev.line)?;
                let leaf = name.rsplit('/').next().unwrap_or(name);
                if leaf == "driver" {
                    w.mkdir_checked(&resolved, dev.line)?;
                }
                if leaf == "iommu" {
                    // The IOMMU unit serving the device: the kernel lists units in class/iommu.
                    w.mkdir_checked(&resolved, dev.line)?;
                    let unit = resolved.rsplit('/').next().unwrap_or(&resolved);
                    w.link(
                        &format!("sys/class/iommu/{unit}"),
                        &format!("{}{resolved}", up_to_root("sys/class/iommu")),
                        dev.line,
                    )?;
                }
                if leaf == "iommu_group" {
                    let members = format!("{resolved}/devices");
                    w.mkdir_checked(&members, dev.line)?;
                    w.link(
                        &format!("{members}/{}", dev.name()),
                        &format!("{}{}", up_to_root(&members), dev.path),
                        dev.line,
                    )?;
                }
            }
            let subsystem = dev.property("SUBSYSTEM");
            let bus = match subsystem {
                Some("pci") => Some("sys/bus/pci"),
                Some("mdev") => Some("sys/bus/mdev"),
                _ => None,
            };
            if let Some(bus) = bus {
                let devices = format!("{bus}/devices");
                w.link(
                    &format!("{devices}/{}", dev.name()),
                    &format!("{}{}", up_to_root(&devices), dev.path),
                    dev.line,
                )?;
                if let Some(drv) = dev
                    .property("DRIVER")
                    .filter(|d| check_relative(d).is_ok() && !d.contains('/'))
                {
                    let ddir = format!("{bus}/drivers/{drv}");
                    w.mkdir_checked(&ddir, dev.line)?;
                    w.link(
                        &format!("{ddir}/{}", dev.name()),
                        &format!("{}{}", up_to_root(&ddir), dev.path),
                        dev.line,
                    )?;
                }
            }
            if subsystem == Some("mdev") {
                let parent = Writer::parent_of(&dev.path);
                if parent.starts_with("sys/devices/") {
                    mdev_parents.insert((parent.to_owned(), dev.line));
                }
            }
        }
        for (parent, line) in mdev_parents {
            let name = parent.rsplit('/').next().unwrap_or(&parent);
            w.link(
                &format!("sys/class/mdev_bus/{name}"),
                &format!("{}{parent}", up_to_root("sys/class/mdev_bus")),
                line,
            )?;
        }
        self.check_links_resolve_inside(root, file)
    }

    /// Every recorded link, resolved as the kernel would through the links of the finished tree
    /// (`up/../../..` where `up` is itself a link), must stay inside `sys/`: the text check on
    /// each link alone cannot see a climb through another link.
    fn check_links_resolve_inside(&self, root: &Path, file: &str) -> Result<(), SysfsError> {
        use crate::host::Host;
        let host = crate::host::RealHost::new(root)
            .map_err(|e| SysfsError::io(root.display().to_string(), e))?;
        for dev in &self.devices {
            for (name, target) in &dev.links {
                let at = format!("{}/{name}", dev.path);
                let why = match host.canonicalize(&at) {
                    Ok(r) if r.starts_with("sys/") => continue,
                    Ok(r) => format!("resolves to {r:?}, outside sys/"),
                    Err(e) if crate::confine::is_outside_root(&e) => {
                        "climbs out of the tree through another link".to_owned()
                    }
                    Err(e) => format!("does not resolve: {e}"),
                };
                return Err(SysfsError::malformed(
                    file,
                    dev.line,
                    format!("link {name} of {} ({target:?}) {why}", dev.path),
                ));
            }
        }
        Ok(())
    }

    /// Renders the recording back to text (attribute values escaped, binary ones as `A:` with
    /// escapes, which [`parse`] reads back to the same bytes).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for (i, d) in self.devices.iter().enumerate() {
            if i > 0 {
                s.push('\n');
            }
            s.push_str(&format!("P: /{}\n", d.path.trim_start_matches("sys/")));
            for (k, v) in &d.properties {
                s.push_str(&format!("E: {k}={v}\n"));
            }
            for (k, v) in &d.attributes {
                s.push_str(&format!("A: {k}={}\n", escape(v)));
            }
            for (k, v) in &d.links {
                s.push_str(&format!("L: {k}={v}\n"));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{Host, RealHost};

    const SMALL: &str = "\
P: /devices/pci0000:00/0000:00:03.0/0000:08:00.4/f715f63c-0d00-4007-9c5a-b07b0c6c05de
E: DRIVER=nvidia-vgpu-vfio
E: SUBSYSTEM=mdev
L: iommu_group=../../../../../kernel/iommu_groups/106
L: mdev_type=../mdev_supported_types/nvidia-754
A: nvidia/vm_name=\\n

P: /devices/pci0000:00/0000:00:03.0/0000:08:00.4
E: DRIVER=nvidia
E: SUBSYSTEM=pci
A: class=0x030200\\n
H: config=DE10B625
L: driver=../../../../bus/pci/drivers/nvidia
L: iommu_group=../../../../kernel/iommu_groups/90
L: iommu=../../../virtual/iommu/dmar1
L: physfn=../0000:08:00.0
N: ttyS1
";

    #[test]
    fn parses_records_and_unescapes_values() {
        let r = parse(SMALL, "small.umockdev").unwrap();
        assert_eq!(r.devices.len(), 2);
        let vf = &r.devices[1];
        assert_eq!(vf.path, "sys/devices/pci0000:00/0000:00:03.0/0000:08:00.4");
        assert_eq!(vf.property("SUBSYSTEM"), Some("pci"));
        assert_eq!(
            vf.attributes[0],
            ("class".to_owned(), b"0x030200\n".to_vec())
        );
        assert_eq!(
            vf.attributes[1],
            ("config".to_owned(), vec![0xde, 0x10, 0xb6, 0x25])
        );
        assert_eq!(vf.line, 8);
    }

    #[test]
    fn materializes_devices_and_derives_the_kernel_views() {
        let dir = tempfile::tempdir().unwrap();
        parse(SMALL, "small")
            .unwrap()
            .write_tree(dir.path(), "small")
            .unwrap();
        let h = RealHost::new(dir.path()).unwrap();
        assert_eq!(
            h.read_string("sys/bus/pci/devices/0000:08:00.4/class")
                .unwrap(),
            "0x030200"
        );
        assert_eq!(
            h.list("sys/kernel/iommu_groups/90/devices").unwrap(),
            ["0000:08:00.4"]
        );
        assert_eq!(
            h.resolve_link("sys/kernel/iommu_groups/90/devices/0000:08:00.4")
                .unwrap(),
            "sys/devices/pci0000:00/0000:00:03.0/0000:08:00.4"
        );
        assert_eq!(h.list("sys/class/mdev_bus").unwrap(), ["0000:08:00.4"]);
        assert_eq!(
            h.resolve_link("sys/class/iommu/dmar1").unwrap(),
            "sys/devices/virtual/iommu/dmar1"
        );
        assert_eq!(
            h.list("sys/bus/mdev/devices").unwrap(),
            ["f715f63c-0d00-4007-9c5a-b07b0c6c05de"]
        );
        assert_eq!(
            h.resolve_link("sys/bus/pci/devices/0000:08:00.4/driver")
                .unwrap(),
            "sys/bus/pci/drivers/nvidia"
        );
        assert!(h.exists("sys/bus/pci/drivers/nvidia/0000:08:00.4"));
    }

    #[test]
    fn rejects_paths_and_links_that_leave_the_tree() {
        for (text, line) in [
            ("P: /devices/../../etc\n", 1),
            ("P: /devices/x\nA: ../../passwd=1\n", 2),
            ("P: /devices/x\nL: driver=/etc/passwd\n", 2),
            ("A: class=1\n", 1),
            ("P: /devices/x\nQ: what\n", 2),
            ("P: /devices/x\nA: class\n", 2),
            ("P: /devices/x\nA: class=\\q\n", 2),
            ("P: /devices/x\nH: config=ABC\n", 2),
        ] {
            let e = parse(text, "bad.umockdev").unwrap_err();
            assert!(
                e.to_string().starts_with(&format!("bad.umockdev:{line}: ")),
                "{text:?}: {e}"
            );
        }
        let escaping = parse("P: /devices/x\nL: evil=../../../../etc/passwd\n", "bad").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let e = escaping.write_tree(dir.path(), "bad").unwrap_err();
        assert!(e.to_string().contains("leaves sys/"), "{e}");
    }

    #[test]
    fn links_cannot_redirect_where_later_paths_are_written() {
        // `l1` points back to `sys`; a device recorded "under" it would really sit at
        // sys/devices/z, three levels higher than its path says, so its own lexically harmless
        // link would point outside the tree.
        let text = "P: /devices/a\nL: l1=../..\n\nP: /devices/a/l1/devices/z\nL: evil=../../../../../../tmp\n";
        let rec = parse(text, "evil").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let e = rec.write_tree(dir.path(), "evil").unwrap_err();
        assert!(e.to_string().starts_with("evil:"), "{e}");
    }

    #[test]
    fn a_link_climbing_out_through_an_intermediate_link_is_refused_with_its_line() {
        // Each link alone stays inside sys/ as text; `esc` climbs out through `up`, which is
        // itself a link two levels up.
        let text = "P: /devices/a/b\nL: up=../..\nL: esc=up/../../../outside\n";
        let rec = parse(text, "climb.umockdev").unwrap();
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let e = rec.write_tree(&root, "climb.umockdev").unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("climb.umockdev:1: "), "{msg}");
        assert!(msg.contains("link esc of sys/devices/a/b"), "{msg}");
        assert!(msg.contains("climbs out of the tree"), "{msg}");
    }

    #[test]
    fn escapes_round_trip() {
        for v in [&b"plain"[..], b"a\nb\\c\td", b"\x00\xff\x7f", b""] {
            assert_eq!(unescape(&escape(v), "f", 1).unwrap(), v);
        }
        assert_eq!(unescape("\\101\\x41\\0", "f", 1).unwrap(), b"AA\0");
        assert!(unescape("\\", "f", 1).is_err());
        assert!(unescape("\\777", "f", 1).is_err());
    }
}
