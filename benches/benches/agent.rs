//! Node agent benchmarks: `cargo bench --bench agent`.
//!
//! - `agent/get_topology_8gpu_h200`: one `GET /v1/topology` on a kept-alive loopback TCP
//!   connection, served from the agent's cached topology of the 8-GPU H200 host (vendor-VFIO,
//!   16 VFs per GPU, the tree of the discover bench).
//! - `agent/get_topology_8gpu_h200_gzip`, `..._not_modified`: the same with `Accept-Encoding:
//!   gzip` (the body compressed once per revision), and with `If-None-Match` naming the current
//!   revision's tag (`304`, no body).
//! - `agent/create_remove_mdev`: a `POST /v1/vgpus` and its `DELETE` over the unix socket on the
//!   public fake kernel (the sample mbochs driver), promises written to disk each time.
//! - `agent/render_topology_8gpu_h200`: rendering the H200 host's topology document once for a
//!   new revision (its tag and its gzip form).
//! - `agent/resync_8gpu_h200`: one resync (`Agent::refresh`: the whole host read again, graded,
//!   and compared with the served snapshot) of the 8-GPU H200 host, unchanged.
//! - `agent/uevent_parse`: parsing one kernel `bind` uevent.
//!
//! With `GPUSLICE_BENCH_AGENT_LOAD=1` the bench instead starts the agent on the H200 tree in a
//! child process, sends 10,000 `GET /v1/topology` from 32 concurrent loopback clients, prints
//! p50/p99/max, again with gzip and with `If-None-Match`, then the child's resident memory
//! (VmRSS, VmHWM), and exits. Each variant runs twice: from 32 kept-alive connections driven by
//! one client thread (as `wrk -t1 -c32` or `oha -c 32` load a server: the client's own thread
//! scheduling stays out of the figures), and from 32 client threads with one blocking
//! connection each (on a 2-core machine the latency then includes waiting for a core among 34
//! runnable threads).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use gpu_agent::{Access, Agent, AgentConfig, Listener};
use gpu_sysfs::testing::{FakeKernel, TreeBuilder};

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("agent bench: {what}: {e}");
    std::process::exit(1)
}

/// The 8-GPU H200 host (vendor-specific VFIO, 16 VFs per GPU, all free) under `at`
/// ([`gpu_sysfs::testing::fixtures::h200_host_into`]).
fn h200_host(at: &Path) {
    let mut b = TreeBuilder::at(at);
    gpu_sysfs::testing::fixtures::h200_host_into(&mut b, &[]);
    if let Err(e) = b.finish().map(|t| t.keep()) {
        fail("building the tree", e);
    }
}

/// Serves `host` on loopback TCP (GET-only) and a unix socket in `dir`, on a background runtime.
fn serve(host: Arc<dyn gpu_sysfs::Host>, dir: &Path) -> (String, PathBuf) {
    let mut config = AgentConfig::new("bench");
    config.state_dir = Some(dir.join("state"));
    let agent = Agent::open(host, config).unwrap_or_else(|e| fail("opening the agent", e));
    let sock = dir.join("agent.sock");
    let (tx, rx) = std::sync::mpsc::channel();
    let s = sock.clone();
    std::thread::spawn(move || {
        // The runtime `gpuslice agent` runs on.
        let rt = gpu_agent::runtime().unwrap_or_else(|e| fail("runtime", e));
        rt.block_on(async move {
            let tcp = Listener::bind_tcp(
                "127.0.0.1:0",
                Access {
                    token: None,
                    read_only: true,
                },
            )
            .unwrap_or_else(|e| fail("tcp", e));
            let unix = Listener::bind_unix(&s, None).unwrap_or_else(|e| fail("unix", e));
            let _ = tx.send(tcp.address());
            let _ = gpu_agent::serve(agent, vec![tcp, unix], std::future::pending()).await;
        });
    });
    let addr = rx.recv().unwrap_or_else(|e| fail("starting", e));
    (addr.trim_start_matches("tcp:").to_owned(), sock)
}

/// What the client keeps of an answer's head: status, `Content-Length`, `ETag`.
#[derive(Default)]
struct Head {
    status: u16,
    len: usize,
    etag: String,
}

impl Head {
    /// Takes one line of the head; false at the blank line that ends it.
    fn take(&mut self, line: &str) -> bool {
        let l = line.trim_end();
        if l.is_empty() {
            return false;
        }
        let lower = l.to_ascii_lowercase();
        if self.status == 0 {
            self.status = l
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        } else if let Some(v) = lower.strip_prefix("content-length:") {
            self.len = v.trim().parse().unwrap_or(0);
        } else if lower.starts_with("etag:") {
            self.etag = l[5..].trim().to_owned();
        }
        true
    }
}

/// A kept-alive HTTP/1.1 connection that reads answers by Content-Length.
struct Client<S: std::io::Read + std::io::Write> {
    r: BufReader<S>,
}

impl<S: std::io::Read + std::io::Write> Client<S> {
    fn call(&mut self, method: &str, path: &str, body: &str) -> (u16, usize) {
        let (status, len, _) = self.call_with(method, path, body, "");
        (status, len)
    }

    /// A request with `extra` header lines; the answer's status, body length and `ETag`.
    fn call_with(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
        extra: &str,
    ) -> (u16, usize, String) {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: a\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if let Err(e) = self.r.get_mut().write_all(req.as_bytes()) {
            fail("sending", e);
        }
        let mut head = Head::default();
        let mut line = String::new();
        loop {
            line.clear();
            match self.r.read_line(&mut line) {
                Ok(0) => fail("reading", "connection closed"),
                Ok(_) => {}
                Err(e) => fail("reading", e),
            }
            if !head.take(&line) {
                break;
            }
        }
        let Head { status, len, etag } = head;
        let mut buf = vec![0; len];
        if let Err(e) = self.r.read_exact(&mut buf) {
            fail("reading the body", e);
        }
        (status, len, etag)
    }
}

fn tcp_client(addr: &str) -> Client<TcpStream> {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| fail("connecting", e));
    let _ = s.set_nodelay(true);
    Client {
        r: BufReader::new(s),
    }
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The load run: the agent in a child process (this binary with GPUSLICE_BENCH_AGENT_SERVE).
fn load() {
    let dir = tempfile_dir();
    let root = dir.join("root");
    h200_host(&root);
    let exe = std::env::current_exe().unwrap_or_else(|e| fail("current_exe", e));
    let mut child = std::process::Command::new(exe)
        .env("GPUSLICE_BENCH_AGENT_SERVE", &dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail("spawning the agent", e));
    let mut out = BufReader::new(
        child
            .stdout
            .take()
            .unwrap_or_else(|| fail("stdout", "none")),
    );
    let mut addr = String::new();
    if let Err(e) = out.read_line(&mut addr) {
        fail("reading the address", e);
    }
    let addr = addr.trim().to_owned();
    let (_, size, etag) = tcp_client(&addr).call_with("GET", "/v1/topology", "", "");
    let (_, gz_size, _) =
        tcp_client(&addr).call_with("GET", "/v1/topology", "", "Accept-Encoding: gzip\r\n");
    let variants = [
        ("plain JSON", String::new(), 200, size),
        ("gzip", "Accept-Encoding: gzip\r\n".to_owned(), 200, gz_size),
        (
            "If-None-Match (304)",
            format!("If-None-Match: {etag}\r\n"),
            304,
            0,
        ),
    ];
    // GPUSLICE_BENCH_AGENT_LOAD=304 (or =gzip, =plain) runs that read only, e.g. under a profiler.
    let only = std::env::var("GPUSLICE_BENCH_AGENT_LOAD").unwrap_or_default();
    let picked = |what: &str| match only.as_str() {
        "304" => what.contains("304"),
        "gzip" => what == "gzip",
        "plain" => what == "plain JSON",
        _ => true,
    };
    for (what, extra, want, bytes) in variants.iter().filter(|v| picked(v.0)) {
        load_run_async(&addr, what, extra, *want, *bytes);
    }
    for (what, extra, want, bytes) in variants.iter().filter(|v| picked(v.0)) {
        load_run(&addr, what, extra, *want, *bytes);
    }
    let (rss, hwm) = rss_kib(child.id());
    println!("agent RSS after the runs: {rss} KiB (peak {hwm} KiB)");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// 10,000 `GET /v1/topology` with `extra` headers over 32 concurrent kept-alive connections,
/// all driven by one client thread (a current-thread tokio runtime); prints p50/p99/max.
fn load_run_async(addr: &str, what: &str, extra: &str, want: u16, bytes: usize) {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail("client runtime", e));
    let req = format!("GET /v1/topology HTTP/1.1\r\nHost: a\r\n{extra}Content-Length: 0\r\n\r\n");
    let (all, wall) = rt.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..32 {
            let s = tokio::net::TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| fail("connecting", e));
            let _ = s.set_nodelay(true);
            conns.push(tokio::io::BufReader::new(s));
        }
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (i, mut c) in conns.into_iter().enumerate() {
            let per = 312 + usize::from(i < 16);
            let req = req.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per);
                let mut line = String::new();
                let mut body = Vec::new();
                for _ in 0..per {
                    let t = Instant::now();
                    if let Err(e) = c.get_mut().write_all(req.as_bytes()).await {
                        fail("sending", e);
                    }
                    let mut head = Head::default();
                    loop {
                        line.clear();
                        match c.read_line(&mut line).await {
                            Ok(0) => fail("reading", "connection closed"),
                            Ok(_) => {}
                            Err(e) => fail("reading", e),
                        }
                        if !head.take(&line) {
                            break;
                        }
                    }
                    let Head { status, len, .. } = head;
                    body.resize(len, 0);
                    if let Err(e) = c.read_exact(&mut body).await {
                        fail("reading the body", e);
                    }
                    lat.push(t.elapsed());
                    if status != want {
                        fail("GET /v1/topology", status);
                    }
                }
                lat
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap_or_default());
        }
        (all, t0.elapsed())
    });
    report(
        what,
        bytes,
        "32 connections on one client thread",
        all,
        wall,
    );
}

/// Sorts `all` and prints its count, p50, p99 and max.
fn report(what: &str, bytes: usize, clients: &str, mut all: Vec<Duration>, wall: Duration) {
    all.sort_unstable();
    if all.is_empty() {
        fail("load run", "no answers");
    }
    let pct = |p: f64| all[((all.len() as f64 - 1.0) * p) as usize];
    println!(
        "GET /v1/topology (8-GPU H200), {what}, {bytes} bytes a body: {} requests from {clients} in {:.2?}: p50 {:.3?} p99 {:.3?} max {:.3?}",
        all.len(),
        wall,
        pct(0.5),
        pct(0.99),
        all.last().copied().unwrap_or_default(),
    );
}

/// 10,000 `GET /v1/topology` with `extra` headers from 32 client threads, one blocking
/// connection each; prints p50/p99/max.
fn load_run(addr: &str, what: &str, extra: &str, want: u16, bytes: usize) {
    let mut threads = Vec::new();
    let t0 = Instant::now();
    for i in 0..32 {
        // 10,000 requests in all: 16 clients send 313, 16 send 312.
        let per = 312 + usize::from(i < 16);
        let addr = addr.to_owned();
        let extra = extra.to_owned();
        threads.push(std::thread::spawn(move || {
            let mut c = tcp_client(&addr);
            let mut lat = Vec::with_capacity(per + 1);
            for _ in 0..per {
                let t = Instant::now();
                let (status, _, _) = c.call_with("GET", "/v1/topology", "", &extra);
                lat.push(t.elapsed());
                if status != want {
                    fail("GET /v1/topology", status);
                }
            }
            lat
        }));
    }
    let all: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect();
    report(what, bytes, "32 client threads", all, t0.elapsed());
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-agent-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&d) {
        fail("tempdir", e);
    }
    d
}

fn bench(c: &mut Criterion) {
    if std::env::var_os("GPUSLICE_BENCH_AGENT_SERVE").is_some()
        || std::env::var_os("GPUSLICE_BENCH_AGENT_LOAD").is_some()
    {
        return;
    }
    let dir = tempfile_dir();
    let root = dir.join("h200");
    h200_host(&root);
    let host = gpu_sysfs::RealHost::new(&root).unwrap_or_else(|e| fail("host", e));
    let (addr, _) = serve(Arc::new(host), &dir.join("h200-agent"));
    let mut client = tcp_client(&addr);
    c.bench_function("agent/get_topology_8gpu_h200", |b| {
        b.iter(|| client.call("GET", "/v1/topology", ""))
    });
    c.bench_function("agent/get_topology_8gpu_h200_gzip", |b| {
        b.iter(|| client.call_with("GET", "/v1/topology", "", "Accept-Encoding: gzip\r\n"))
    });
    let etag = client.call_with("GET", "/v1/topology", "", "").2;
    let inm = format!("If-None-Match: {etag}\r\n");
    c.bench_function("agent/get_topology_8gpu_h200_not_modified", |b| {
        b.iter(|| client.call_with("GET", "/v1/topology", "", &inm))
    });

    let host = gpu_sysfs::RealHost::new(&root).unwrap_or_else(|e| fail("host", e));
    let mut config = AgentConfig::new("bench");
    config.state_dir = Some(dir.join("resync-state"));
    let agent = Agent::open(Arc::new(host), config).unwrap_or_else(|e| fail("opening", e));
    let text = agent.snapshot().topology_doc().text().to_owned();
    c.bench_function("agent/render_topology_8gpu_h200", |b| {
        b.iter(|| gpu_agent::doc::Rendered::new(text.clone(), 1))
    });
    c.bench_function("agent/resync_8gpu_h200", |b| {
        b.iter(|| agent.refresh().unwrap_or_else(|e| fail("resync", e)))
    });
    let msg = b"bind@/devices/pci0000:17/0000:17:00.0/0000:18:00.0\0ACTION=bind\0DEVPATH=/devices/pci0000:17/0000:17:00.0/0000:18:00.0\0SUBSYSTEM=pci\0DRIVER=vfio-pci\0PCI_CLASS=30200\0PCI_ID=10DE:2335\0PCI_SUBSYS_ID=10DE:18BE\0PCI_SLOT_NAME=0000:18:00.0\0MODALIAS=pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00\0SEQNUM=5120\0";
    c.bench_function("agent/uevent_parse", |b| {
        b.iter(|| gpu_agent::Uevent::parse(std::hint::black_box(msg)).is_ok())
    });

    let kernel = FakeKernel::sample_mdev_drivers().unwrap_or_else(|e| fail("fake kernel", e));
    let (_, sock) = serve(Arc::new(kernel), &dir.join("fake-agent"));
    let mut unix = Client {
        r: BufReader::new(
            std::os::unix::net::UnixStream::connect(&sock).unwrap_or_else(|e| fail("unix", e)),
        ),
    };
    let uuid = "6f1a2b3c-0000-4000-8000-00000000b001";
    let body = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{uuid}"}}"#);
    c.bench_function("agent/create_remove_mdev", |b| {
        b.iter(|| {
            let (s1, _) = unix.call("POST", "/v1/vgpus", &body);
            let (s2, _) = unix.call("DELETE", &format!("/v1/vgpus/{uuid}"), "");
            if s1 != 201 || s2 != 200 {
                fail("create/remove", format!("{s1} {s2}"));
            }
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);

fn main() {
    if let Some(dir) = std::env::var_os("GPUSLICE_BENCH_AGENT_SERVE") {
        let dir = PathBuf::from(dir);
        let host = gpu_sysfs::RealHost::new(dir.join("root")).unwrap_or_else(|e| fail("host", e));
        let (addr, _) = serve(Arc::new(host), &dir.join("agent"));
        println!("{addr}");
        let _ = std::io::stdout().flush();
        loop {
            std::thread::park();
        }
    }
    if std::env::var_os("GPUSLICE_BENCH_AGENT_LOAD").is_some() {
        load();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
