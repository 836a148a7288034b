//! Kernel uevents: the messages the kernel sends on its `NETLINK_KOBJECT_UEVENT` socket when a
//! device is added, removed, bound to or unbound from a driver, or changes.
//!
//! A message is `ACTION@DEVPATH` followed by `KEY=VALUE` properties, each closed by a NUL byte
//! (`add@/devices/pci0000:00/0000:00:02.0\0ACTION=add\0DEVPATH=...\0SUBSYSTEM=pci\0...`).
//! [`Uevent::parse`] reads one without ever panicking; [`Uevent::encode`] writes one back.
//! Sources of messages sit behind [`UeventSource`]: the kernel's socket ([`NetlinkSource`]) on a
//! real host, a channel ([`ChannelSource`]) in tests.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::time::Duration;

use gpu_sysfs::discover::Change;
use serde::Serialize;

/// The largest message read from the socket (the kernel's own limit is 8 KiB of environment).
pub const MAX_MESSAGE: usize = 16 * 1024;

/// Why a message is not a uevent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UeventError {
    /// Empty message.
    #[error("the message is empty")]
    Empty,
    /// A message from udevd (`libudev` magic), not from the kernel.
    #[error("the message comes from udevd, not the kernel")]
    Udev,
    /// The header is not `ACTION@DEVPATH`.
    #[error("the header {0:?} is not ACTION@DEVPATH")]
    Header(String),
    /// A property without `=`.
    #[error("the property {0:?} has no '='")]
    Property(String),
    /// The `ACTION` or `DEVPATH` property disagrees with the header.
    #[error("the {key} property {value:?} disagrees with the header")]
    Mismatch {
        /// `ACTION` or `DEVPATH`.
        key: &'static str,
        /// Its value.
        value: String,
    },
}

/// One kernel uevent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Uevent {
    /// `add`, `remove`, `bind`, `unbind`, `change`, `move`, `online`, `offline`.
    pub action: String,
    /// The device's path under `/sys` (`/devices/pci0000:00/0000:00:02.0`).
    pub devpath: String,
    /// The properties, `ACTION` and `DEVPATH` included.
    pub properties: BTreeMap<String, String>,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Uevent {
    /// Parses one message as the kernel sends it.
    ///
    /// # Errors
    /// [`UeventError`] for an empty message, a udevd message, a header without `@`, a property
    /// without `=`, or `ACTION`/`DEVPATH` properties that disagree with the header.
    pub fn parse(msg: &[u8]) -> Result<Self, UeventError> {
        if msg.starts_with(b"libudev\0") {
            return Err(UeventError::Udev);
        }
        let mut fields = msg.split(|b| *b == 0);
        let header = fields.next().unwrap_or_default();
        if header.is_empty() {
            return Err(UeventError::Empty);
        }
        let at = header
            .iter()
            .position(|b| *b == b'@')
            .ok_or_else(|| UeventError::Header(text(header)))?;
        let action = text(&header[..at]);
        let devpath = text(&header[at + 1..]);
        if action.is_empty() || devpath.is_empty() {
            return Err(UeventError::Header(text(header)));
        }
        let mut properties = BTreeMap::new();
        for f in fields {
            if f.is_empty() {
                continue;
            }
            let eq = f
                .iter()
                .position(|b| *b == b'=')
                .ok_or_else(|| UeventError::Property(text(f)))?;
            properties.insert(text(&f[..eq]), text(&f[eq + 1..]));
        }
        for (key, want) in [("ACTION", &action), ("DEVPATH", &devpath)] {
            if let Some(v) = properties.get(key) {
                if v != want {
                    return Err(UeventError::Mismatch {
                        key,
                        value: v.clone(),
                    });
                }
            }
        }
        Ok(Uevent {
            action,
            devpath,
            properties,
        })
    }

    /// The message the kernel would send for this event.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(self.action.as_bytes());
        out.push(b'@');
        out.extend_from_slice(self.devpath.as_bytes());
        out.push(0);
        for (k, v) in &self.properties {
            out.extend_from_slice(k.as_bytes());
            out.push(b'=');
            out.extend_from_slice(v.as_bytes());
            out.push(0);
        }
        out
    }

    /// A property.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.properties.get(key).map(String::as_str)
    }

    /// The subsystem (`pci`, `mdev`, ...).
    pub fn subsystem(&self) -> Option<&str> {
        self.get("SUBSYSTEM")
    }

    /// True for what changes the agent's picture: add, remove, bind, unbind or change of a PCI
    /// device, an mdev instance, or an mdev parent's type directory.
    pub fn is_relevant(&self) -> bool {
        let action = matches!(
            self.action.as_str(),
            "add" | "remove" | "bind" | "unbind" | "change"
        );
        let subsystem = matches!(self.subsystem(), Some("pci" | "mdev" | "vfio"))
            || self.devpath.contains("/mdev_supported_types");
        action && subsystem
    }

    /// What the agent reads again for this event: the mdev parent an instance or type
    /// directory belongs to, the PCI function bound, unbound or changed; everything for a PCI
    /// function added or removed (VFs, a hot-plugged card) or a path it cannot place; nothing
    /// for a VFIO group node (it follows a bind or an mdev already announced).
    pub fn reread(&self) -> Reread {
        let comps: Vec<&str> = self.devpath.split('/').filter(|c| !c.is_empty()).collect();
        if let Some(i) = comps.iter().position(|c| *c == "mdev_supported_types") {
            return match i.checked_sub(1).and_then(|p| comps.get(p)) {
                Some(parent) => Reread::Narrow(Change::MdevParent((*parent).to_owned())),
                None => Reread::Everything,
            };
        }
        match self.subsystem() {
            Some("mdev") if comps.len() >= 2 => {
                Reread::Narrow(Change::MdevParent(comps[comps.len() - 2].to_owned()))
            }
            Some("pci") if matches!(self.action.as_str(), "bind" | "unbind" | "change") => {
                match self.pci_address() {
                    Some(a) => Reread::Narrow(Change::Pci(a)),
                    None => Reread::Everything,
                }
            }
            Some("vfio") => Reread::Nothing,
            _ => Reread::Everything,
        }
    }

    /// The PCI address this event is about (`PCI_SLOT_NAME`, else the last address-like
    /// component of the path), for naming what changed.
    pub fn pci_address(&self) -> Option<gpu_core::PciAddress> {
        if let Some(a) = self.get("PCI_SLOT_NAME").and_then(|s| s.parse().ok()) {
            return Some(a);
        }
        self.devpath
            .rsplit('/')
            .find_map(|c| c.parse::<gpu_core::PciAddress>().ok())
    }
}

/// What a uevent asks the agent to read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reread {
    /// Nothing: the event follows another that says what changed.
    Nothing,
    /// One device, spliced into the cached topology ([`gpu_sysfs::discover::rediscover`]).
    Narrow(Change),
    /// The whole host.
    Everything,
}

/// Where uevent messages come from.
pub trait UeventSource: Send {
    /// The next raw message, waiting at most `timeout`; `Ok(None)` when none came in time.
    ///
    /// # Errors
    /// The source failing (the socket closed); the watcher stops.
    fn next(&mut self, timeout: Duration) -> std::io::Result<Option<Vec<u8>>>;
}

/// The kernel's uevent socket (`NETLINK_KOBJECT_UEVENT`, multicast group 1: kernel events).
#[derive(Debug)]
pub struct NetlinkSource {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl NetlinkSource {
    /// Opens and binds the socket. Needs no privilege to listen.
    ///
    /// # Errors
    /// The socket call failing (no netlink in this network namespace, a seccomp filter).
    pub fn open() -> std::io::Result<Self> {
        use nix::sys::socket::{
            AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, socket,
        };
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkKObjectUEvent,
        )?;
        // A bigger receive buffer: a driver bind sends a burst of events.
        let _ = nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::RcvBuf, &(1 << 20));
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 1))?;
        Ok(NetlinkSource {
            fd,
            buf: vec![0; MAX_MESSAGE],
        })
    }
}

impl UeventSource for NetlinkSource {
    fn next(&mut self, timeout: Duration) -> std::io::Result<Option<Vec<u8>>> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd as _;
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        match nix::sys::socket::recvfrom::<nix::sys::socket::NetlinkAddr>(
            self.fd.as_raw_fd(),
            &mut self.buf,
        ) {
            // Only the kernel (port 0) speaks for the kernel; anything else is dropped.
            Ok((n, Some(from))) if from.pid() == 0 => Ok(Some(self.buf[..n].to_vec())),
            Ok(_) => Ok(None),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => Ok(None),
            // The kernel dropped messages for us: the next resync catches up; go on.
            Err(nix::errno::Errno::ENOBUFS) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// Messages sent through a channel: the fake source of tests and recordings.
#[derive(Debug)]
pub struct ChannelSource {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
}

impl ChannelSource {
    /// A source and the sender that feeds it.
    pub fn new() -> (std::sync::mpsc::Sender<Vec<u8>>, Self) {
        let (tx, rx) = std::sync::mpsc::channel();
        (tx, ChannelSource { rx })
    }
}

impl UeventSource for ChannelSource {
    fn next(&mut self, timeout: Duration) -> std::io::Result<Option<Vec<u8>>> {
        match self.rx.recv_timeout(timeout) {
            Ok(m) => Ok(Some(m)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the uevent channel was closed",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    const BIND: &[u8] = b"bind@/devices/pci0000:00/0000:00:02.0/0000:08:00.0\0ACTION=bind\0DEVPATH=/devices/pci0000:00/0000:00:02.0/0000:08:00.0\0SUBSYSTEM=pci\0DRIVER=vfio-pci\0PCI_SLOT_NAME=0000:08:00.0\0SEQNUM=4242\0";

    #[test]
    fn a_kernel_bind_message_parses_into_its_properties() {
        let e = Uevent::parse(BIND).unwrap();
        assert_eq!(e.action, "bind");
        assert_eq!(e.subsystem(), Some("pci"));
        assert_eq!(e.get("DRIVER"), Some("vfio-pci"));
        assert_eq!(e.pci_address().unwrap().to_string(), "0000:08:00.0");
        assert!(e.is_relevant());
        assert_eq!(Uevent::parse(&e.encode()).unwrap(), e);
    }

    #[test]
    fn malformed_and_udev_messages_are_refused_with_a_reason() {
        assert_eq!(Uevent::parse(b""), Err(UeventError::Empty));
        assert_eq!(Uevent::parse(b"libudev\0xyz"), Err(UeventError::Udev));
        assert!(matches!(
            Uevent::parse(b"noheader\0A=B\0"),
            Err(UeventError::Header(_))
        ));
        assert!(matches!(
            Uevent::parse(b"add@/devices/x\0NOEQUALS\0"),
            Err(UeventError::Property(_))
        ));
        assert!(matches!(
            Uevent::parse(b"add@/devices/x\0ACTION=remove\0"),
            Err(UeventError::Mismatch { key: "ACTION", .. })
        ));
    }

    #[test]
    fn only_device_changes_of_pci_and_mdev_are_relevant() {
        let net = Uevent::parse(b"add@/devices/virtual/net/tap0\0SUBSYSTEM=net\0").unwrap();
        assert!(!net.is_relevant());
        let mdev =
            Uevent::parse(b"remove@/devices/virtual/mtty/mtty/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001\0SUBSYSTEM=mdev\0")
                .unwrap();
        assert!(mdev.is_relevant());
        let online =
            Uevent::parse(b"online@/devices/pci0000:00/0000:00:02.0\0SUBSYSTEM=pci\0").unwrap();
        assert!(!online.is_relevant());
    }

    #[test]
    fn an_mdev_or_a_type_directory_re_reads_its_parent_and_a_bind_its_function() {
        let parse = |m: &[u8]| Uevent::parse(m).unwrap().reread();
        assert_eq!(
            parse(b"add@/devices/virtual/mbochs/mbochs/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001\0SUBSYSTEM=mdev\0"),
            Reread::Narrow(Change::MdevParent("mbochs".into()))
        );
        assert_eq!(
            parse(b"change@/devices/pci0000:00/0000:00:02.0/0000:08:00.4/mdev_supported_types/nvidia-746\0"),
            Reread::Narrow(Change::MdevParent("0000:08:00.4".into()))
        );
        assert_eq!(
            parse(BIND),
            Reread::Narrow(Change::Pci("0000:08:00.0".parse().unwrap()))
        );
        assert_eq!(
            parse(b"add@/devices/pci0000:00/0000:00:02.0/0000:08:00.4\0SUBSYSTEM=pci\0"),
            Reread::Everything
        );
        assert_eq!(
            parse(b"add@/devices/virtual/vfio/12\0SUBSYSTEM=vfio\0"),
            Reread::Nothing
        );
    }

    fn word() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_./:-]{1,24}"
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_are_refused_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Uevent::parse(&bytes);
        }

        #[test]
        fn an_encoded_event_parses_back_to_itself(
            action in "[a-z]{1,8}",
            devpath in "/[a-z0-9:./_-]{1,40}",
            props in proptest::collection::btree_map("[A-Z_]{1,12}", word(), 0..12),
        ) {
            let mut properties: BTreeMap<String, String> = props
                .into_iter()
                .filter(|(k, _)| k != "ACTION" && k != "DEVPATH")
                .collect();
            properties.insert("ACTION".into(), action.clone());
            properties.insert("DEVPATH".into(), devpath.clone());
            let e = Uevent { action, devpath, properties };
            prop_assert_eq!(Uevent::parse(&e.encode()), Ok(e));
        }
    }
}
