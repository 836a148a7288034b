//! An agent started in-process on a fake kernel, served on a unix socket in a temporary
//! directory, and a minimal HTTP/1.1 client for it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpu_agent::{Agent, AgentConfig, Listener};
use gpu_sysfs::testing::FakeKernel;

/// Adds `0000:01:00.0`, an NVIDIA GPU alone in IOMMU group 1 on `nvidia` at x16 of x16, with
/// three fatal AER errors ([`FATAL_AER`]): graded Unhealthy.
pub fn unhealthy_gpu(
    b: &mut gpu_sysfs::testing::TreeBuilder,
) -> &mut gpu_sysfs::testing::TreeBuilder {
    b.pci(
        "0000:01:00.0",
        gpu_sysfs::testing::PciSpec::new(0x10de, 0x2204, 0x030000)
            .driver("nvidia")
            .group(1)
            .link(16, 16, "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
    )
    .attr("0000:01:00.0", "aer_dev_fatal", FATAL_AER)
}

/// A GPU's `aer_dev_fatal` with three fatal errors: graded Unhealthy.
pub const FATAL_AER: &str = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\n\
UnxCmplt 0\nRxOF 0\nMalfTLP 3\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL 3\n";

pub struct Running {
    pub socket: PathBuf,
    pub agent: Arc<Agent>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Running {
    pub fn stop(mut self) {
        self.halt();
    }
    fn halt(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.halt();
    }
}

pub fn start(kernel: Arc<FakeKernel>) -> Running {
    start_with(kernel, |_| {})
}

pub fn start_with(kernel: Arc<FakeKernel>, tune: impl FnOnce(&mut AgentConfig)) -> Running {
    start_watched(kernel, tune, None)
}

/// An agent with its watchers ([`gpu_agent::watch::start`]) running next to the server.
pub fn start_watched(
    kernel: Arc<FakeKernel>,
    tune: impl FnOnce(&mut AgentConfig),
    watch: Option<gpu_agent::WatchOptions>,
) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let mut config = AgentConfig::new("node-a");
    config.lock_timeout = std::time::Duration::from_secs(20);
    tune(&mut config);
    let agent = Agent::open(kernel, config).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let a = Arc::clone(&agent);
    let sock = socket.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = Listener::bind_unix(&sock, None).unwrap();
            let watchers = watch.map(|w| {
                gpu_agent::watch::start(&a, w, tokio::runtime::Handle::current()).unwrap()
            });
            ready_tx.send(()).unwrap();
            gpu_agent::serve(a, vec![l], async {
                let _ = rx.await;
            })
            .await
            .unwrap();
            if let Some(w) = watchers {
                w.join(std::time::Duration::from_secs(2));
            }
        });
    });
    ready_rx.recv().unwrap();
    Running {
        socket,
        agent,
        stop: Some(tx),
        thread: Some(thread),
        _dir: dir,
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    pub fn kind(&self) -> String {
        self.json()["error"]["kind"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }
}

pub fn raw(socket: &Path, request: &[u8]) -> Reply {
    let mut s = UnixStream::connect(socket).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    parse(&out)
}

pub fn parse(out: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Reply {
        status,
        headers: head.to_owned(),
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

pub fn request(socket: &Path, method: &str, path: &str, body: Option<&str>) -> Reply {
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    raw(socket, req.as_bytes())
}

pub fn get(socket: &Path, path: &str) -> Reply {
    request(socket, "GET", path, None)
}

/// Waits up to `within` for an event the agent published that `pred` accepts.
pub fn wait_event(
    agent: &Agent,
    within: std::time::Duration,
    pred: impl Fn(&gpu_agent::Event) -> bool,
) -> Option<gpu_agent::Event> {
    let end = std::time::Instant::now() + within;
    loop {
        let (backlog, _) = agent.events().subscribe(0);
        if let Some(e) = backlog.into_iter().find(|e| pred(e)) {
            return Some(e);
        }
        if std::time::Instant::now() >= end {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A gRPC channel to one of the kubelet plugin's unix sockets (the authority is not looked at).
pub async fn plugin_channel(path: PathBuf) -> tonic::transport::Channel {
    gpu_agent::dra::socket::channel(path).await.unwrap()
}
