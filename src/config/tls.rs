//! `[server.tls]`: the certificate and key files, as written and
//! validated. Loading and reloading the certificate is [`crate::tls`]'s.

use std::path::PathBuf;

/// `[server.tls]` as written.
#[derive(Debug, serde::Deserialize, serde::Serialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// PEM file: the certificate chain, leaf first.
    pub cert_file: Option<String>,
    /// PEM file: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<String>,
}

/// The files of `[server.tls]` (paths relative to the gateway's working directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first (PEM).
    pub cert_file: PathBuf,
    /// Private key (PEM).
    pub key_file: PathBuf,
}

impl TlsFiles {
    /// Validates `[server.tls]`, reporting each mistake through `err(path, message)`.
    /// The files themselves are read when the gateway starts (and by `check-config`).
    pub fn validate(raw: Option<&RawTls>, mut err: impl FnMut(&str, &str)) -> Option<TlsFiles> {
        let raw = raw?;
        let mut path = |field: &str, v: &Option<String>| match v.as_deref() {
            Some(p) if !p.trim().is_empty() => Some(PathBuf::from(p)),
            Some(_) => {
                err(&format!("server.tls.{field}"), "must not be empty");
                None
            }
            None => {
                err(&format!("server.tls.{field}"), "required in [server.tls]");
                None
            }
        };
        let cert_file = path("cert_file", &raw.cert_file);
        let key_file = path("key_file", &raw.key_file);
        Some(TlsFiles {
            cert_file: cert_file?,
            key_file: key_file?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_missing_and_empty_files() {
        let mut errors = Vec::new();
        let raw = RawTls {
            cert_file: Some(" ".into()),
            key_file: None,
        };
        let got = TlsFiles::validate(Some(&raw), |p, m| errors.push(format!("{p}: {m}")));
        assert_eq!(got, None);
        assert_eq!(
            errors,
            vec![
                "server.tls.cert_file: must not be empty",
                "server.tls.key_file: required in [server.tls]"
            ]
        );
        assert_eq!(TlsFiles::validate(None, |_, _| panic!()), None);
    }
}
