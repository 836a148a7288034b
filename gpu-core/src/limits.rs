//! Bounds on input: what any host or GPU can hold, how large and how deeply nested a document
//! may be, and escaping for output formats that would otherwise let a name inject lines.
//!
//! Every bound is checked before anything is allocated or decoded by the value it bounds: a
//! layout asking for 4294967295 vGPUs is refused at the count, a 200 KB document of nested `[`
//! at the nesting scan, long before a decoder or planner would grow memory for them.

use crate::error::CoreError;

/// The most instances of one vGPU type on one GPU or parent. No GPU holds more than a few dozen
/// (NVIDIA's smallest profiles give 32–48 per board); the sample drivers' limits are smaller.
pub const MAX_INSTANCES: u32 = 1024;

/// The largest document (layout, fleet, Machine, topology) read as text by default: a 10 000-node
/// fleet of A2-like nodes is a few MB, of L40S hosts with 16 VFs each about 200 MB in the full
/// form (a few MB in the compact form). An operator raises it per command
/// ([`check_document_max`]).
pub const MAX_DOCUMENT_BYTES: usize = 64 << 20;

/// The deepest nesting of sequences and mappings in a document. Real documents nest fewer than
/// ten levels.
pub const MAX_NESTING: usize = 64;

/// Checks a document's size and nesting depth before it is decoded.
///
/// The depth is measured on the text (flow brackets outside quoted scalars, plus block
/// indentation levels and `- ` markers), in one pass, so a hostile document is refused in
/// linear time whatever the decoder would do with it.
///
/// # Errors
/// [`CoreError::DocumentTooLarge`] or [`CoreError::NestedTooDeep`] (naming the line).
pub fn check_document(text: &str) -> Result<(), CoreError> {
    check_document_max(text, MAX_DOCUMENT_BYTES)
}

/// [`check_document`] with a size cap of `max_bytes` instead of [`MAX_DOCUMENT_BYTES`] (the
/// operator raised it: `--max-document-mib`, `GPUSLICE_MAX_DOCUMENT_MIB`, a binding argument).
///
/// # Errors
/// As [`check_document`]; the size message says how to raise the cap.
pub fn check_document_max(text: &str, max_bytes: usize) -> Result<(), CoreError> {
    if text.len() > max_bytes {
        return Err(CoreError::DocumentTooLarge {
            len: Some(text.len()),
            max_bytes,
        });
    }
    let mut flow: usize = 0;
    let mut quote: Option<u8> = None;
    let mut indents: Vec<usize> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let mut i = 0;
        let mut block = 0;
        if flow == 0 && quote.is_none() {
            let indent = bytes.iter().take_while(|b| **b == b' ').count();
            let rest = &bytes[indent..];
            if rest.is_empty() || rest[0] == b'#' {
                continue;
            }
            while indents.last().is_some_and(|top| *top >= indent) {
                indents.pop();
            }
            indents.push(indent);
            // The top level itself is no nesting.
            block = indents.len() - 1;
            i = indent;
            // `- - - x`: each marker opens a sequence on the same line.
            while i + 1 < bytes.len() && bytes[i] == b'-' && bytes[i + 1] == b' ' {
                block += 1;
                i += 2;
                while i < bytes.len() && bytes[i] == b' ' {
                    i += 1;
                }
            }
        }
        let too_deep = || {
            Err(CoreError::NestedTooDeep {
                line: n + 1,
                max: MAX_NESTING,
            })
        };
        if block + flow > MAX_NESTING {
            return too_deep();
        }
        let mut prev: u8 = b' ';
        while i < bytes.len() {
            let b = bytes[i];
            match quote {
                Some(b'"') if b == b'\\' => {
                    i += 2;
                    continue;
                }
                Some(q) if b == q => quote = None,
                Some(_) => {}
                None => match b {
                    b'"' | b'\'' if matches!(prev, b' ' | b'\t' | b'[' | b'{' | b',' | b':') => {
                        quote = Some(b)
                    }
                    b'#' if matches!(prev, b' ' | b'\t') => break,
                    // In block context a bracket opens a flow collection only where a value
                    // starts (`a: [`, `- {`); inside a plain scalar (`x: don't [`) it is text.
                    b'[' | b'{'
                        if flow > 0
                            || matches!(prev, b' ' | b'\t' | b':' | b'-' | b',' | b'[' | b'{') =>
                    {
                        flow += 1;
                        if block + flow > MAX_NESTING {
                            return too_deep();
                        }
                    }
                    b']' | b'}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            prev = b;
            i += 1;
        }
        // A quote in block context ends with its line (a plain scalar's apostrophe).
        if flow == 0 && quote == Some(b'\'') {
            quote = None;
        }
    }
    Ok(())
}

/// A reader that checks JSON text for nesting and size as it passes, for decoding a document
/// from a stream without holding its text ([`crate::decode_reader_max`]): the same bounds as
/// [`check_document_max`] applies to text, measured on the bytes as they are read, so a hostile
/// stream is refused at the byte that breaks a bound.
///
/// The size is checked from the first byte; nesting from when the text is known to be JSON
/// ([`JsonBounds::check_nesting`], given what was read before that), as `[` and `{` outside
/// strings. The first read past a bound fails with `InvalidData` naming it (and the line, for
/// nesting), and so does every read after it.
#[derive(Debug)]
pub struct JsonBounds<R> {
    inner: R,
    max_bytes: usize,
    seen: usize,
    depth: usize,
    line: usize,
    in_string: bool,
    escaped: bool,
    nesting: bool,
    failed: Option<CoreError>,
}

impl<R: std::io::Read> JsonBounds<R> {
    /// Checks what `inner` yields: at most `max_bytes` bytes, nested at most [`MAX_NESTING`].
    pub fn new(inner: R, max_bytes: usize) -> Self {
        JsonBounds {
            inner,
            max_bytes,
            seen: 0,
            depth: 0,
            line: 1,
            in_string: false,
            escaped: false,
            nesting: false,
            failed: None,
        }
    }

    /// Checks nesting from here on, starting with `before`: the bytes already read that the
    /// caller holds (a buffer's content).
    ///
    /// # Errors
    /// [`CoreError::NestedTooDeep`], when `before` already breaks the nesting bound.
    pub fn check_nesting(&mut self, before: &[u8]) -> Result<(), CoreError> {
        self.nesting = true;
        let verdict = self.scan(before);
        if let Err(e) = &verdict {
            self.failed = Some(e.clone());
        }
        verdict
    }

    /// The bound that was broken, if one was: the decoder's own error then only repeats it.
    pub fn failure(&self) -> Option<&CoreError> {
        self.failed.as_ref()
    }

    fn scan(&mut self, bytes: &[u8]) -> Result<(), CoreError> {
        for &b in bytes {
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    b'\n' => self.line += 1,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'\n' => self.line += 1,
                b'[' | b'{' => {
                    self.depth += 1;
                    if self.depth > MAX_NESTING {
                        return Err(CoreError::NestedTooDeep {
                            line: self.line,
                            max: MAX_NESTING,
                        });
                    }
                }
                b']' | b'}' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
        Ok(())
    }
}

impl<R: std::io::Read> std::io::Read for JsonBounds<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let refuse =
            |e: &CoreError| std::io::Error::new(std::io::ErrorKind::InvalidData, e.clone());
        if let Some(e) = &self.failed {
            return Err(refuse(e));
        }
        // One byte past the cap is enough to refuse; never read further than that.
        let room = self.max_bytes.saturating_sub(self.seen).saturating_add(1);
        let want = buf.len().min(room);
        let n = self.inner.read(&mut buf[..want])?;
        self.seen = self.seen.saturating_add(n);
        let verdict = if self.seen > self.max_bytes {
            Err(CoreError::DocumentTooLarge {
                len: None,
                max_bytes: self.max_bytes,
            })
        } else if self.nesting {
            self.scan(&buf[..n])
        } else {
            Ok(())
        };
        match verdict {
            Ok(()) => Ok(n),
            Err(bound) => {
                let e = refuse(&bound);
                self.failed = Some(bound);
                Err(e)
            }
        }
    }
}

/// Escapes a Prometheus label value per the text exposition format: backslash, double quote and
/// line feed become `\\`, `\"` and `\n`; everything else is kept.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deeply_nested_document_is_refused_fast_with_the_line() {
        let doc = "[".repeat(200_000);
        let start = std::time::Instant::now();
        let e = check_document(&doc).unwrap_err();
        assert_eq!(
            e,
            CoreError::NestedTooDeep {
                line: 1,
                max: MAX_NESTING
            }
        );
        assert_eq!(e.to_string(), "line 1: nested more than 64 levels deep");
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        let blocks: String = (0..100)
            .map(|i| format!("{}a{i}:\n", " ".repeat(i)))
            .collect();
        assert!(check_document(&blocks).is_err());
        assert!(check_document(&"- ".repeat(100)).is_err());
    }

    #[test]
    fn ordinary_documents_pass_whatever_their_quotes_and_comments() {
        let doc = "version: v1\nvgpu-configs:\n  a:\n    - devices: [0, 1]  # [[[[\n      \
                   vgpu-devices: {\"A2-4Q\": 4}\n    - name: \"[[[[[\"\n      x: don't [\n";
        check_document(doc).unwrap();
        check_document("{\"a\": [[1], [2, {\"b\": \"]]]]\"}]]}").unwrap();
        check_document(&format!("{}{}", "[".repeat(64), "]".repeat(64))).unwrap();
        assert!(check_document(&"[".repeat(65)).is_err());
    }

    #[test]
    fn a_huge_document_is_refused_by_size() {
        let doc = " ".repeat(MAX_DOCUMENT_BYTES + 1);
        let e = check_document(&doc).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "document is {} bytes; at most 64 MiB are read (raise the cap with \
                 --max-document-mib or GPUSLICE_MAX_DOCUMENT_MIB)",
                MAX_DOCUMENT_BYTES + 1
            )
        );
        check_document_max(&doc, MAX_DOCUMENT_BYTES + (1 << 20)).unwrap();
    }

    #[test]
    fn label_values_cannot_inject_lines() {
        assert_eq!(
            escape_label_value("a\"b\\c\nevil 1"),
            "a\\\"b\\\\c\\nevil 1"
        );
        assert_eq!(escape_label_value("GRID A2-4Q"), "GRID A2-4Q");
    }
}
