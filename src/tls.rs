//! TLS on the gateway's listener (`[server.tls]`).
//!
//! - rustls with the aws-lc-rs crypto provider, the one reqwest already
//!   builds for the upstream client (no second crypto library). TLS 1.2
//!   and 1.3; HTTP/2 and HTTP/1.1 offered by ALPN.
//! - The certificate is served through a resolver holding the current
//!   chain and key: a renewed certificate is read on SIGHUP and when the
//!   file or its directory changes, checked (PEM, a private key that matches
//!   the leaf's public key) and swapped in for new handshakes. An invalid
//!   one is logged and the running certificate stays. Connections already
//!   open keep the certificate they were opened with.
//! - Enabling, disabling or moving the files needs a restart, like
//!   `server.listen` ([`crate::config::reload::keep_restart_only`]).
//! - Handshakes run in their own tasks, so a slow or silent client never
//!   holds up accepting others, and are bounded by [`HANDSHAKE_TIMEOUT`].
//!   A connection whose first byte is not a TLS handshake record (plain
//!   HTTP sent to the TLS port) is closed without a byte written: an
//!   HTTP client sees the connection closed with no response, never TLS
//!   alert bytes it would try to read as HTTP.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use crate::config::reload::{self, Trigger};
use crate::config::tls::TlsFiles;
use crate::connections::{Accept, Accepted, Connections};

/// Longest a client may take from connecting to a finished handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS record carrying a handshake message (RFC 8446
/// section 5.1, `ContentType.handshake`).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The crypto provider reqwest's rustls builds with.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Reads and checks the certificate chain and key of `files`.
/// Errors name the file and what is wrong with it.
pub fn load_certified_key(files: &TlsFiles) -> Result<CertifiedKey, String> {
    let cert_path = files.cert_file.display();
    let key_path = files.key_file.display();
    let cert_pem = std::fs::read(&files.cert_file)
        .map_err(|e| format!("server.tls.cert_file {cert_path}: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("server.tls.cert_file {cert_path}: not PEM certificates: {e}"))?;
    if chain.is_empty() {
        return Err(format!(
            "server.tls.cert_file {cert_path}: no certificate (BEGIN CERTIFICATE) found"
        ));
    }
    let key_pem = std::fs::read(&files.key_file)
        .map_err(|e| format!("server.tls.key_file {key_path}: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("server.tls.key_file {key_path}: no usable private key: {e}"))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        format!("server.tls: the key {key_path} does not fit the certificate {cert_path}: {e}")
    })
}

fn fingerprint(key: &CertifiedKey) -> String {
    key.cert
        .first()
        .map(|c| hex::encode(&Sha256::digest(c.as_ref())[..8]))
        .unwrap_or_default()
}

/// Hands every handshake the current certificate.
#[derive(Debug)]
struct CertResolver {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// What a certificate reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertReload {
    /// A new certificate is served; its leaf's SHA-256 prefix.
    Renewed(String),
    /// The files hold the certificate already served.
    Unchanged,
    /// The new files are unusable; the running certificate stays.
    Kept(String),
}

/// The listener's TLS configuration and its reloadable certificate.
pub struct Tls {
    files: TlsFiles,
    resolver: Arc<CertResolver>,
    config: Arc<ServerConfig>,
    /// Serialises reloads (a signal and a file event at once).
    reloading: Mutex<()>,
}

impl Tls {
    /// Loads the certificate of `files` and builds the server configuration.
    pub fn new(files: TlsFiles) -> Result<Arc<Tls>, String> {
        let key = load_certified_key(&files)?;
        let resolver = Arc::new(CertResolver {
            current: ArcSwap::from_pointee(key),
        });
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("server.tls: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(Tls {
            files,
            resolver,
            config: Arc::new(config),
            reloading: Mutex::new(()),
        }))
    }

    /// SHA-256 prefix (hex) of the leaf certificate being served.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.resolver.current.load())
    }

    /// Re-reads the files; swaps in a valid new certificate, keeps the
    /// running one otherwise. Logs what it did.
    pub fn reload(&self, trigger: Trigger) -> CertReload {
        let _one = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let cert = self.files.cert_file.display();
        match load_certified_key(&self.files) {
            Err(error) => {
                tracing::error!(%trigger, %error, fingerprint = %self.fingerprint(),
                    "tls certificate reload failed; the running certificate stays");
                CertReload::Kept(error)
            }
            Ok(key) => {
                let new = fingerprint(&key);
                let old = self.fingerprint();
                if new == old {
                    // As for the config: routine on a file event, an answer on SIGHUP.
                    if trigger == Trigger::Signal {
                        tracing::info!(%trigger, cert_file = %cert, fingerprint = %old, "tls certificate unchanged");
                    } else {
                        tracing::debug!(%trigger, cert_file = %cert, fingerprint = %old, "tls certificate unchanged");
                    }
                    return CertReload::Unchanged;
                }
                self.resolver.current.store(Arc::new(key));
                tracing::info!(%trigger, cert_file = %cert, old_fingerprint = %old, fingerprint = %new,
                    "tls certificate reloaded");
                CertReload::Renewed(new)
            }
        }
    }

    /// Reloads on SIGHUP and on changes of the certificate or the key file
    /// (their directories are watched, other entries in them ignored),
    /// until the returned tasks are aborted.
    pub fn spawn_watch(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let tls = self.clone();
        vec![tokio::spawn(reload::watch(
            vec![self.files.cert_file.clone(), self.files.key_file.clone()],
            "the TLS certificate and key",
            move |trigger| {
                tls.reload(trigger);
            },
        ))]
    }

    /// A listener whose connections are TLS streams, handshaken off the
    /// accept path; each holds a slot of `connections` from its accept on.
    pub fn listener(
        self: &Arc<Self>,
        tcp: TcpListener,
        connections: Arc<Connections>,
    ) -> std::io::Result<TlsListener> {
        let (tx, rx) = mpsc::channel(64);
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config.clone());
        let accepting = tokio::spawn(accept_loop(tcp, connections, acceptor, tx));
        Ok(TlsListener { rx, accepting })
    }
}

async fn accept_loop(
    tcp: TcpListener,
    connections: Arc<Connections>,
    acceptor: tokio_rustls::TlsAcceptor,
    tx: mpsc::Sender<Accepted<TlsStream<TcpStream>>>,
) {
    loop {
        let (stream, peer, slot) = connections.accept(&tcp).await;
        // Small SSE frames must leave at once (see `connections::PlainListener`).
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(stream, &acceptor)).await {
                Ok(Ok(io)) => {
                    let _ = tx.send(Accepted { io, peer, slot }).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "tls handshake failed"),
                Err(_) => tracing::debug!(%peer, "tls handshake timed out"),
            }
        });
    }
}

async fn handshake(
    stream: TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    if n == 0 || first[0] != TLS_HANDSHAKE_RECORD {
        // Dropping the stream closes it with nothing written.
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a TLS handshake (plain HTTP to the TLS port?); connection closed",
        ));
    }
    acceptor.accept(stream).await
}

/// A listener yielding handshaken TLS connections.
pub struct TlsListener {
    rx: mpsc::Receiver<Accepted<TlsStream<TcpStream>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        // Stops accepting: the TCP listener lives in this task.
        self.accepting.abort();
    }
}

impl Accept for TlsListener {
    type Io = TlsStream<TcpStream>;

    async fn accept(&mut self) -> Accepted<Self::Io> {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop never ends on its own (it retries errors).
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_and_non_pem_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("c.pem");
        std::fs::write(&cert, "not a certificate").unwrap();
        let files = TlsFiles {
            cert_file: cert.clone(),
            key_file: dir.path().join("missing.pem"),
        };
        let e = load_certified_key(&files).unwrap_err();
        assert!(e.starts_with("server.tls.cert_file"), "{e}");
        assert!(e.contains("no certificate"), "{e}");
    }
}
