//! The one reader of documents named by an operator: fleet, Machine, claim, layout and policy
//! files, and standard input.
//!
//! A document is read up to a cap and no further: a 1 GiB file is refused after the first byte
//! past the cap (or, for a regular file, from its size before any read), so refusing it costs
//! neither the memory nor the time of reading it. The cap is 64 MiB unless the operator raises it
//! ([`DocumentLimit::from_env`] reads `GPUSLICE_MAX_DOCUMENT_MIB`; the CLI's
//! `--max-document-mib` and the bindings' `max_document_mib` arguments give it directly). A named
//! file is opened without blocking and refused unless it is a regular file: a FIFO would block,
//! a device or socket is no document. Standard input is read as a stream, with the same cap.
//! [`open_document`] hands the checked file (or standard input) to a decoder that reads as it
//! decodes (`gpu_core::decode_reader_max`), so a large JSON fleet is never held as text.
//!
//! Text is checked for nesting by the decoder's caller ([`gpu_core::limits::check_document_max`]).

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The environment variable that raises (or lowers) the document cap, in MiB.
pub const MAX_DOCUMENT_ENV: &str = "GPUSLICE_MAX_DOCUMENT_MIB";

/// How large a document may be, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocumentLimit {
    bytes: usize,
}

impl Default for DocumentLimit {
    /// [`gpu_core::limits::MAX_DOCUMENT_BYTES`] (64 MiB).
    fn default() -> Self {
        DocumentLimit {
            bytes: gpu_core::limits::MAX_DOCUMENT_BYTES,
        }
    }
}

impl DocumentLimit {
    /// A cap of `mib` MiB (at least 1 MiB).
    pub fn from_mib(mib: u64) -> Self {
        let bytes = usize::try_from(mib.max(1).saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        DocumentLimit { bytes }
    }

    /// `mib` when given (a flag, a binding argument), else [`MAX_DOCUMENT_ENV`] when set, else
    /// the default.
    ///
    /// # Errors
    /// An `InvalidInput` error naming the variable when it is set but not a whole number of MiB
    /// from 1 up.
    pub fn from_env_or(mib: Option<u64>) -> io::Result<Self> {
        match mib {
            Some(m) => Ok(Self::from_mib(m)),
            None => Self::from_env(),
        }
    }

    /// [`MAX_DOCUMENT_ENV`] when set, else the default.
    ///
    /// # Errors
    /// As [`DocumentLimit::from_env_or`].
    pub fn from_env() -> io::Result<Self> {
        match std::env::var(MAX_DOCUMENT_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(v)) => Err(bad_env(&v.to_string_lossy())),
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(m) if m >= 1 => Ok(Self::from_mib(m)),
                _ => Err(bad_env(&v)),
            },
        }
    }

    /// The cap in bytes.
    pub fn bytes(self) -> usize {
        self.bytes
    }

    pub(crate) fn too_large(self, what: &str, size: Option<u64>) -> io::Error {
        let mib = self.bytes >> 20;
        let size = match size {
            Some(s) => format!("is {s} bytes"),
            None => format!("is larger than {} bytes", self.bytes),
        };
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{what} {size}; at most {mib} MiB are read (raise the cap with \
                 --max-document-mib or {MAX_DOCUMENT_ENV})"
            ),
        )
    }
}

fn bad_env(v: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{MAX_DOCUMENT_ENV}={v:?}: give a whole number of MiB, at least 1"),
    )
}

/// Reads the document at `path` as UTF-8 text, at most `limit` bytes; `-` reads standard input.
/// `what` names the document in errors (`fleet`, `layout`).
///
/// # Errors
/// As [`open_document`], plus the read error and `InvalidData` for a document over the cap (saying
/// how to raise it) or for text that is not UTF-8.
pub fn read_document(path: &Path, what: &str, limit: DocumentLimit) -> io::Result<String> {
    let mut doc = open_document(path, what, limit)?;
    read_all(&mut doc, what)
}

/// Opens the document at `path` for reading as a stream of at most `limit` bytes (`-` is
/// standard input), for a decoder that reads as it decodes: the file is checked as
/// [`read_document`] checks it, and reading stops one byte past the cap ([`Document::failure`]
/// then says so).
///
/// # Errors
/// The open error; `InvalidData` for a file that is not a regular file (a FIFO, socket, device or
/// directory) and for a regular file whose size is over the cap (saying how to raise it).
pub fn open_document(
    path: &Path,
    what: &str,
    limit: DocumentLimit,
) -> io::Result<Document<'static>> {
    if path.as_os_str() == "-" {
        return Ok(Document::new(
            Source::Stdin(io::stdin().lock()),
            what,
            limit,
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits() | nix::fcntl::OFlag::O_NOCTTY.bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is {}, not a regular file; not read (give `-` to read standard input)",
                path.display(),
                crate::confine::file_kind(&meta.file_type())
            ),
        ));
    }
    if usize::try_from(meta.len()).map_or(true, |n| n > limit.bytes) {
        return Err(limit.too_large(what, Some(meta.len())));
    }
    Ok(Document::new(Source::File(file), what, limit))
}

/// Reads `from` as UTF-8 text up to `limit` bytes; one byte more is refused without reading
/// further.
///
/// # Errors
/// The read error; `InvalidData` past the cap or for text that is not UTF-8.
pub fn read_stream(mut from: impl Read, what: &str, limit: DocumentLimit) -> io::Result<String> {
    read_all(
        &mut Document::new(Source::Other(&mut from), what, limit),
        what,
    )
}

fn read_all(doc: &mut Document<'_>, what: &str) -> io::Result<String> {
    let mut buf = Vec::new();
    doc.read_to_end(&mut buf)?;
    String::from_utf8(buf).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{what} is not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

enum Source<'a> {
    Stdin(io::StdinLock<'static>),
    File(std::fs::File),
    Other(&'a mut dyn Read),
}

/// A document being read ([`open_document`]): at most its cap, one byte more refused (and every
/// read after that). Unbuffered: a decoder buffers as it needs.
pub struct Document<'a> {
    source: Source<'a>,
    what: String,
    limit: DocumentLimit,
    seen: usize,
    failed: Option<(io::ErrorKind, String)>,
}

impl std::fmt::Debug for Document<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Document")
            .field("what", &self.what)
            .field("limit", &self.limit)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl<'a> Document<'a> {
    fn new(source: Source<'a>, what: &str, limit: DocumentLimit) -> Self {
        Document {
            source,
            what: what.to_owned(),
            limit,
            seen: 0,
            failed: None,
        }
    }

    /// Why reading stopped, when it did: the cap (saying how to raise it) or the read error. A
    /// decoder that failed after this only repeats it, so a caller reports this one.
    pub fn failure(&self) -> Option<io::Error> {
        self.failed
            .as_ref()
            .map(|(kind, m)| io::Error::new(*kind, m.clone()))
    }
}

impl Read for Document<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let room = self.limit.bytes.saturating_sub(self.seen).saturating_add(1);
        let want = buf.len().min(room);
        let got = match &mut self.source {
            Source::Stdin(s) => s.read(&mut buf[..want]),
            Source::File(f) => f.read(&mut buf[..want]),
            Source::Other(r) => r.read(&mut buf[..want]),
        };
        let verdict = got.and_then(|n| {
            self.seen = self.seen.saturating_add(n);
            if self.seen > self.limit.bytes {
                Err(self.limit.too_large(&self.what, None))
            } else {
                Ok(n)
            }
        });
        if let Err(e) = &verdict {
            if e.kind() != io::ErrorKind::Interrupted {
                self.failed = Some((e.kind(), e.to_string()));
            }
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_over_the_default_cap_is_refused_from_its_size_saying_how_to_raise_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fleet.json");
        // Sparse: 1 GiB long, nothing read.
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(1 << 30).unwrap();
        let e = read_document(&p, "fleet", DocumentLimit::default()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("fleet is 1073741824 bytes"), "{msg}");
        assert!(msg.contains("at most 64 MiB"), "{msg}");
        assert!(msg.contains("--max-document-mib"), "{msg}");
        assert!(msg.contains(MAX_DOCUMENT_ENV), "{msg}");
    }

    #[test]
    fn a_raised_cap_reads_what_the_default_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.yaml");
        std::fs::write(&p, vec![b'#'; 2 << 20]).unwrap();
        assert!(read_document(&p, "layout", DocumentLimit::from_mib(1)).is_err());
        let text = read_document(&p, "layout", DocumentLimit::from_mib(2)).unwrap();
        assert_eq!(text.len(), 2 << 20);
    }

    #[test]
    fn a_stream_stops_one_byte_past_the_cap() {
        struct Endless(usize);
        impl Read for Endless {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                buf.fill(b' ');
                self.0 += buf.len();
                Ok(buf.len())
            }
        }
        let mut src = Endless(0);
        let e = read_stream(&mut src, "fleet", DocumentLimit::from_mib(1)).unwrap_err();
        assert!(e.to_string().contains("larger than 1048576 bytes"), "{e}");
        assert!(src.0 <= (1 << 20) + 64 * 1024, "read {} bytes", src.0);
    }

    #[test]
    fn an_opened_document_reads_up_to_its_cap_and_then_says_why_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fleet.json");
        std::fs::write(&p, vec![b' '; 1 << 20]).unwrap();
        let mut doc = open_document(&p, "fleet", DocumentLimit::from_mib(1)).unwrap();
        let mut all = Vec::new();
        doc.read_to_end(&mut all).unwrap();
        assert_eq!((all.len(), doc.failure().is_none()), (1 << 20, true));

        // A stream longer than its cap: refused at the byte past it, and every read after.
        let mut src = io::repeat(b' ');
        let mut doc = Document::new(Source::Other(&mut src), "fleet", DocumentLimit::from_mib(1));
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0;
        let e = loop {
            match doc.read(&mut buf) {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert_eq!(got, 1 << 20, "no byte past the cap is handed on");
        let stopped = doc.failure().unwrap().to_string();
        assert_eq!(stopped, e.to_string());
        assert!(
            stopped.contains("fleet is larger than 1048576 bytes"),
            "{stopped}"
        );
        assert!(doc.read(&mut buf).is_err());
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("layout.yaml");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read_document(&p, "layout", DocumentLimit::default()).unwrap_err();
        assert!(e.to_string().contains("is a FIFO"), "{e}");
        let e = open_document(&p, "layout", DocumentLimit::default()).unwrap_err();
        assert!(e.to_string().contains("is a FIFO"), "{e}");
    }

    #[test]
    fn the_environment_raises_the_cap_and_a_bad_value_is_named() {
        assert_eq!(
            DocumentLimit::from_env_or(Some(300)).unwrap().bytes(),
            300 << 20
        );
        assert!(bad_env("x").to_string().contains(MAX_DOCUMENT_ENV));
    }
}

/// Why a document named on a command line (or `-`, standard input) could not be read or decoded.
/// The message names the document (`cannot read fleet file F`, `layout file F`, `--inventory F`);
/// the source says why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// Standard input could not be read (or held more than the cap).
    #[error("cannot read {what} from standard input")]
    ReadStdin {
        /// What the document should hold.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file could not be read: missing, not a regular file, over the cap.
    #[error("cannot read {what} file {}", .path.display())]
    Read {
        /// What the document should hold.
        what: String,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The document does not decode.
    #[error("{what} file {}", .path.display())]
    Decode {
        /// What the document should hold.
        what: String,
        /// The file.
        path: std::path::PathBuf,
        /// The decoder's error (a [`gpu_core::ConfigDocError`]).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The document given with a flag (`--inventory F`): any of the above, or the decoder's error
    /// alone (the flag names the file).
    #[error("{flag} {}", .path.display())]
    Flag {
        /// The flag.
        flag: String,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl InputError {
    fn flagged(
        flag: &str,
        path: &Path,
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    ) -> Self {
        InputError::Flag {
            flag: flag.to_owned(),
            path: path.to_owned(),
            source,
        }
    }

    fn read(path: &Path, what: &str, source: io::Error) -> Self {
        let what = what.to_owned();
        match path.as_os_str() == "-" {
            true => InputError::ReadStdin { what, source },
            false => InputError::Read {
                what,
                path: path.to_owned(),
                source,
            },
        }
    }
}

/// Reads a document named on a command line ([`read_document`]; `-` reads standard input).
///
/// # Errors
/// [`InputError::ReadStdin`], [`InputError::Read`].
pub fn read_input(path: &Path, what: &str, limit: DocumentLimit) -> Result<String, InputError> {
    read_document(path, what, limit).map_err(|e| InputError::read(path, what, e))
}

/// Decodes a document named on a command line as it is read (`-` reads standard input), at most
/// `limit` bytes: `decode` gets the reader ([`open_document`]) and the cap in bytes. The text is
/// never held whole unless the decoder needs it. With `flag` (`--inventory`) every error is
/// given in `FLAG PATH`, and a document that does not decode needs no more naming.
///
/// # Errors
/// As [`read_input`] for the file and its reading (a read stopped at the cap says how to raise
/// it); [`InputError::Decode`] for a document that does not decode; [`InputError::Flag`] around
/// either with `flag`.
pub fn decode_input<T>(
    path: &Path,
    what: &str,
    flag: Option<&str>,
    limit: DocumentLimit,
    decode: impl FnOnce(&mut Document<'static>, usize) -> Result<T, gpu_core::CoreError>,
) -> Result<T, InputError> {
    let failed = match open_document(path, what, limit) {
        Err(e) => InputError::read(path, what, e),
        Ok(mut doc) => match (decode(&mut doc, limit.bytes()), doc.failure()) {
            (Ok(v), _) => return Ok(v),
            // The decoder stopped because the read did: say why the read stopped.
            (Err(_), Some(read)) => InputError::read(path, what, read),
            (Err(e), None) => {
                let source = Box::new(gpu_core::ConfigDocError(e));
                let Some(flag) = flag else {
                    let (what, path) = (what.to_owned(), path.to_owned());
                    return Err(InputError::Decode { what, path, source });
                };
                return Err(InputError::flagged(flag, path, source));
            }
        },
    };
    Err(match flag {
        Some(flag) => InputError::flagged(flag, path, Box::new(failed)),
        None => failed,
    })
}
