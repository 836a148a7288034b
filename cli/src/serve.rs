//! A minimal HTTP/1.1 server for `gpuslice metrics --listen`: `GET /metrics` only.
//!
//! A node agent is scraped every few seconds by one or two Prometheus servers, so requests are
//! served one at a time. Each connection gets read and write timeouts and a cap on the request
//! head, so a stalled or hostile client cannot hold the agent.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// The longest request head read (request line and headers).
const MAX_HEAD: u64 = 16 * 1024;
/// How long a client may take to send its request or read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// What a scrape produces: the body, or an error message served as a 500.
pub type Render<'a> = dyn FnMut() -> Result<String, String> + 'a;

/// Serves `render`'s output at `/metrics` on `listener` until `max_requests` requests were
/// answered (forever when `None`). Failed connections are reported to stderr and skipped.
///
/// # Errors
/// An error of `accept` on the listening socket.
pub fn serve(
    listener: &TcpListener,
    content_type: &str,
    render: &mut Render<'_>,
    max_requests: Option<u64>,
) -> io::Result<()> {
    let mut served = 0u64;
    while max_requests.is_none_or(|m| served < m) {
        let (stream, peer) = listener.accept()?;
        served += 1;
        if let Err(e) = answer(stream, content_type, render) {
            eprintln!("gpuslice: metrics: connection from {peer}: {e}");
        }
    }
    Ok(())
}

fn answer(stream: TcpStream, content_type: &str, render: &mut Render<'_>) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_HEAD));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Drain the headers so the client sees its request read before the answer.
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line)?;
        if n == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    let mut out = stream;
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => match render() {
            Ok(body) => respond(&mut out, "200 OK", content_type, &body, method == "HEAD"),
            Err(e) => respond(
                &mut out,
                "500 Internal Server Error",
                "text/plain; charset=utf-8",
                &format!("{e}\n"),
                method == "HEAD",
            ),
        },
        ("GET" | "HEAD", _) => respond(
            &mut out,
            "404 Not Found",
            "text/plain; charset=utf-8",
            "gpuslice serves /metrics only\n",
            method == "HEAD",
        ),
        _ => respond(
            &mut out,
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET and HEAD are allowed\n",
            false,
        ),
    }
}

fn respond(
    out: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    out.write_all(head.as_bytes())?;
    if !head_only {
        out.write_all(body.as_bytes())?;
    }
    out.flush()
}
