//! Whether a unix socket file is still served: the one probe the agent's own socket and the
//! kubelet plugin's sockets ask before replacing a socket file.
//!
//! The probe never waits on the other process: the connect is non-blocking, so a live process
//! that bound the socket and never accepts (its backlog full) answers at once with `EAGAIN`
//! instead of hanging the caller (and the runtime it runs on); a connect still in progress
//! after [`PROBE_TIMEOUT`] counts as served.

use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;

/// The longest the probe waits for a connect in progress.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What a socket file's probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Nobody listens on it (a socket left by a process that is gone): it may be replaced.
    Stale,
    /// A process accepts connections on it.
    Served,
    /// A process listens on it but does not accept: its backlog is full (or the connect did not
    /// finish within the deadline).
    NotAccepting,
}

impl Liveness {
    /// Whether another process holds the socket.
    pub fn is_held(self) -> bool {
        !matches!(self, Liveness::Stale)
    }

    /// What was found, for a refusal: `another process is serving this socket` or
    /// `another process holds this socket and does not accept connections (backlog full)`.
    pub fn describe(self) -> &'static str {
        match self {
            Liveness::Stale => "nobody serves this socket",
            Liveness::Served => "another process is serving this socket",
            Liveness::NotAccepting => {
                "another process holds this socket and does not accept connections (its backlog is full)"
            }
        }
    }
}

/// Probes the socket at `path` with a non-blocking connect, waiting at most `deadline` for a
/// connect in progress. Never blocks longer; never reads or writes the connection.
///
/// # Errors
/// The probe socket cannot be made; `path` is too long for a socket address.
pub fn probe(path: &Path, deadline: Duration) -> io::Result<Liveness> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let addr = UnixAddr::new(path)?;
    match connect(fd.as_raw_fd(), &addr) {
        Ok(()) => Ok(Liveness::Served),
        Err(Errno::EAGAIN) => Ok(Liveness::NotAccepting),
        Err(Errno::ECONNREFUSED | Errno::ENOENT) => Ok(Liveness::Stale),
        Err(Errno::EINPROGRESS) => finish(&fd, deadline),
        Err(e) => Err(e.into()),
    }
}

/// Waits up to `deadline` for a connect in progress on `fd`, then reads its outcome.
fn finish(fd: &std::os::fd::OwnedFd, deadline: Duration) -> io::Result<Liveness> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::socket::{getsockopt, sockopt};
    let ms = u16::try_from(deadline.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(0) => return Ok(Liveness::NotAccepting),
        Ok(_) => {}
        Err(Errno::EINTR) => return Ok(Liveness::NotAccepting),
        Err(e) => return Err(e.into()),
    }
    match getsockopt(fd, sockopt::SocketError)? {
        0 => Ok(Liveness::Served),
        e if e == Errno::ECONNREFUSED as i32 || e == Errno::ENOENT as i32 => Ok(Liveness::Stale),
        e if e == Errno::EAGAIN as i32 => Ok(Liveness::NotAccepting),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_listener_that_never_accepts_with_a_full_backlog_is_held_and_answers_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Fill the backlog: connects that are never accepted.
        let mut queued = Vec::new();
        let t0 = std::time::Instant::now();
        let found = loop {
            let found = probe(&path, PROBE_TIMEOUT).unwrap();
            if found == Liveness::NotAccepting || queued.len() > 10_000 {
                break found;
            }
            assert_eq!(found, Liveness::Served);
            // The probe's own connection went with its socket; queue one that stays.
            let s = nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::Stream,
                nix::sys::socket::SockFlag::SOCK_NONBLOCK,
                None,
            )
            .unwrap();
            let _ = nix::sys::socket::connect(
                s.as_raw_fd(),
                &nix::sys::socket::UnixAddr::new(&path).unwrap(),
            );
            queued.push(s);
        };
        assert_eq!(found, Liveness::NotAccepting);
        assert!(found.is_held());
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        drop(listener);
        assert_eq!(probe(&path, PROBE_TIMEOUT).unwrap(), Liveness::Stale);
    }
}
