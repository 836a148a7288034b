//! TCP listeners: a bearer token for everything, or GETs only; never writes without a token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read as _, Write as _};
use std::sync::Arc;

use gpu_agent::{Access, Agent, AgentConfig, Listener};
use gpu_sysfs::testing::FakeKernel;

const TOKEN: &[u8] = b"s3cret-token-0123456789";

fn serve(access: Access) -> (String, tokio::sync::oneshot::Sender<()>, tempfile::TempDir) {
    let k = Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::new("node-a");
    config.state_dir = Some(dir.path().join("state"));
    let agent = Agent::open(k, config).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = Listener::bind_tcp("127.0.0.1:0", access).unwrap();
            tx.send(l.address().trim_start_matches("tcp:").to_owned())
                .unwrap();
            gpu_agent::serve(agent, vec![l], async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
    });
    (rx.recv().unwrap(), stop, dir)
}

fn call(addr: &str, method: &str, path: &str, auth: Option<&str>, body: &str) -> support::Reply {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = auth
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    support::parse(&out)
}

#[test]
fn tcp_without_a_token_or_read_only_is_refused() {
    let e = Listener::bind_tcp("127.0.0.1:0", Access::default()).unwrap_err();
    assert!(e.to_string().contains("--token-file"), "{e}");
}

#[test]
fn a_token_listener_answers_only_requests_with_the_token() {
    let (addr, _stop, _dir) = serve(Access {
        token: Some(Arc::from(TOKEN)),
        read_only: false,
    });
    let r = call(&addr, "GET", "/v1/topology", None, "");
    assert_eq!(r.status, 401);
    assert_eq!(r.kind(), "unauthorized");
    let r = call(
        &addr,
        "GET",
        "/v1/topology",
        Some("s3cret-token-0123456788"),
        "",
    );
    assert_eq!(r.status, 401);
    let r = call(
        &addr,
        "GET",
        "/v1/topology",
        Some("s3cret-token-0123456789"),
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let body = r#"{"parent":"mbochs","profile":"mbochs-small","uuid":"6f1a2b3c-0000-4000-8000-000000000001"}"#;
    let r = call(
        &addr,
        "POST",
        "/v1/vgpus",
        Some("s3cret-token-0123456789"),
        body,
    );
    assert_eq!(r.status, 201, "{}", r.body);
}

#[test]
fn a_read_only_listener_serves_gets_and_refuses_writes() {
    let (addr, _stop, _dir) = serve(Access {
        token: None,
        read_only: true,
    });
    assert_eq!(call(&addr, "GET", "/v1/topology", None, "").status, 200);
    let body = r#"{"parent":"mbochs","profile":"mbochs-small","uuid":"6f1a2b3c-0000-4000-8000-000000000001"}"#;
    let r = call(&addr, "POST", "/v1/vgpus", None, body);
    assert_eq!(r.status, 403);
    assert_eq!(r.kind(), "read-only");
    assert_eq!(
        call(&addr, "DELETE", "/v1/vgpus/x", None, "").kind(),
        "read-only"
    );
}
