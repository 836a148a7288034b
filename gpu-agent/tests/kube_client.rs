//! The Kubernetes client against an API server stand-in on loopback: a kubeconfig is read, the
//! claim comes back as the server sent it, and each failure maps to its `ClaimFetchError`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod apiserver;

use std::time::{Duration, Instant};

use apiserver::ApiServer;
use gpu_agent::claims::{ClaimFetchError, ClaimSource};
use gpu_agent::kube::{ClientOptions, KubeClient, KubeError};
use serde_json::json;

fn claim() -> serde_json::Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "vm-gpu", "namespace": "vms", "uid": "3f1c7a52-0000-4000-8000-000000000001"},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
           "status": {"allocation": {"devices": {"results": [
               {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": "node-a", "device": "gpu-0000-41-00-0"}]}}}})
}

async fn client_for(server: &ApiServer, timeout: Duration) -> KubeClient {
    KubeClient::connect(&ClientOptions {
        kubeconfig: Some(server.kubeconfig()),
        timeout,
        ..ClientOptions::default()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_claim_comes_back_as_the_server_sent_it() {
    let server = ApiServer::start("v1.35.0");
    server.add_claim("vms", "vm-gpu", claim());
    let client = client_for(&server, Duration::from_secs(5)).await;
    let got = ClaimSource::get(&client, "vms", "vm-gpu").await.unwrap();
    assert_eq!(got, claim());
    let asked = server.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(
        asked[0].path,
        "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/vm-gpu"
    );
}

#[tokio::test]
async fn a_missing_claim_is_not_found() {
    let server = ApiServer::start("v1.35.0");
    let client = client_for(&server, Duration::from_secs(5)).await;
    assert_eq!(
        ClaimSource::get(&client, "vms", "gone").await,
        Err(ClaimFetchError::NotFound {
            namespace: "vms".into(),
            name: "gone".into()
        })
    );
}

#[tokio::test]
async fn a_name_that_is_no_claim_name_never_reaches_the_server() {
    let server = ApiServer::start("v1.35.0");
    let client = client_for(&server, Duration::from_secs(5)).await;
    for (ns, name) in [
        ("vms", "../../nodes/x"),
        ("VMS", "a"),
        ("vms", ""),
        ("a/b", "c"),
    ] {
        assert!(
            matches!(
                ClaimSource::get(&client, ns, name).await,
                Err(ClaimFetchError::NotFound { .. })
            ),
            "{ns}/{name}"
        );
    }
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn refused_reads_are_forbidden() {
    let server = ApiServer::start("v1.35.0");
    server.add_claim("vms", "vm-gpu", claim());
    server.fail("GET", "/apis/resource.k8s.io/v1/namespaces/vms", 403, 1);
    let client = client_for(&server, Duration::from_secs(5)).await;
    let got = ClaimSource::get(&client, "vms", "vm-gpu").await;
    assert!(
        matches!(got, Err(ClaimFetchError::Forbidden(ref m)) if m.starts_with("403")),
        "{got:?}"
    );

    // A wrong token: the server answers 401.
    let wrong = KubeClient::connect(&ClientOptions {
        kubeconfig: Some(server.kubeconfig_with_token("not-the-token")),
        timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    })
    .await
    .unwrap();
    let got = ClaimSource::get(&wrong, "vms", "vm-gpu").await;
    assert!(
        matches!(got, Err(ClaimFetchError::Forbidden(ref m)) if m.starts_with("401")),
        "{got:?}"
    );
}

#[tokio::test]
async fn server_errors_and_an_absent_server_are_unavailable_within_the_deadline() {
    let server = ApiServer::start("v1.35.0");
    server.add_claim("vms", "vm-gpu", claim());
    server.fail("GET", "/apis/", 503, 1);
    let client = client_for(&server, Duration::from_secs(2)).await;
    assert!(matches!(
        ClaimSource::get(&client, "vms", "vm-gpu").await,
        Err(ClaimFetchError::Unavailable(_))
    ));
    server.take_down();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    let got = ClaimSource::get(&client, "vms", "vm-gpu").await;
    assert!(
        matches!(got, Err(ClaimFetchError::Unavailable(_))),
        "{got:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    server.bring_up();
    let mut back = None;
    for _ in 0..50 {
        if let Ok(doc) = ClaimSource::get(&client, "vms", "vm-gpu").await {
            back = Some(doc);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(back, Some(claim()));
}

#[tokio::test]
async fn a_server_that_never_answers_is_unavailable_after_the_timeout() {
    // A listener that accepts and says nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    apiserver::write_kubeconfig(&path, &format!("http://{addr}"), apiserver::TOKEN);
    let client = KubeClient::connect(&ClientOptions {
        kubeconfig: Some(path),
        timeout: Duration::from_millis(300),
        ..ClientOptions::default()
    })
    .await
    .unwrap();
    let t = Instant::now();
    let got = ClaimSource::get(&client, "vms", "vm-gpu").await;
    assert!(
        matches!(got, Err(ClaimFetchError::Unavailable(_))),
        "{got:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    drop(listener);
}

#[tokio::test]
async fn an_answer_that_is_no_claim_is_invalid() {
    let server = ApiServer::start("v1.35.0");
    server.add_claim(
        "vms",
        "odd",
        json!({"kind": "ConfigMap", "metadata": {"name": "odd"}}),
    );
    let client = client_for(&server, Duration::from_secs(5)).await;
    assert!(matches!(
        ClaimSource::get(&client, "vms", "odd").await,
        Err(ClaimFetchError::Invalid(_))
    ));
}

#[tokio::test]
async fn a_missing_or_broken_kubeconfig_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err = KubeClient::connect(&ClientOptions {
        kubeconfig: Some(missing.clone()),
        timeout: Duration::from_secs(1),
        ..ClientOptions::default()
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, KubeError::Config(ref m) if m.contains("nope")),
        "{err}"
    );
    let broken = dir.path().join("broken");
    std::fs::write(&broken, "clusters: [: not yaml").unwrap();
    let err = KubeClient::connect(&ClientOptions {
        kubeconfig: Some(broken),
        timeout: Duration::from_secs(1),
        ..ClientOptions::default()
    })
    .await
    .unwrap_err();
    assert!(matches!(err, KubeError::Config(_)), "{err}");
}
