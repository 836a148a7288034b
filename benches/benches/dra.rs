//! The kubelet plugin: `cargo bench --bench dra` (`TMPDIR=/dev/shm` keeps the fake kernel's
//! tree, the claim store and the CDI directory on tmpfs, as `/sys` and `/var/run` are).
//!
//! - `dra/node_prepare_resources_vgpu`: issue 28's figure: one `NodePrepareResources` (v1) for
//!   one A2-4Q vGPU claim over the plugin's unix socket, on the fake kernel (the A2 in the mdev
//!   framework), excluding the kernel's own time. Timed from the client's call to its answer:
//!   the gRPC round trip, the claim read from an in-memory claim source (the API server's
//!   stand-in) and checked, the prepare as one of the agent's writes (writer lock, layout lock,
//!   the claim store's started and completed records, the plan on the agent's snapshot, the
//!   mdev's `create` written, its IOMMU group read back), its CDI spec and KubeVirt metadata
//!   written, and the agent's snapshot read again where the write touched it. Excluded: the
//!   time spent inside the fake kernel's sysfs stores (`Host::write`: here the one `create`
//!   and the kernel's reaction to it, making the instance and recounting every type's
//!   `available_instances`), which on a real host is the kernel's and the NVIDIA driver's.
//!   Every read of sysfs and every state file stays counted. Each timed prepare is followed by
//!   an untimed unprepare, so every one makes the mdev anew. Target: 5 ms median.
//! - `dra/node_prepare_resources_vgpu_with_kernel`: the same prepare, the kernel's time
//!   included (what the kubelet waits for on this fake kernel).
//! - `dra/agent_refresh_a2`: the agent's full read of the same host (discovery and health),
//!   unchanged, alone: the read a prepare does again where its mdev's pool is the whole GPU.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_agent::claims::{BoxFuture, ClaimFetchError, ClaimSource};
use gpu_agent::dra::proto::dra_v1;
use gpu_agent::dra::{DraConfig, DraPlugin};
use gpu_agent::{Agent, AgentConfig};
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::{CommandOutput, Host};
use serde_json::{Value, json};

const UID: &str = "9a8b7c6d-0000-4000-8000-00000000be01";

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("dra bench: {what}: {e}");
    std::process::exit(1)
}

/// The fake kernel, with a clock on its sysfs stores: the kernel's own time, which the issue's
/// figure excludes. Every other call goes straight through.
#[derive(Debug)]
struct KernelClock {
    kernel: FakeKernel,
    store_ns: Arc<AtomicU64>,
}

impl Host for KernelClock {
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        self.kernel.read(path)
    }
    fn read_bounded(&self, path: &str, max: usize) -> std::io::Result<Vec<u8>> {
        self.kernel.read_bounded(path, max)
    }
    fn read_string(&self, path: &str) -> std::io::Result<String> {
        self.kernel.read_string(path)
    }
    fn list(&self, dir: &str) -> std::io::Result<Vec<String>> {
        self.kernel.list(dir)
    }
    fn write(&self, path: &str, data: &[u8]) -> std::io::Result<()> {
        let t = Instant::now();
        let out = self.kernel.write(path, data);
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.store_ns.fetch_add(ns, Ordering::Relaxed);
        out
    }
    fn write_atomic(&self, path: &str, data: &[u8]) -> std::io::Result<()> {
        self.kernel.write_atomic(path, data)
    }
    fn create_dir_all(&self, path: &str) -> std::io::Result<()> {
        self.kernel.create_dir_all(path)
    }
    fn read_link(&self, path: &str) -> std::io::Result<PathBuf> {
        self.kernel.read_link(path)
    }
    fn resolve_link(&self, path: &str) -> std::io::Result<String> {
        self.kernel.resolve_link(path)
    }
    fn canonicalize(&self, path: &str) -> std::io::Result<String> {
        self.kernel.canonicalize(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.kernel.exists(path)
    }
    fn run(
        &self,
        program: &str,
        args: &[String],
        timeout: Duration,
    ) -> std::io::Result<CommandOutput> {
        self.kernel.run(program, args, timeout)
    }
    fn root_dir(&self) -> Option<&Path> {
        self.kernel.root_dir()
    }
}

/// One claim, always the same.
struct OneClaim(Value);

impl ClaimSource for OneClaim {
    fn get<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<Value, ClaimFetchError>> {
        let v = self.0.clone();
        Box::pin(async move { Ok(v) })
    }
}

fn claim() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vm-gpu", "namespace": "default", "uid": UID},
        "status": {"allocation": {"devices": {
            "results": [{"request": "vgpu", "driver": "gpu.gpuslice.dev", "pool": "node-a",
                         "device": "vgpu-0000-08-00-0-4096mi"}],
            "config": [{"source": "FromClaim", "requests": ["vgpu"], "opaque": {
                "driver": "gpu.gpuslice.dev", "parameters": {"profile": "A2-4Q"}}}],
        }}},
    })
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| fail("tempdir", e));
    let store_ns = Arc::new(AtomicU64::new(0));
    let kernel = KernelClock {
        kernel: FakeKernel::a2_mdev_host().unwrap_or_else(|e| fail("fake kernel", e)),
        store_ns: Arc::clone(&store_ns),
    };
    let agent = Agent::open(Arc::new(kernel), AgentConfig::new("node-a"))
        .unwrap_or_else(|e| fail("agent", e.message));
    let config = DraConfig {
        driver: "gpu.gpuslice.dev".into(),
        kubelet_dir: dir.path().join("kubelet"),
        cdi_dir: dir.path().join("cdi"),
    };
    let endpoint: PathBuf = config.endpoint();
    let plugin = DraPlugin::new(agent, Arc::new(OneClaim(claim())), config)
        .unwrap_or_else(|e| fail("plugin", e));
    let agent = Arc::clone(plugin.agent());
    let rt = gpu_agent::runtime().unwrap_or_else(|e| fail("runtime", e));
    let bound = rt
        .block_on(async { gpu_agent::dra::bind(plugin) })
        .unwrap_or_else(|e| fail("bind", e));
    rt.spawn(bound.run(std::future::pending()));
    let path = endpoint.clone();
    let channel = rt
        .block_on(
            tonic::transport::Endpoint::from_static("http://plugin.invalid")
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                })),
        )
        .unwrap_or_else(|e| fail("connect", e));
    let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
    let one = || {
        vec![dra_v1::Claim {
            namespace: "default".into(),
            uid: UID.into(),
            name: "vm-gpu".into(),
        }]
    };
    // The part of every prepare that reads the host again, timed alone.
    c.bench_function("dra/agent_refresh_a2", |b| {
        b.iter(|| {
            agent
                .refresh()
                .unwrap_or_else(|e| fail("refresh", e.message))
        });
    });
    // One timed prepare and one untimed unprepare; the kernel's time inside the prepare.
    let mut prepare_once = || {
        let before = store_ns.load(Ordering::Relaxed);
        let t = Instant::now();
        let out = rt
            .block_on(
                client
                    .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: one() }),
            )
            .unwrap_or_else(|e| fail("prepare", e));
        let took = t.elapsed();
        let kernel = Duration::from_nanos(store_ns.load(Ordering::Relaxed) - before);
        let error = out.into_inner().claims.get(UID).map(|c| c.error.clone());
        if error.as_deref() != Some("") {
            fail("prepare", format!("{error:?}"));
        }
        rt.block_on(
            client
                .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: one() }),
        )
        .unwrap_or_else(|e| fail("unprepare", e));
        (took, kernel)
    };
    c.bench_function("dra/node_prepare_resources_vgpu", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let (took, kernel) = prepare_once();
                    took.saturating_sub(kernel)
                })
                .sum()
        });
    });
    c.bench_function("dra/node_prepare_resources_vgpu_with_kernel", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| prepare_once().0).sum());
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
