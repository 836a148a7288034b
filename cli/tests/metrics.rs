//! `gpuslice metrics`: the exposition parses as Prometheus text, its values follow the inventory,
//! and `--listen` serves it over HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use export_support::*;
use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, MdevUuid, ParentId, VgpuFramework, VgpuTypeId,
};
use prometheus_parse::{Scrape, Value};

/// Parses `text` with a Prometheus text parser and checks what that lenient parser lets through:
/// every sample line parsed, every family has HELP and TYPE gauge, the OpenMetrics `# EOF` ends it.
fn parse_strict(text: &str) -> Scrape {
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let sample_lines = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(
        scrape.samples.len(),
        sample_lines,
        "unparsed sample lines in:\n{text}"
    );
    assert!(text.ends_with("# EOF\n"), "no # EOF terminator");
    for s in &scrape.samples {
        assert!(
            scrape.docs.contains_key(&s.metric),
            "{} has no HELP line",
            s.metric
        );
        assert!(
            text.contains(&format!("# TYPE {} gauge\n", s.metric)),
            "{} has no TYPE line",
            s.metric
        );
        assert!(
            matches!(s.value, Value::Gauge(_)),
            "{} is not a gauge",
            s.metric
        );
        assert!(
            s.metric
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
        );
    }
    scrape
}

fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            Value::Gauge(v) => v,
            _ => f64::NAN,
        })
        .collect();
    assert_eq!(found.len(), 1, "{metric}{labels:?}: {found:?}");
    found[0]
}

fn fleet_with_allocations(dir: &std::path::Path) -> std::path::PathBuf {
    let mut f = fleet(vec![h200_node("h200-a", 3), mixed_node("ws-1")]);
    let h200: gpu_core::PciAddress = "0000:18:00.0".parse().unwrap();
    let vgpu = |machine: &str| AllocatedDevice::Vgpu {
        request: "gpu".into(),
        index: 0,
        parent: ParentId::Pci("0000:18:00.4".parse().unwrap()),
        gpu: Some(h200),
        framework: VgpuFramework::VendorVfio,
        profile: VgpuTypeId::from_str_unchecked("1424"),
        profile_name: "NVIDIA H200X-18C".into(),
        framebuffer_mib: Some(18432),
        mig_slices: None,
        uuid: MdevUuid::for_machine(machine, "gpu", 0),
        gpu_instance_start: None,
        placement_id: None,
    };
    f.allocations = vec![
        Allocation {
            machine: "vm-pending".into(),
            node: "h200-a".into(),
            status: AllocationStatus::Pending,
            devices: vec![vgpu("vm-pending")],
        },
        Allocation {
            machine: "vm-created".into(),
            node: "h200-a".into(),
            status: AllocationStatus::Created,
            devices: vec![vgpu("vm-created")],
        },
        Allocation {
            machine: "vm-whole".into(),
            node: "ws-1".into(),
            status: AllocationStatus::Pending,
            devices: vec![AllocatedDevice::Gpu {
                request: "gpu".into(),
                name: "nvidia0".into(),
                address: "0000:17:00.0".parse().unwrap(),
                functions: vec![],
                memory_mib: None,
            }],
        },
    ];
    write_fleet(dir, "fleet.json", &f)
}

#[test]
fn fleet_metrics_count_memory_health_profiles_and_pending_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let f = fleet_with_allocations(dir.path());
    let text = ok(&["metrics", "--inventory", f.to_str().unwrap()]);
    golden("metrics", "modelled-fleet.txt", &text);
    let s = parse_strict(&text);
    let vram = "gpuslice_gpu_vram_mib";
    assert_eq!(
        value(&s, vram, &[("node", "h200-a"), ("state", "total")]),
        3.0 * 144_384.0
    );
    // Neither vGPU is in the node's snapshot yet: the pending and the created one both count
    // (once the snapshot shows an instance, by UUID or by the VF's type, it is not counted twice).
    assert_eq!(
        value(&s, vram, &[("node", "h200-a"), ("state", "allocated")]),
        2.0 * 18432.0
    );
    // Ada 48 GB + blocked T4 15 GB + T4 15 GB (the AMD GPU's memory is unknown).
    assert_eq!(
        value(&s, vram, &[("node", "ws-1"), ("state", "total")]),
        79_872.0
    );
    // The T4's foreign 2 GB vGPU plus the pending whole Ada.
    assert_eq!(
        value(&s, vram, &[("node", "ws-1"), ("state", "allocated")]),
        51_200.0
    );

    let dev = "gpuslice_gpu_devices";
    for (health, n) in [
        ("Healthy", 1.0),
        ("Degraded", 1.0),
        ("Unhealthy", 1.0),
        ("Unknown", 0.0),
    ] {
        assert_eq!(
            value(&s, dev, &[("node", "h200-a"), ("health", health)]),
            n,
            "{health}"
        );
    }
    assert_eq!(
        value(&s, dev, &[("node", "ws-1"), ("health", "Unknown")]),
        1.0
    );

    let avail = "gpuslice_vgpu_available_instances";
    assert_eq!(
        value(
            &s,
            avail,
            &[
                ("node", "h200-a"),
                ("parent", "0000:18:00.4"),
                ("profile", "H200X-1-18C")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_gpu_state",
            &[
                ("node", "ws-1"),
                ("address", "0000:5e:00.0"),
                ("state", "blocked")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_vgpu_pool_framebuffer_mib",
            &[
                ("node", "ws-1"),
                ("pool", "0000:af:00.0"),
                ("state", "used")
            ]
        ),
        2048.0
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_vgpu_pool_mig_slices",
            &[
                ("node", "h200-a"),
                ("pool", "0000:18:00.0"),
                ("state", "total")
            ]
        ),
        7.0
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_allocations",
            &[("node", "h200-a"), ("status", "pending")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_allocations",
            &[("node", "h200-a"), ("status", "created")]
        ),
        1.0
    );
    assert_eq!(
        value(&s, "gpuslice_allocation_vram_mib", &[("node", "ws-1")]),
        49_152.0
    );
}

#[test]
fn a2_capture_metrics_show_the_pool_capped_availability() {
    let a2 = a2_root();
    let text = ok(&[
        "--root",
        a2.path().to_str().unwrap(),
        "--node",
        "a2-host",
        "metrics",
    ]);
    golden("metrics", "a2-capture.txt", &text);
    let s = parse_strict(&text);
    let avail = "gpuslice_vgpu_available_instances";
    // Every free VF reports one, but the pool caps the card at one more 4 GB vGPU; a free VF
    // offers it, a 2 GB type is locked out.
    assert_eq!(
        value(
            &s,
            avail,
            &[("parent", "0000:08:01.7"), ("profile", "A2-4Q")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            avail,
            &[("parent", "0000:08:01.7"), ("profile", "A2-2Q")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_vgpu_pool_framebuffer_mib",
            &[("pool", "0000:08:00.0"), ("state", "used")]
        ),
        12288.0
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_vram_mib", &[("state", "allocated")]),
        12288.0
    );
}

#[test]
fn the_per_gpu_free_instances_add_up_where_the_per_parent_ones_do_not() {
    let a2 = a2_root();
    let text = ok(&[
        "--root",
        a2.path().to_str().unwrap(),
        "--node",
        "a2-host",
        "metrics",
    ]);
    let s = parse_strict(&text);
    // Thirteen free VFs each say "one more 4 GB vGPU": summed per parent that is 13 ...
    let per_parent: f64 = s
        .samples
        .iter()
        .filter(|x| {
            x.metric == "gpuslice_vgpu_available_instances"
                && x.labels.get("profile") == Some("A2-4Q")
        })
        .map(|x| match x.value {
            Value::Gauge(v) => v,
            _ => 0.0,
        })
        .sum();
    assert_eq!(per_parent, 13.0);
    // ... while the card holds one more, which the per-GPU series says and a dashboard can sum.
    assert_eq!(
        value(
            &s,
            "gpuslice_gpu_vgpu_available_instances",
            &[
                ("node", "a2-host"),
                ("gpu", "nvidia0"),
                ("profile", "A2-4Q")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_gpu_vgpu_available_instances",
            &[("gpu", "nvidia0"), ("profile", "A2-2Q")]
        ),
        0.0
    );
    let help = &s.docs["gpuslice_vgpu_available_instances"];
    assert!(help.contains("do not add up"), "{help}");
}

#[test]
fn a_missing_fleet_file_is_an_error_naming_it() {
    let out = run(&["metrics", "--inventory", "/nonexistent/fleet.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/fleet.yaml"));
}

fn http(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn listen_serves_the_same_exposition_at_metrics_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let f = fleet_with_allocations(dir.path());
    let mut child = bin()
        .args([
            "metrics",
            "--inventory",
            f.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--max-requests",
            "4",
        ])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("gpuslice: serving metrics at http://")
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("unexpected banner {line:?}"))
        .to_owned();

    let answer = http(&addr, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("Content-Type: application/openmetrics-text; version=1.0.0"));
    assert!(head.contains(&format!("Content-Length: {}", body.len())));
    assert_eq!(body, ok(&["metrics", "--inventory", f.to_str().unwrap()]));
    parse_strict(body);

    let answer = http(&addr, "GET /other HTTP/1.1\r\nHost: test\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 404 Not Found"), "{answer}");
    let answer = http(
        &addr,
        "POST /metrics HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");

    // The fleet file is read on every scrape: a broken inventory is a 500 naming it.
    std::fs::remove_file(&f).unwrap();
    let answer = http(&addr, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 500"), "{answer}");
    assert!(answer.contains("cannot read fleet file"), "{answer}");

    // Four requests answered: the server exits on its own.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success());
            break;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("metrics server did not exit after --max-requests");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
