//! Cached reads: `GET /v1/topology` and `GET /v1/health` carry an entity tag, answer `304` to a
//! client that already holds the revision, and send gzip to clients that accept it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use gpu_sysfs::testing::FakeKernel;
use support::{get, request, start};

const U1: &str = "6f1a2b3c-0000-4000-8000-0000000000c1";

struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

/// A GET with extra header lines, the answer's body kept as bytes (it may be gzip).
fn fetch(socket: &Path, path: &str, extra: &str) -> Answer {
    let mut s = UnixStream::connect(socket).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n{extra}\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    Answer {
        status,
        head,
        body: out[split + 4..].to_vec(),
    }
}

fn gunzip(bytes: &[u8]) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn a_client_holding_the_current_revision_gets_not_modified() {
    let a = start(Arc::new(FakeKernel::sample_mdev_drivers().unwrap()));
    for route in ["/v1/topology", "/v1/health"] {
        let first = fetch(&a.socket, route, "");
        assert_eq!(first.status, 200);
        let tag = first.header("etag").expect("an ETag");
        let again = fetch(&a.socket, route, &format!("If-None-Match: {tag}\r\n"));
        assert_eq!(again.status, 304, "{route}: {}", again.head);
        assert!(again.body.is_empty());
        assert_eq!(again.header("etag").as_deref(), Some(tag.as_str()));
        let other = fetch(&a.socket, route, "If-None-Match: \"0-0\"\r\n");
        assert_eq!(other.status, 200);
    }
}

#[test]
fn a_change_gives_the_topology_a_new_tag() {
    let a = start(Arc::new(FakeKernel::sample_mdev_drivers().unwrap()));
    let tag = fetch(&a.socket, "/v1/topology", "").header("etag").unwrap();
    let body = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{U1}"}}"#);
    let c = request(&a.socket, "POST", "/v1/vgpus", Some(&body));
    assert_eq!(c.status, 201, "{}", c.body);
    let after = fetch(
        &a.socket,
        "/v1/topology",
        &format!("If-None-Match: {tag}\r\n"),
    );
    assert_eq!(after.status, 200, "the old tag no longer matches");
    assert_ne!(after.header("etag"), Some(tag));
    let text = String::from_utf8(after.body).unwrap();
    assert!(text.contains(U1), "the new document lists the vGPU");
}

#[test]
fn gzip_goes_to_clients_that_ask_and_decodes_to_the_same_document() {
    let a = start(Arc::new(FakeKernel::sample_mdev_drivers().unwrap()));
    let plain = fetch(&a.socket, "/v1/topology", "");
    assert_eq!(plain.header("content-encoding"), None);
    let zipped = fetch(&a.socket, "/v1/topology", "Accept-Encoding: gzip, br\r\n");
    assert_eq!(zipped.status, 200);
    assert_eq!(zipped.header("content-encoding").as_deref(), Some("gzip"));
    assert_eq!(
        zipped
            .header("vary")
            .map(|v| v.to_ascii_lowercase())
            .as_deref(),
        Some("accept-encoding")
    );
    assert!(zipped.body.len() < plain.body.len());
    assert_eq!(gunzip(&zipped.body), String::from_utf8(plain.body).unwrap());
    let refused = fetch(&a.socket, "/v1/topology", "Accept-Encoding: gzip;q=0\r\n");
    assert_eq!(refused.header("content-encoding"), None);
    // The plain helper of the other tests still reads JSON.
    assert_eq!(get(&a.socket, "/v1/topology").json()["node"], "node-a");
}
