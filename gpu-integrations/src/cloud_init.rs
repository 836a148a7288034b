//! cloud-init `write_files` that license an NVIDIA vGPU guest.
//!
//! The host never consumes a vGPU license: the guest driver does, with a client configuration
//! token in `/etc/nvidia/ClientConfigToken/` and a `FeatureType` in `/etc/nvidia/gridd.conf`.
//! NVIDIA's licensing guide asks for mode 0744 on the token.
//!
//! `FeatureType` values, from the sample `gridd.conf` in NVIDIA's *Virtual GPU Software Client
//! Licensing User Guide* ("Configuring a Licensed Client on Linux"): `0` unlicensed, `1` NVIDIA
//! vGPU (the driver picks the edition from the vGPU type), `2` NVIDIA RTX Virtual Workstation
//! (a GPU passed through whole), `4` NVIDIA Virtual Compute Server. Every value but `0` asks
//! the guest to acquire a license, so it needs a token: [`guest_files`] refuses to render such
//! a `gridd.conf` without one, and [`license_check`] says the same of a rendered cloud-config.

use crate::error::{IntegrationError, Result, error, fail};
use serde::Serialize;

/// Where the guest driver looks for client configuration tokens.
pub const TOKEN_DIR: &str = "/etc/nvidia/ClientConfigToken";
/// The licensing daemon's configuration file.
pub const GRIDD_CONF: &str = "/etc/nvidia/gridd.conf";
/// The largest token accepted; real tokens are a few kilobytes.
pub const MAX_TOKEN_BYTES: usize = 256 * 1024;

/// A cloud-config document holding only `write_files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CloudConfig {
    /// Files to write in the guest.
    pub write_files: Vec<WriteFile>,
}

/// One `write_files` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WriteFile {
    /// Absolute path in the guest.
    pub path: String,
    /// `user:group`.
    pub owner: String,
    /// Octal mode as a quoted string.
    pub permissions: String,
    /// `b64` when `content` is base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// The file's content.
    pub content: String,
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(B64[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The guest file name of a token: the given file's name when it is a plain `*.tok` name, else
/// `client_configuration_token.tok`.
pub fn token_file_name(source_name: Option<&str>) -> String {
    match source_name {
        Some(n)
            if n.ends_with(".tok")
                && n.len() > 4
                && !n.starts_with('.')
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) =>
        {
            n.to_owned()
        }
        _ => "client_configuration_token.tok".to_owned(),
    }
}

/// The licensed feature a guest asks for: `gridd.conf`'s `FeatureType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FeatureType {
    /// `0`: no license is acquired.
    Unlicensed,
    /// `1`: NVIDIA vGPU; the guest driver picks the edition from the vGPU type.
    #[default]
    Vgpu,
    /// `2`: NVIDIA RTX Virtual Workstation (also a GPU passed through whole).
    RtxVirtualWorkstation,
    /// `4`: NVIDIA Virtual Compute Server.
    VirtualComputeServer,
}

impl FeatureType {
    /// The number `gridd.conf` carries.
    pub fn code(self) -> u8 {
        match self {
            FeatureType::Unlicensed => 0,
            FeatureType::Vgpu => 1,
            FeatureType::RtxVirtualWorkstation => 2,
            FeatureType::VirtualComputeServer => 4,
        }
    }

    /// What the number means, for people and for the comment in `gridd.conf`.
    pub fn describe(self) -> &'static str {
        match self {
            FeatureType::Unlicensed => "unlicensed",
            FeatureType::Vgpu => "NVIDIA vGPU",
            FeatureType::RtxVirtualWorkstation => "NVIDIA RTX Virtual Workstation",
            FeatureType::VirtualComputeServer => "NVIDIA Virtual Compute Server",
        }
    }

    /// Whether the guest acquires a license (every value but `0`), so needs a token.
    pub fn needs_token(self) -> bool {
        self != FeatureType::Unlicensed
    }
}

impl std::str::FromStr for FeatureType {
    type Err = IntegrationError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "0" => Ok(FeatureType::Unlicensed),
            "1" => Ok(FeatureType::Vgpu),
            "2" => Ok(FeatureType::RtxVirtualWorkstation),
            "4" => Ok(FeatureType::VirtualComputeServer),
            other => Err(error!(
                Invalid, "feature type";
                "feature type {other:?}: gridd.conf's FeatureType is 0 (unlicensed), 1 (NVIDIA vGPU), 2 (NVIDIA RTX Virtual Workstation) or 4 (NVIDIA Virtual Compute Server)"
            )),
        }
    }
}

/// The cloud-config for a token read from a file named `source_name`, as NVIDIA vGPU
/// (`FeatureType=1`): [`guest_files`] with a token.
///
/// # Errors
/// When the token is empty, larger than [`MAX_TOKEN_BYTES`], or not text.
pub fn license_files(token: &[u8], source_name: Option<&str>) -> Result<CloudConfig> {
    guest_files(Some((token, source_name)), FeatureType::Vgpu)
}

/// The cloud-config licensing a guest for `feature`: the token (read from a file named by its
/// second part) and `gridd.conf`. Without a token only `FeatureType=0` is rendered.
///
/// # Errors
/// A licensed `feature` without a token ([`IntegrationError::Invalid`] naming
/// `--license-token`); a token that is empty, larger than [`MAX_TOKEN_BYTES`], or not text.
pub fn guest_files(
    token: Option<(&[u8], Option<&str>)>,
    feature: FeatureType,
) -> Result<CloudConfig> {
    let gridd = WriteFile {
        path: GRIDD_CONF.into(),
        owner: "root:root".into(),
        permissions: "0644".into(),
        encoding: None,
        content: format!(
            "# Written by gpuslice: {}.\nFeatureType={}\n",
            match feature {
                FeatureType::Unlicensed => "this guest acquires no license".to_owned(),
                f => format!("license this guest as {}", f.describe()),
            },
            feature.code()
        ),
    };
    let Some((token, source_name)) = token else {
        if feature.needs_token() {
            fail!(
                Invalid, "license token";
                "FeatureType={} ({}) needs a client configuration token: give --license-token FILE (the .tok file downloaded from the NVIDIA License System), or --feature-type 0 for an unlicensed guest",
                feature.code(),
                feature.describe()
            );
        }
        return Ok(CloudConfig {
            write_files: vec![gridd],
        });
    };
    if token.iter().all(u8::is_ascii_whitespace) {
        fail!(Invalid, "license token"; "the license token is empty");
    }
    if token.len() > MAX_TOKEN_BYTES {
        fail!(
            Invalid, "license token";
            "the license token is {} bytes, more than the {MAX_TOKEN_BYTES} a client configuration token can be",
            token.len()
        );
    }
    std::str::from_utf8(token)
        .ok()
        .filter(|t| t.chars().all(|c| !c.is_control() || c.is_ascii_whitespace()))
        .ok_or_else(|| error!(Invalid, "license token"; "the license token is not text; expected the .tok file downloaded from the NVIDIA License System"))?;
    Ok(CloudConfig {
        write_files: vec![
            WriteFile {
                path: format!("{TOKEN_DIR}/{}", token_file_name(source_name)),
                owner: "root:root".into(),
                permissions: "0744".into(),
                encoding: Some("b64".into()),
                content: base64(token),
            },
            gridd,
        ],
    })
}

/// The document as cloud-init reads it: `#cloud-config` then YAML.
///
/// # Errors
/// A YAML serialization error.
pub fn to_yaml(config: &CloudConfig) -> Result<String> {
    Ok(format!(
        "#cloud-config\n{}",
        super::yaml::to_string(config)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc);
        }
    }

    #[test]
    fn token_names_that_could_escape_the_directory_are_replaced() {
        assert_eq!(
            token_file_name(Some("client_configuration_token_04-11-2024.tok")),
            "client_configuration_token_04-11-2024.tok"
        );
        for bad in ["../x.tok", ".tok", "a b.tok", "token.txt"] {
            assert_eq!(token_file_name(Some(bad)), "client_configuration_token.tok");
        }
    }

    #[test]
    fn empty_and_binary_tokens_are_refused() {
        assert!(license_files(b"  \n", None).is_err());
        assert!(license_files(&[0u8, 159, 146, 150], None).is_err());
        assert!(license_files(b"eyJhbGciOi.token", None).is_ok());
    }

    #[test]
    fn the_feature_type_given_is_the_one_gridd_conf_carries() {
        let c = guest_files(Some((b"tok", None)), "4".parse().unwrap()).unwrap();
        let gridd = c.write_files.iter().find(|f| f.path == GRIDD_CONF).unwrap();
        assert!(
            gridd.content.ends_with("\nFeatureType=4\n"),
            "{}",
            gridd.content
        );
        assert!(gridd.content.contains("NVIDIA Virtual Compute Server"));
    }

    #[test]
    fn feature_types_nvidia_does_not_define_are_refused_with_the_ones_it_does() {
        for bad in ["3", "5", "-1", "vgpu", ""] {
            let e = bad.parse::<FeatureType>().unwrap_err().to_string();
            assert!(
                e.contains("0 (unlicensed)") && e.contains("4 (NVIDIA Virtual Compute Server)"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_licensed_guest_without_a_token_is_refused_naming_the_option() {
        let e = guest_files(None, FeatureType::RtxVirtualWorkstation)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("FeatureType=2") && e.contains("--license-token"),
            "{e}"
        );
        let unlicensed = guest_files(None, FeatureType::Unlicensed).unwrap();
        assert_eq!(unlicensed.write_files.len(), 1);
        assert!(
            unlicensed.write_files[0]
                .content
                .ends_with("FeatureType=0\n")
        );
    }
}
