//! Documents rendered once per revision and served many times: the JSON body, its gzip form and
//! an entity tag, so a read costs a reference count, a client that already holds the revision
//! gets `304 Not Modified`, and a client that accepts gzip moves a fraction of the bytes.

use std::hash::{Hash as _, Hasher as _};
use std::io::Write as _;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

/// Bodies smaller than this are never compressed (the gzip header would cost more than it saves).
const GZIP_MIN: usize = 1024;

/// One JSON document, ready to serve.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The JSON text.
    pub json: Bytes,
    /// The same text compressed with gzip, when it is large enough to be worth it.
    pub gzip: Option<Bytes>,
    /// The entity tag (quoted, as sent in `ETag`): the revision and a hash of the text, so a tag
    /// never names two different texts, also across restarts of the agent.
    pub etag: HeaderValue,
}

impl Rendered {
    /// Renders `json` for `revision`.
    pub fn new(json: String, revision: u64) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        json.hash(&mut h);
        let etag = HeaderValue::from_str(&format!("\"{revision}-{:016x}\"", h.finish()))
            .unwrap_or_else(|_| HeaderValue::from_static("\"0\""));
        let gzip = (json.len() >= GZIP_MIN)
            .then(|| compress(json.as_bytes()))
            .flatten();
        Rendered {
            json: Bytes::from(json),
            gzip,
            etag,
        }
    }

    /// The JSON text as a string (it was built from one).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.json).unwrap_or("")
    }

    /// The answer to a GET with these request headers: `304` when `If-None-Match` names this
    /// document, the gzip body when `Accept-Encoding` allows it, else the JSON text.
    pub fn respond(&self, req: &HeaderMap) -> Response {
        let mut r = if none_match(req, &self.etag) {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            r
        } else {
            match self.gzip.as_ref().filter(|_| accepts_gzip(req)) {
                Some(z) => {
                    let mut r = Response::new(Body::from(z.clone()));
                    r.headers_mut()
                        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                    r
                }
                None => Response::new(Body::from(self.json.clone())),
            }
        };
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::ETAG, self.etag.clone());
        h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    }
}

fn compress(text: &[u8]) -> Option<Bytes> {
    let mut z = flate2::write::GzEncoder::new(
        Vec::with_capacity(text.len() / 8),
        flate2::Compression::default(),
    );
    z.write_all(text).ok()?;
    z.finish().ok().map(Bytes::from)
}

/// Whether `If-None-Match` lists `etag` (or is `*`). Weak tags compare by their opaque part, as
/// RFC 9110 asks for `If-None-Match`.
fn none_match(req: &HeaderMap, etag: &HeaderValue) -> bool {
    let mine = etag.as_bytes();
    req.get_all(header::IF_NONE_MATCH).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t).as_bytes() == mine)
        })
    })
}

/// Whether `Accept-Encoding` allows gzip: listed (or `*`) without `q=0`.
fn accepts_gzip(req: &HeaderMap) -> bool {
    req.get_all(header::ACCEPT_ENCODING).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',').any(|item| {
                let mut parts = item.split(';').map(str::trim);
                let coding = parts.next().unwrap_or("");
                let refused = parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                k.clone(),
                HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("")),
            );
        }
        h
    }

    fn big() -> Rendered {
        Rendered::new(format!("{{\"x\":\"{}\"}}", "a".repeat(5000)), 7)
    }

    #[test]
    fn the_same_text_gets_the_same_tag_and_another_text_another() {
        let a = big();
        let b = big();
        let c = Rendered::new("{\"x\":1}".to_owned(), 7);
        assert_eq!(a.etag, b.etag);
        assert_ne!(a.etag, c.etag);
        assert!(a.etag.to_str().is_ok_and(|t| t.starts_with("\"7-")));
    }

    #[test]
    fn a_client_holding_the_revision_gets_not_modified_without_a_body() {
        let d = big();
        let tag = d.etag.to_str().unwrap_or("").to_owned();
        for sent in [
            tag.clone(),
            format!("W/{tag}"),
            format!("\"x\", {tag}"),
            "*".to_owned(),
        ] {
            let r = d.respond(&headers(&[(header::IF_NONE_MATCH, &sent)]));
            assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{sent}");
        }
        let r = d.respond(&headers(&[(header::IF_NONE_MATCH, "\"1-0\"")]));
        assert_eq!(r.status(), StatusCode::OK);
    }

    #[test]
    fn gzip_is_sent_only_to_clients_that_accept_it_and_decodes_to_the_text() {
        let d = big();
        let z = d.gzip.clone().unwrap_or_default();
        assert!(
            z.len() < d.json.len() / 10,
            "{} of {}",
            z.len(),
            d.json.len()
        );
        let mut back = String::new();
        let read = flate2::read::GzDecoder::new(&z[..]).read_to_string(&mut back);
        assert!(read.is_ok());
        assert_eq!(back, d.text());
        for (sent, gz) in [
            ("gzip", true),
            ("br, gzip;q=0.5", true),
            ("*", true),
            ("identity", false),
            ("gzip;q=0", false),
            ("deflate", false),
        ] {
            let r = d.respond(&headers(&[(header::ACCEPT_ENCODING, sent)]));
            assert_eq!(
                r.headers().get(header::CONTENT_ENCODING).is_some(),
                gz,
                "{sent}"
            );
        }
        let plain = d.respond(&HeaderMap::new());
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
    }

    #[test]
    fn small_documents_are_not_compressed() {
        let d = Rendered::new("{\"x\":1}".to_owned(), 1);
        assert!(d.gzip.is_none());
        let r = d.respond(&headers(&[(header::ACCEPT_ENCODING, "gzip")]));
        assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
    }
}
