//! The kubelet plugin: `cargo bench --bench dra`.
//!
//! - `dra/node_prepare_resources_vgpu`: one `NodePrepareResources` (v1) for one A2-4Q vGPU claim
//!   over the plugin's unix socket, on the fake kernel (the A2 in the mdev framework): the claim
//!   read from an in-memory claim source, checked, prepared as one of the agent's writes (writer
//!   lock, layout lock, the claim store's started and completed records, the mdev made, the
//!   agent's snapshot read again) and its CDI spec and KubeVirt metadata written. Each timed
//!   prepare is followed by an untimed unprepare, so every one makes the mdev anew. Target: 5 ms
//!   median.
//! - `dra/agent_refresh_a2`: the agent's read of the same host after a write, alone (part of
//!   every prepare).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_agent::claims::{BoxFuture, ClaimFetchError, ClaimSource};
use gpu_agent::dra::proto::dra_v1;
use gpu_agent::dra::{DraConfig, DraPlugin};
use gpu_agent::{Agent, AgentConfig};
use gpu_sysfs::testing::FakeKernel;
use serde_json::{Value, json};

const UID: &str = "9a8b7c6d-0000-4000-8000-00000000be01";

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("dra bench: {what}: {e}");
    std::process::exit(1)
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
    let kernel = FakeKernel::a2_mdev_host().unwrap_or_else(|e| fail("fake kernel", e));
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
    // Where the time goes: the agent's read of the host after every write (the same for every
    // write route), timed alone.
    c.bench_function("dra/agent_refresh_a2", |b| {
        b.iter(|| {
            agent
                .refresh()
                .unwrap_or_else(|e| fail("refresh", e.message))
        });
    });
    c.bench_function("dra/node_prepare_resources_vgpu", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                let out =
                    rt.block_on(client.node_prepare_resources(
                        dra_v1::NodePrepareResourcesRequest { claims: one() },
                    ))
                    .unwrap_or_else(|e| fail("prepare", e));
                total += t.elapsed();
                let error = out.into_inner().claims.get(UID).map(|c| c.error.clone());
                if error.as_deref() != Some("") {
                    fail("prepare", format!("{error:?}"));
                }
                rt.block_on(client.node_unprepare_resources(
                    dra_v1::NodeUnprepareResourcesRequest { claims: one() },
                ))
                .unwrap_or_else(|e| fail("unprepare", e));
            }
            total
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
