//! TLS on the listener, on the real binary: the official
//! Python SDK reaches the gateway over HTTPS with a CA made here; HTTP/2 is
//! offered by ALPN; plain HTTP sent to the TLS port is closed without a
//! response and the next HTTPS request still succeeds; a renewed
//! certificate is served without a restart, and an invalid one leaves the
//! running certificate in place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// A certificate authority made for one test (`upstream_transport`'s
/// TLS upstreams too).
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for 127.0.0.1 and localhost: (chain PEM, key PEM).
    pub(crate) fn leaf(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "budgetgate test");
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

struct TlsSetup {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    config: PathBuf,
}

/// Writes `text` to `path` the way certificate tools do: a temporary file
/// renamed into place.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn setup(upstream: &str, ca: &Ca) -> TlsSetup {
    let dir = tempfile::tempdir().unwrap();
    let tls_dir = dir.path().join("tls");
    std::fs::create_dir(&tls_dir).unwrap();
    let cert = tls_dir.join("cert.pem");
    let key = tls_dir.join("key.pem");
    let (c, k) = ca.leaf();
    std::fs::write(&cert, c).unwrap();
    std::fs::write(&key, k).unwrap();
    let mut config = TestConfig::standard(upstream, 20, limits().tpm(100000));
    config.server.tls = Some(budgetgate::config::tls::RawTls {
        cert_file: Some(cert.display().to_string()),
        key_file: Some(key.display().to_string()),
    });
    let config_path = config.write(dir.path());
    TlsSetup {
        _dir: dir,
        cert,
        key,
        config: config_path,
    }
}

/// A client trusting only `ca`, opening a new connection per request.
fn client(ca: &Ca) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap()])
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn healthz(ca: &Ca, root: &str) -> Result<reqwest::Response, reqwest::Error> {
    client(ca).get(format!("{root}/healthz")).send().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_reaches_the_gateway_over_https_and_plain_http_is_closed() {
    let mock = start_mock().await;
    let ca = Ca::new("budgetgate test CA");
    let s = setup(&mock.base_url(), &ca);
    let gw = GatewayProcess::start(&s.config, &[]).await;
    assert!(gw.root.starts_with("https://127.0.0.1:"), "{}", gw.root);

    let ca_file = s.cert.with_file_name("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let out = run_python(
        "sdk_tls.py",
        &format!("{}/v1", gw.root),
        &[ca_file.to_str().unwrap()],
    )
    .await
    .json();
    assert!(!out["chat_content"].as_str().unwrap().is_empty(), "{out}");
    assert!(!out["stream_content"].as_str().unwrap().is_empty(), "{out}");
    assert!(out["remaining_tokens"].is_string(), "{out}");
    let untrusted = out["untrusted_error"].as_str().unwrap_or_default();
    assert!(untrusted.contains("CERTIFICATE_VERIFY_FAILED"), "{out}");

    // HTTP/2 by ALPN.
    let r = healthz(&ca, &gw.root).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.version(), reqwest::Version::HTTP_2);

    // Plain HTTP to the TLS port: closed without a byte of response.
    let addr = gw.root.trim_start_matches("https://").to_string();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got))
        .await
        .expect("the connection was not closed");
    match read {
        Ok(n) => assert_eq!(
            n,
            0,
            "plain HTTP got an answer: {:?}",
            String::from_utf8_lossy(&got)
        ),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let plain = reqwest::get(format!("http://{addr}/healthz")).await;
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");
    // The next HTTPS request is served.
    assert_eq!(healthz(&ca, &gw.root).await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_served_without_a_restart_and_an_invalid_one_keeps_the_old() {
    let mock = start_mock().await;
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let s = setup(&mock.base_url(), &old_ca);
    let gw = GatewayProcess::start(&s.config, &[]).await;
    assert_eq!(healthz(&old_ca, &gw.root).await.unwrap().status(), 200);
    assert!(healthz(&new_ca, &gw.root).await.is_err());

    // Renewal: key first, then the certificate, each renamed into place.
    let (cert, key) = new_ca.leaf();
    replace(&s.key, &key);
    replace(&s.cert, &cert);
    gw.wait_log("tls certificate reloaded", 1).await;
    assert_eq!(healthz(&new_ca, &gw.root).await.unwrap().status(), 200);
    assert!(healthz(&old_ca, &gw.root).await.is_err());

    // An invalid certificate: logged, the renewed one stays.
    replace(
        &s.cert,
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    let failed = gw
        .wait_log(
            "tls certificate reload failed; the running certificate stays",
            1,
        )
        .await;
    assert_eq!(failed[0]["level"], "ERROR");
    assert_eq!(healthz(&new_ca, &gw.root).await.unwrap().status(), 200);

    // A key that does not fit the certificate is refused as well.
    let (cert3, _) = old_ca.leaf();
    replace(&s.cert, &cert3);
    let failed = gw
        .wait_log(
            "tls certificate reload failed; the running certificate stays",
            2,
        )
        .await;
    assert!(
        failed[1]["fields"]["error"]
            .as_str()
            .unwrap()
            .contains("does not fit"),
        "{}",
        failed[1]
    );
    assert_eq!(healthz(&new_ca, &gw.root).await.unwrap().status(), 200);

    // SIGHUP reloads as well (here: the pair on disk is still unusable).
    gw.signal("HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let by_signal = gw
            .logs_with("tls certificate reload failed; the running certificate stays")
            .into_iter()
            .filter(|l| l["fields"]["trigger"] == "sighup")
            .count();
        if by_signal > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload on SIGHUP:\n{}",
            gw.dump_logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(healthz(&new_ca, &gw.root).await.unwrap().status(), 200);
}

#[test]
fn check_config_reads_the_tls_files() {
    let ca = Ca::new("check CA");
    let s = setup("http://127.0.0.1:9/v1", &ca);
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
            .args(["check-config", "--config"])
            .arg(&s.config)
            .output()
            .unwrap()
    };
    assert!(run().status.success());
    let (_, other_key) = ca.leaf();
    std::fs::write(&s.key, other_key).unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "",
        "errors go to stderr"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not fit the certificate"), "{stderr}");
}

/// The certificate's watcher says it watches the certificate (not "the
/// config file", which only the config's watcher says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_watcher_names_the_certificate() {
    let ca = Ca::new("watch CA");
    let s = setup("http://127.0.0.1:9/v1", &ca);
    let gw = GatewayProcess::start(&s.config, &[]).await;
    let lines = gw
        .wait_log("watching the TLS certificate and key for changes", 1)
        .await;
    assert_eq!(
        lines[0]
            .pointer("/fields/file")
            .and_then(serde_json::Value::as_str),
        Some(s.cert.to_string_lossy().as_ref())
    );
    gw.wait_log("watching the config file for changes", 1).await;
    assert_eq!(
        gw.logs_with("watching the config file for changes").len(),
        1,
        "only the config's watcher watches the config file"
    );
}
