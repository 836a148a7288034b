//! Any `:authority` on the plugin's unix sockets, as the kubelet's own helper accepts it.
//!
//! The kubelet (grpc-go) sends `localhost`, but grpc-core clients (Python grpcio, C++, Ruby)
//! send their default for a `unix:` target, the socket path percent-encoded, which is no URI
//! authority: the HTTP/2 server under tonic resets every such stream (`PROTOCOL_ERROR`). The
//! authority means nothing on a unix socket, so each connection passes through a small HTTP/2
//! frame filter before the server sees it: in the client's header blocks, every `:authority`
//! field written as a literal is rewritten to `localhost` (the HPACK representations are walked
//! by their prefixes and lengths; no string is decoded), and the server's first SETTINGS asks
//! the client for a header table of size 0, so from then on every client header block stands on
//! its own. Every other frame passes unchanged.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The connection preface a client sends first.
const PREFACE: usize = 24;
/// The largest frame the filter reads (the server advertises 16 KiB; a client may not exceed it).
const MAX_FRAME: usize = 1 << 24;
/// The largest header-block fragment it writes per frame (HTTP/2's default frame size).
const OUT_FRAME: usize = 16_384;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// What every `:authority` becomes.
const AUTHORITY: &[u8] = b"localhost";

/// Serves one accepted connection through the filter: returns the end tonic serves, and runs
/// the two directions on their own tasks until either side closes.
pub fn filter<S>(stream: S) -> tokio::io::DuplexStream
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (server_end, ours) = tokio::io::duplex(64 * 1024);
    let (client_rx, client_tx) = tokio::io::split(stream);
    let (ours_rx, ours_tx) = tokio::io::split(ours);
    tokio::spawn(async move {
        let _ = client_to_server(client_rx, ours_tx).await;
    });
    tokio::spawn(async move {
        let _ = server_to_client(ours_rx, client_tx).await;
    });
    server_end
}

/// One frame: its type, flags, stream and payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: [u8; 4],
    payload: Vec<u8>,
}

async fn read_frame(r: &mut (impl AsyncRead + Unpin)) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 9];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "HTTP/2 frame too large",
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some(Frame {
        kind: head[3],
        flags: head[4],
        stream: [head[5], head[6], head[7], head[8]],
        payload,
    }))
}

async fn write_frame(w: &mut (impl AsyncWrite + Unpin), f: &Frame) -> io::Result<()> {
    let len = f.payload.len();
    let mut head = [0u8; 9];
    head[0] = (len >> 16) as u8;
    head[1] = (len >> 8) as u8;
    head[2] = len as u8;
    head[3] = f.kind;
    head[4] = f.flags;
    head[5..9].copy_from_slice(&f.stream);
    w.write_all(&head).await?;
    w.write_all(&f.payload).await
}

async fn client_to_server(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> io::Result<()> {
    let mut preface = [0u8; PREFACE];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    while let Some(f) = read_frame(&mut from).await? {
        if f.kind != HEADERS {
            write_frame(&mut to, &f).await?;
            continue;
        }
        let (priority, mut block) = fragment(&f)?;
        let mut flags = f.flags;
        while flags & END_HEADERS == 0 {
            let next = match read_frame(&mut from).await? {
                Some(c) if c.kind == CONTINUATION && c.stream == f.stream => c,
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "CONTINUATION expected",
                    ));
                }
            };
            block.extend_from_slice(&next.payload);
            flags = next.flags;
        }
        let block = rewrite(&block).unwrap_or(block);
        // The block again, in a HEADERS frame and as many CONTINUATIONs as it needs.
        let mut payload = priority;
        let mut at = 0;
        let mut kind = HEADERS;
        let mut keep = f.flags & (END_STREAM | PRIORITY);
        loop {
            let end = block.len().min(at + OUT_FRAME - payload.len());
            payload.extend_from_slice(&block[at..end]);
            at = end;
            let last = at == block.len();
            let out = Frame {
                kind,
                flags: keep | if last { END_HEADERS } else { 0 },
                stream: f.stream,
                payload: std::mem::take(&mut payload),
            };
            write_frame(&mut to, &out).await?;
            if last {
                break;
            }
            (kind, keep) = (CONTINUATION, 0);
        }
    }
    to.shutdown().await
}

/// A HEADERS frame's priority fields (kept) and its header-block fragment (padding dropped).
fn fragment(f: &Frame) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed HEADERS frame");
    let mut p = &f.payload[..];
    let mut pad = 0usize;
    if f.flags & PADDED != 0 {
        pad = usize::from(*p.first().ok_or_else(bad)?);
        p = &p[1..];
    }
    let mut priority = Vec::new();
    if f.flags & PRIORITY != 0 {
        priority.extend_from_slice(p.get(..5).ok_or_else(bad)?);
        p = &p[5..];
    }
    let end = p.len().checked_sub(pad).ok_or_else(bad)?;
    Ok((priority, p[..end].to_vec()))
}

/// An HPACK integer with an `n`-bit prefix at `b[*i]`.
fn integer(b: &[u8], i: &mut usize, n: u32) -> Option<usize> {
    let max = (1usize << n) - 1;
    let mut v = usize::from(*b.get(*i)?) & max;
    *i += 1;
    if v < max {
        return Some(v);
    }
    let mut shift = 0u32;
    loop {
        let byte = *b.get(*i)?;
        *i += 1;
        v = v.checked_add(usize::from(byte & 0x7f).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some(v);
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

/// Skips an HPACK string literal at `b[*i]`; returns whether it was Huffman-coded and its bytes.
fn string<'a>(b: &'a [u8], i: &mut usize) -> Option<(bool, &'a [u8])> {
    let huffman = *b.get(*i)? & 0x80 != 0;
    let len = integer(b, i, 7)?;
    let s = b.get(*i..i.checked_add(len)?)?;
    *i += len;
    Some((huffman, s))
}

/// The header block with every literal `:authority` value replaced by [`AUTHORITY`]; `None`
/// when the block cannot be walked (it is then passed on as it was, for the server to judge).
fn rewrite(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let first = b[i];
        let prefix = match first {
            f if f & 0x80 != 0 => {
                integer(b, &mut i, 7)?;
                out.extend_from_slice(&b[start..i]);
                continue;
            }
            f if f & 0xe0 == 0x20 => {
                integer(b, &mut i, 5)?;
                out.extend_from_slice(&b[start..i]);
                continue;
            }
            f if f & 0xc0 == 0x40 => 6,
            _ => 4,
        };
        let index = integer(b, &mut i, prefix)?;
        let name = if index == 0 {
            Some(string(b, &mut i)?)
        } else {
            None
        };
        let name_end = i;
        string(b, &mut i)?;
        let authority = index == 1 || name == Some((false, b":authority".as_slice()));
        if authority {
            out.extend_from_slice(&b[start..name_end]);
            out.push(AUTHORITY.len() as u8);
            out.extend_from_slice(AUTHORITY);
        } else {
            out.extend_from_slice(&b[start..i]);
        }
    }
    Some(out)
}

async fn server_to_client(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> io::Result<()> {
    // The server's first frame is its SETTINGS: a header table of size 0 is asked for there.
    if let Some(mut f) = read_frame(&mut from).await? {
        if f.kind == SETTINGS && f.flags & 0x1 == 0 {
            f.payload.extend_from_slice(&[0x00, 0x01, 0, 0, 0, 0]);
        }
        write_frame(&mut to, &f).await?;
    }
    tokio::io::copy(&mut from, &mut to).await?;
    to.shutdown().await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_literal_authority_becomes_localhost_and_every_other_field_is_kept() {
        // :method GET (indexed 2), :authority with incremental indexing and a path as value,
        // a literal header without indexing with a new name.
        let mut block = vec![0x82, 0x41, 11];
        block.extend_from_slice(b"%2Ftmp%2Fx.s");
        block.truncate(3 + 11);
        block.extend_from_slice(&[0x00, 2, b'a', b'b', 1, b'c']);
        let out = rewrite(&block).unwrap();
        let mut want = vec![0x82, 0x41, 9];
        want.extend_from_slice(b"localhost");
        want.extend_from_slice(&[0x00, 2, b'a', b'b', 1, b'c']);
        assert_eq!(out, want);
        // A block that cannot be walked is left as it is.
        assert_eq!(rewrite(&[0x41, 50, b'x']), None);
    }
}
