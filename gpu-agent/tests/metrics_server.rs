//! The metrics-only server (`gpuslice metrics --listen`) on the agent's connection handling.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_agent::{Listener, ServeOptions};

#[test]
fn idle_and_dribbling_clients_do_not_hold_up_a_scrape() {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = Listener::bind_tcp_read_routes("127.0.0.1:0").unwrap();
            tx.send(l.address().trim_start_matches("tcp:").to_owned())
                .unwrap();
            let router = gpu_agent::http::metrics_router(
                Arc::new(|| Ok("gpuslice_up 1\n".to_owned())),
                "text/plain; version=0.0.4".to_owned(),
            );
            gpu_agent::serve_router(
                router,
                vec![l],
                async {
                    let _ = stop_rx.await;
                },
                ServeOptions {
                    keep_alive: false,
                    max_requests: None,
                },
            )
            .await
            .unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    // Three connections that send nothing, one that sends a header byte now and then.
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let mut dribble = TcpStream::connect(&addr).unwrap();
    dribble.write_all(b"GET /metrics HTTP/1.1\r\nX").unwrap();
    let t = Instant::now();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("gpuslice_up 1\n"), "{out}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    drop(idle);
    drop(dribble);
    stop_tx.send(()).unwrap();
    server.join().unwrap();
}
