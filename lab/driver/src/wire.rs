//! The kubelet stand-in's wire: protobuf messages encoded and decoded by hand from the field
//! numbers in `proto/` (pluginregistration/v1, dra/v1), and a unary gRPC call over HTTP/2 on a
//! unix socket (the `h2` crate). None of gpuslice's code is used: the plugin is checked by a client
//! written from the wire definitions alone, as the kubelet's own is.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;

/// Registration service methods (package `pluginregistration`).
pub const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
/// `NotifyRegistrationStatus`.
pub const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";
/// DRAPlugin v1 (package `k8s.io.kubelet.pkg.apis.dra.v1`).
pub const PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
/// `NodeUnprepareResources` v1.
pub const UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";

// --- protobuf ------------------------------------------------------------------------------------

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (wire type 2): strings, bytes and embedded messages.
pub fn field_bytes(out: &mut Vec<u8>, number: u32, value: &[u8]) {
    varint(out, u64::from(number) << 3 | 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// A varint field (wire type 0): bools and integers.
pub fn field_varint(out: &mut Vec<u8>, number: u32, value: u64) {
    varint(out, u64::from(number) << 3);
    varint(out, value);
}

/// One decoded field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 2.
    Bytes(Vec<u8>),
    /// Wire types 1 and 5 (not used by these messages; kept so unknown fields are skipped).
    Fixed(u64),
}

fn read_varint(buf: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at).ok_or("protobuf: a varint runs past the end")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("protobuf: a varint longer than 10 bytes".to_owned())
}

/// A decoded message: its fields in order, (number, value).
pub type Message = Vec<(u32, Value)>;

/// Every field of a message, in order.
pub fn fields(buf: &[u8]) -> Result<Message, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let key = read_varint(buf, &mut at)?;
        let number = u32::try_from(key >> 3).map_err(|_| "protobuf: a field number too big")?;
        let value = match key & 7 {
            0 => Value::Varint(read_varint(buf, &mut at)?),
            2 => {
                let len = usize::try_from(read_varint(buf, &mut at)?)
                    .map_err(|_| "protobuf: a length too big")?;
                let end = at
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or("protobuf: a length runs past the end")?;
                let v = buf[at..end].to_vec();
                at = end;
                Value::Bytes(v)
            }
            w @ (1 | 5) => {
                let n = if w == 1 { 8 } else { 4 };
                let end = at
                    .checked_add(n)
                    .filter(|e| *e <= buf.len())
                    .ok_or("protobuf: a fixed field runs past the end")?;
                let mut v = 0u64;
                for (i, b) in buf[at..end].iter().enumerate() {
                    v |= u64::from(*b) << (8 * i);
                }
                at = end;
                Value::Fixed(v)
            }
            w => return Err(format!("protobuf: wire type {w} of field {number}")),
        };
        out.push((number, value));
    }
    Ok(out)
}

/// The strings of field `number` (a repeated field gives several).
pub fn strings(msg: &[(u32, Value)], number: u32) -> Result<Vec<String>, String> {
    msg.iter()
        .filter(|(n, _)| *n == number)
        .map(|(_, v)| match v {
            Value::Bytes(b) => String::from_utf8(b.clone())
                .map_err(|_| format!("protobuf: field {number} is not UTF-8")),
            other => Err(format!(
                "protobuf: field {number} is {other:?}, not a string"
            )),
        })
        .collect()
}

/// The last string of field `number`, empty when absent (proto3's default).
pub fn string(msg: &[(u32, Value)], number: u32) -> Result<String, String> {
    Ok(strings(msg, number)?.pop().unwrap_or_default())
}

/// The embedded messages of field `number`.
pub fn messages(msg: &[(u32, Value)], number: u32) -> Result<Vec<Message>, String> {
    msg.iter()
        .filter(|(n, _)| *n == number)
        .map(|(_, v)| match v {
            Value::Bytes(b) => fields(b),
            other => Err(format!(
                "protobuf: field {number} is {other:?}, not a message"
            )),
        })
        .collect()
}

/// A `map<string, M>` field: each entry is a message with the key as field 1, the value as 2.
pub fn string_map(msg: &[(u32, Value)], number: u32) -> Result<Vec<(String, Message)>, String> {
    messages(msg, number)?
        .into_iter()
        .map(|entry| {
            let key = string(&entry, 1)?;
            let value = messages(&entry, 2)?.pop().unwrap_or_default();
            Ok((key, value))
        })
        .collect()
}

/// `NodePrepareResourcesRequest` / `NodeUnprepareResourcesRequest`: field 1, repeated `Claim`
/// (namespace 1, uid 2, name 3).
pub fn claims_request(claims: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (namespace, uid, name) in claims {
        let mut c = Vec::new();
        field_bytes(&mut c, 1, namespace.as_bytes());
        field_bytes(&mut c, 2, uid.as_bytes());
        field_bytes(&mut c, 3, name.as_bytes());
        field_bytes(&mut out, 1, &c);
    }
    out
}

/// One `Device` of a prepare answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Device {
    /// `request_names` (1).
    pub requests: Vec<String>,
    /// `pool_name` (2).
    pub pool: String,
    /// `device_name` (3).
    pub device: String,
    /// `cdi_device_ids` (4).
    pub cdi_ids: Vec<String>,
}

/// One claim's answer to `NodePrepareResources`: its devices and error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    /// `devices` (1).
    pub devices: Vec<Device>,
    /// `error` (2).
    pub error: String,
}

/// Decodes `NodePrepareResourcesResponse` (map field 1 of `NodePrepareResourceResponse`).
pub fn prepare_response(buf: &[u8]) -> Result<Vec<(String, Prepared)>, String> {
    string_map(&fields(buf)?, 1)?
        .into_iter()
        .map(|(uid, m)| {
            let devices = messages(&m, 1)?
                .into_iter()
                .map(|d| {
                    Ok(Device {
                        requests: strings(&d, 1)?,
                        pool: string(&d, 2)?,
                        device: string(&d, 3)?,
                        cdi_ids: strings(&d, 4)?,
                    })
                })
                .collect::<Result<_, String>>()?;
            Ok((
                uid,
                Prepared {
                    devices,
                    error: string(&m, 2)?,
                },
            ))
        })
        .collect()
}

/// Decodes `NodeUnprepareResourcesResponse`: (uid, error) per claim.
pub fn unprepare_response(buf: &[u8]) -> Result<Vec<(String, String)>, String> {
    string_map(&fields(buf)?, 1)?
        .into_iter()
        .map(|(uid, m)| Ok((uid, string(&m, 1)?)))
        .collect()
}

// --- gRPC over HTTP/2 on a unix socket -------------------------------------------------------

/// One unary call: `method` on the server at `socket` with the encoded request; the encoded
/// answer, or the gRPC status and message when it is not OK. Bounded by `timeout`.
pub fn unary(
    socket: &Path,
    method: &str,
    request: Vec<u8>,
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(async {
        tokio::time::timeout(timeout, call(socket, method, request))
            .await
            .unwrap_or_else(|_| Err(format!("{method}: no answer within {timeout:?}")))
    })
}

async fn call(socket: &Path, method: &str, request: Vec<u8>) -> Result<Vec<u8>, String> {
    let io = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    let (client, conn) = h2::client::handshake(io)
        .await
        .map_err(|e| format!("HTTP/2 handshake on {}: {e}", socket.display()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client
        .ready()
        .await
        .map_err(|e| format!("{method}: HTTP/2 not ready: {e}"))?;
    // The authority the kubelet (grpc-go) sends on a unix socket.
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| format!("{method}: {e}"))?;
    let (answer, mut send) = client
        .send_request(req, false)
        .map_err(|e| format!("{method}: send: {e}"))?;
    let len = u32::try_from(request.len()).map_err(|_| format!("{method}: request too big"))?;
    let mut framed = Vec::with_capacity(request.len() + 5);
    framed.push(0); // not compressed
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(&request);
    send.send_data(Bytes::from(framed), true)
        .map_err(|e| format!("{method}: send body: {e}"))?;
    let answer = answer.await.map_err(|e| format!("{method}: answer: {e}"))?;
    let (head, mut body) = answer.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(format!("{method}: HTTP status {}", head.status));
    }
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("{method}: body: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body
        .trailers()
        .await
        .map_err(|e| format!("{method}: trailers: {e}"))?;
    // A trailers-only answer carries grpc-status in the head.
    let status_of = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let headers = trailers.as_ref().unwrap_or(&head.headers);
    let status = status_of(headers)
        .or_else(|| status_of(&head.headers))
        .ok_or_else(|| format!("{method}: no grpc-status"))?;
    if status != "0" {
        let msg = headers
            .get("grpc-message")
            .or_else(|| head.headers.get("grpc-message"))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        return Err(format!("{method}: grpc-status {status}: {msg}"));
    }
    if data.len() < 5 || data[0] != 0 {
        return Err(format!(
            "{method}: the answer is no uncompressed gRPC message ({} bytes)",
            data.len()
        ));
    }
    let n = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    if data.len() != 5 + n {
        return Err(format!(
            "{method}: message length {n}, {} bytes came",
            data.len() - 5
        ));
    }
    Ok(data[5..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_decodes_to_its_claims() {
        let buf = claims_request(&[("default", "uid-1", "vm-1"), ("ns", "uid-2", "vm-2")]);
        let claims = messages(&fields(&buf).unwrap(), 1).unwrap();
        assert_eq!(claims.len(), 2);
        assert_eq!(string(&claims[1], 1).unwrap(), "ns");
        assert_eq!(string(&claims[1], 2).unwrap(), "uid-2");
        assert_eq!(string(&claims[1], 3).unwrap(), "vm-2");
    }

    #[test]
    fn a_prepare_answer_decodes() {
        let mut dev = Vec::new();
        field_bytes(&mut dev, 1, b"gpu");
        field_bytes(&mut dev, 2, b"lab");
        field_bytes(&mut dev, 3, b"gpu-0000-00-03-0");
        field_bytes(&mut dev, 4, b"d/vfio=u-0");
        let mut value = Vec::new();
        field_bytes(&mut value, 1, &dev);
        let mut entry = Vec::new();
        field_bytes(&mut entry, 1, b"u");
        field_bytes(&mut entry, 2, &value);
        let mut msg = Vec::new();
        field_bytes(&mut msg, 1, &entry);
        field_varint(&mut msg, 9, 300); // an unknown field is skipped
        let got = prepare_response(&msg).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "u");
        assert_eq!(got[0].1.error, "");
        assert_eq!(
            got[0].1.devices,
            vec![Device {
                requests: vec!["gpu".into()],
                pool: "lab".into(),
                device: "gpu-0000-00-03-0".into(),
                cdi_ids: vec!["d/vfio=u-0".into()],
            }]
        );
    }

    #[test]
    fn truncated_input_is_an_error() {
        assert!(fields(&[0x0a, 0x05, b'a']).is_err());
        assert!(fields(&[0x08, 0x80]).is_err());
    }
}
