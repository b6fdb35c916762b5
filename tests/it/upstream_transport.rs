//! The upstream call's transport, end to end through the real binary (its
//! environment its own, as in a deployment): what the call to an upstream
//! must keep whichever HTTP client makes it. Every peer is on 127.0.0.1.
//!
//! - Proxies from the environment: `HTTP_PROXY` carries a plain upstream's
//!   call in absolute form, `HTTPS_PROXY` a TLS upstream's through a
//!   `CONNECT` tunnel; an upstream host named in `NO_PROXY` is called
//!   direct. A proxy URL's credentials go to the proxy, in the call's
//!   `Proxy-Authorization` or in the tunnel's; an `https://` proxy URL is
//!   reached over TLS.
//! - Trust: the gateway has no CA setting of its own; an upstream's
//!   certificate is checked against the roots `SSL_CERT_FILE` /
//!   `SSL_CERT_DIR` name (the platform's store when neither is set). A
//!   certificate of a CA not among them fails the connect: 502, nothing
//!   charged, the request count given back.
//! - HTTP/2 to an upstream offering it by ALPN, HTTP/1.1 to one offering
//!   only that.
//! - Redirects are never followed: a 302 or 307 is the upstream's failure
//!   (502 naming its status, tokens refunded, the request count spent, the
//!   model's next deployment tried) and its `Location` is never requested.
//! - A connect that never completes fails at `connect_timeout_secs` as a
//!   connect failure (502, voided); an upstream that accepts and never
//!   answers fails at `timeout_secs` (504, tokens refunded, the request
//!   count spent); one that closes without answering is a 502 that keeps
//!   the request count. Each tries the model's next deployment, and none
//!   cools the failing deployment down.
//! - `timeout_secs` covers the answer's body too: a body that stalls fails
//!   the request at it (502, the answer interrupted), no other deployment
//!   tried once an answer came.
//!
//! Existing tests cover neighbours of these: a refused connection
//! (`gateway_errors::an_unreachable_upstream_is_a_502_that_charges_no_tokens`),
//! upstream statuses (`gateway_errors::upstream_failures_refund_tokens_and_free_the_slot`)
//! and HTTP/2 on the gateway's own listener (`tls`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{StatusCode, Version};
use axum::Router;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::config::{model, RawModel, RawUpstream};
use crate::support::*;
use crate::tls::Ca;

/// Tenant `t1`'s daily quotas: nothing refills them within a test, so
/// what is spent stays visible.
const TOKENS: u64 = 100_000;
const REQUESTS: u64 = 100;

/// Every proxy variable the HTTP client reads, both spellings. Each
/// gateway here starts with them empty (the upper-case spelling, set even
/// empty, wins over the lower-case one), then the test's own.
const PROXY_VARS: [&str; 8] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The answer of the in-test upstreams: a chat completion with usage.
const CHAT_ANSWER: &str = r#"{"id":"chatcmpl-transport","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}"#;

/// A gateway process and the directory of its config.
struct Running {
    gw: GatewayProcess,
    _dir: tempfile::TempDir,
}

/// Starts the binary on `config` with no proxy in its environment, then
/// `envs` (both spellings of a proxy variable: see [`proxy_env`]).
async fn start(config: &TestConfig, envs: &[(&str, String)]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let path = config.write(dir.path());
    let mut all: Vec<(&str, &str)> = PROXY_VARS.iter().map(|k| (*k, "")).collect();
    all.extend(envs.iter().map(|(k, v)| (*k, v.as_str())));
    let gw = GatewayProcess::start(&path, &all).await;
    Running { gw, _dir: dir }
}

/// `var` (e.g. `HTTP_PROXY`) set to `value` in both spellings.
fn proxy_env(var: &'static str, value: &str) -> [(&'static str, String); 2] {
    let lower = match var {
        "HTTP_PROXY" => "http_proxy",
        "HTTPS_PROXY" => "https_proxy",
        "NO_PROXY" => "no_proxy",
        other => panic!("not a proxy variable: {other}"),
    };
    [(var, value.to_string()), (lower, value.to_string())]
}

/// The gateway's roots: only the certificates in `ca_file`.
fn trust_env(ca_file: &Path) -> [(&'static str, String); 2] {
    [
        ("SSL_CERT_FILE", ca_file.display().to_string()),
        // Set, an empty list: no directory's roots (the test runner's
        // environment may name the system's).
        ("SSL_CERT_DIR", String::new()),
    ]
}

/// Tenant `t1` with the daily quotas and model `gpt-4o-mini` on deployment
/// `first` alone; when `fallback` (a base URL) is given, deployment `mock`
/// there and model `gpt-4o` on `first` then `mock`.
fn config(first: RawUpstream, fallback: Option<&str>) -> TestConfig {
    let limits = limits().tokens_per_day(TOKENS).requests_per_day(REQUESTS);
    let mut c = TestConfig::standard(fallback.unwrap_or("http://127.0.0.1:9/v1"), 16, limits);
    let name = first.name.clone();
    c.upstreams.push(first);
    c.model("gpt-4o-mini").upstreams = vec![name.clone()];
    if fallback.is_some() {
        c.models.push(RawModel {
            encoding: Some("o200k_base".into()),
            default_max_output_tokens: Some(16),
            max_output_tokens: Some(4096),
            ..model("gpt-4o", &[&name, "mock"])
        });
    } else {
        // No second deployment: the standard one is unused.
        c.models.retain(|m| m.name == "gpt-4o-mini");
        c.upstreams.retain(|u| u.name == name);
    }
    c
}

/// A self-hosted deployment `name` at `base`.
fn deployment(name: &str, base: &str) -> RawUpstream {
    crate::support::config::upstream(name, Kind::SelfHosted, base)
}

/// What the gateway answered one chat request.
struct Answer {
    status: u16,
    body: Value,
    headers: reqwest::header::HeaderMap,
    took: Duration,
}

/// `POST /v1/chat/completions` of `model` saying "hi".
async fn ask(gw: &GatewayProcess, model: &str) -> Answer {
    let started = Instant::now();
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("the gateway answers");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        body,
        headers,
        took: started.elapsed(),
    }
}

/// Tenant `t1`'s (tokens, requests) spent today. The gateway keeps a
/// key's answer for a second: each gateway here is read once.
async fn spent(gw: &GatewayProcess) -> (i64, i64) {
    let v: Value = reqwest::Client::new()
        .get(format!("{}/budget", gw.base_url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["age_micros"], 0, "a fresh read: {v}");
    let of = |name: &str| {
        let b = v["budgets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["scope"] == "tenant:t1" && b["budget"] == name)
            .unwrap_or_else(|| panic!("no {name} in {v}"));
        b["limit"].as_i64().unwrap() - b["remaining"].as_i64().unwrap()
    };
    (of("tokens_per_day"), of("requests_per_day"))
}

/// The gateway's error answer: an OpenAI error of `kind` and `code`
/// saying `message`.
fn assert_error(a: &Answer, status: u16, kind: &str, code: &str, message: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.body["error"]["type"], kind, "{}", a.body);
    assert_eq!(a.body["error"]["code"], code, "{}", a.body);
    assert_eq!(a.body["error"]["message"], message, "{}", a.body);
    assert!(
        !a.body.to_string().contains("127.0.0.1"),
        "an upstream address leaked: {}",
        a.body
    );
}

/// The final line of the gateway's only request so far: an upstream
/// failure with `status` and error label `error`.
async fn assert_finished(gw: &GatewayProcess, deployment: &str, status: u16, error: &str) {
    let line = &gw.wait_log("request finished", 1).await[0]["fields"];
    assert_eq!(line["outcome"], "upstream_failed", "{line}");
    assert_eq!(line["status"], status, "{line}");
    assert_eq!(line["error"], error, "{line}");
    assert_eq!(line["deployment"], deployment, "{line}");
}

/// The `error` of every "upstream request failed" line once there are
/// `count` (transport failures: no answer came).
async fn transport_failures(gw: &GatewayProcess, count: usize) -> Vec<String> {
    gw.wait_log("upstream request failed", count)
        .await
        .iter()
        .map(|l| {
            l["fields"]["error"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// `budgetgate_upstream_requests_total` of `deployment` with `status`.
async fn upstream_requests(gw: &GatewayProcess, deployment: &str, status: &str) -> f64 {
    gw.metric(
        "budgetgate_upstream_requests_total",
        &[("deployment", deployment), ("status", status)],
    )
    .await
}

/// A loopback port nobody listens on (bound, then released).
fn closed_port_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}")
}

/// Serves `app` on a loopback port.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// An upstream answering every request with [`CHAT_ANSWER`], counting them.
async fn counting() -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = Router::new().fallback(move || {
        let h = h.clone();
        async move {
            h.fetch_add(1, Ordering::SeqCst);
            ([("content-type", "application/json")], CHAT_ANSWER)
        }
    });
    (serve(app).await, hits)
}

/// Reads `conn` until the end of a request head; the bytes read (head
/// and whatever followed it) and where the head ends. `None` at EOF.
async fn read_head<S: AsyncRead + Unpin>(conn: &mut S) -> Option<(Vec<u8>, usize)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some((got, i + 4));
        }
        let n = conn.read(&mut buf).await.ok()?;
        if n == 0 || got.len() > 1 << 20 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// An HTTP proxy on a loopback port: records the request line of each
/// connection's first request (`CONNECT host:port`, or the method and
/// absolute-form target), then tunnels or forwards (in origin form) to
/// the target. Later requests on a forwarded connection pass unrecorded:
/// each gateway here sends one request through it.
struct Proxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    /// The `Proxy-Authorization` of each recorded request, when it had one.
    auth: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    async fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let auth = Arc::new(Mutex::new(Vec::new()));
        let (s, a) = (seen.clone(), auth.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(Proxy::relay(conn, s.clone(), a.clone()));
            }
        });
        Proxy { addr, seen, auth }
    }

    /// The same proxy behind TLS, with a certificate of `ca` for
    /// 127.0.0.1: an `https://` proxy URL.
    async fn start_tls(ca: &Ca) -> Proxy {
        let acceptor = tls_acceptor(ca, &[]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let auth = Arc::new(Mutex::new(Vec::new()));
        let (s, a) = (seen.clone(), auth.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (acceptor, s, a) = (acceptor.clone(), s.clone(), a.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(conn).await {
                        Proxy::relay(tls, s, a).await;
                    }
                });
            }
        });
        Proxy { addr, seen, auth }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    fn auth(&self) -> Vec<String> {
        self.auth.lock().unwrap().clone()
    }

    async fn relay<S: AsyncRead + AsyncWrite + Unpin>(
        mut client: S,
        seen: Arc<Mutex<Vec<String>>>,
        auth: Arc<Mutex<Vec<String>>>,
    ) {
        let Some((got, end)) = read_head(&mut client).await else {
            return;
        };
        let head = String::from_utf8_lossy(&got[..end]).into_owned();
        let (line, rest) = head.split_once("\r\n").unwrap_or((&head, ""));
        let mut parts = line.split(' ');
        let (method, target, version) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        seen.lock().unwrap().push(format!("{method} {target}"));
        if let Some(value) = rest.split("\r\n").find_map(|h| {
            let (name, value) = h.split_once(':')?;
            name.eq_ignore_ascii_case("proxy-authorization")
                .then(|| value.trim().to_string())
        }) {
            auth.lock().unwrap().push(value);
        }
        let (authority, first) = if method == "CONNECT" {
            (target.to_string(), Vec::new())
        } else {
            let Some(t) = target.strip_prefix("http://") else {
                let _ = client
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
                return;
            };
            let (authority, path) = t.split_once('/').unwrap_or((t, ""));
            let head = format!("{method} /{path} {version}\r\n{rest}");
            (authority.to_string(), head.into_bytes())
        };
        let Ok(mut up) = TcpStream::connect(&authority).await else {
            let _ = client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                .await;
            return;
        };
        if method == "CONNECT" {
            if client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
        } else if up.write_all(&first).await.is_err() {
            return;
        }
        if up.write_all(&got[end..]).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
    }
}

/// A TLS acceptor with a certificate of `ca` for 127.0.0.1, offering `alpn`.
fn tls_acceptor(ca: &Ca, alpn: &[&[u8]]) -> tokio_rustls::TlsAcceptor {
    let (cert, key) = ca.leaf();
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsAcceptor::from(Arc::new(tls))
}

/// An upstream over TLS with a certificate of `ca` for 127.0.0.1,
/// offering `alpn`: answers every request with [`CHAT_ANSWER`] and records
/// the HTTP version it came in; counts the handshakes that failed.
struct TlsUpstream {
    addr: SocketAddr,
    versions: Arc<Mutex<Vec<Version>>>,
    failed_handshakes: Arc<AtomicUsize>,
}

impl TlsUpstream {
    async fn start(ca: &Ca, alpn: &[&[u8]]) -> TlsUpstream {
        let acceptor = tls_acceptor(ca, alpn);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let versions = Arc::new(Mutex::new(Vec::new()));
        let failed_handshakes = Arc::new(AtomicUsize::new(0));
        let (v, failed) = (versions.clone(), failed_handshakes.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, v, failed) = (acceptor.clone(), v.clone(), failed.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let v = v.clone();
                            async move {
                                v.lock().unwrap().push(req.version());
                                let body = axum::body::Body::new(req.into_body());
                                let _ = axum::body::to_bytes(body, 1 << 20).await;
                                let answer = hyper::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(axum::body::Body::from(CHAT_ANSWER))
                                    .unwrap();
                                Ok::<_, Infallible>(answer)
                            }
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
                });
            }
        });
        TlsUpstream {
            addr,
            versions,
            failed_handshakes,
        }
    }

    fn base_url(&self) -> String {
        format!("https://{}/v1", self.addr)
    }

    fn versions(&self) -> Vec<Version> {
        self.versions.lock().unwrap().clone()
    }
}

/// `ca`'s certificate in a file of its own, in `dir`.
fn ca_file(dir: &Path, name: &str, ca: &Ca) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, ca.pem()).unwrap();
    path
}

// ---------------------------------------------------------------------------
// Proxies from the environment
// ---------------------------------------------------------------------------

/// Fault guarded against: a client that ignores `HTTP_PROXY` (a gateway
/// behind an egress proxy cannot reach its upstreams), or that sends an
/// upstream in `NO_PROXY` through the proxy anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_proxy_carries_a_plain_upstream_call_and_no_proxy_sends_it_direct() {
    let mock = start_mock().await;
    let proxy = Proxy::start().await;
    let c = config(deployment("plain", &mock.base_url()), None);

    // HTTPS_PROXY (a closed port) is not the proxy of an http:// upstream.
    let mut env = proxy_env("HTTP_PROXY", &proxy.url()).to_vec();
    env.extend(proxy_env("HTTPS_PROXY", &closed_port_url()));
    let through = start(&c, &env).await;
    let a = ask(&through.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        proxy.seen(),
        [format!("POST http://{}/v1/chat/completions", mock.addr)],
        "the call went through the proxy in absolute form"
    );
    assert_eq!(mock.state.request_count(), 1);

    env.extend(proxy_env("NO_PROXY", "127.0.0.1"));
    let direct = start(&c, &env).await;
    let a = ask(&direct.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(proxy.seen().len(), 1, "NO_PROXY: not through the proxy");
    assert_eq!(mock.state.request_count(), 2);
}

/// Fault guarded against: a TLS upstream's call sent to the proxy in the
/// clear or not at all (no `CONNECT` tunnel), or through the proxy when
/// its host is in `NO_PROXY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_proxy_tunnels_a_tls_upstream_call_and_no_proxy_sends_it_direct() {
    let ca = Ca::new("transport proxy CA");
    let dir = tempfile::tempdir().unwrap();
    let upstream = TlsUpstream::start(&ca, &[b"h2", b"http/1.1"]).await;
    let proxy = Proxy::start().await;
    let c = config(deployment("tls", &upstream.base_url()), None);

    let mut env = trust_env(&ca_file(dir.path(), "ca.pem", &ca)).to_vec();
    env.extend(proxy_env("HTTPS_PROXY", &proxy.url()));
    // HTTP_PROXY (a closed port) is not the proxy of an https:// upstream.
    env.extend(proxy_env("HTTP_PROXY", &closed_port_url()));
    let through = start(&c, &env).await;
    let a = ask(&through.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        proxy.seen(),
        [format!("CONNECT {}", upstream.addr)],
        "the call went through a tunnel"
    );
    assert_eq!(upstream.versions().len(), 1);

    env.extend(proxy_env("NO_PROXY", "127.0.0.1"));
    let direct = start(&c, &env).await;
    let a = ask(&direct.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(proxy.seen().len(), 1, "NO_PROXY: not through the proxy");
    assert_eq!(upstream.versions().len(), 2);
}

/// Fault guarded against: the credentials of a proxy URL
/// (`http://user:secret@proxy`) dropped, so that an egress proxy that
/// authenticates refuses every call: a plain upstream's call carries them
/// in its own `Proxy-Authorization`, a TLS upstream's in its `CONNECT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_url_s_credentials_go_to_the_proxy() {
    let mock = start_mock().await;
    let proxy = Proxy::start().await;
    let with_user = format!("http://user:secret@{}", proxy.addr);
    let plain = start(
        &config(deployment("plain", &mock.base_url()), None),
        &proxy_env("HTTP_PROXY", &with_user),
    )
    .await;
    let a = ask(&plain.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);

    let ca = Ca::new("transport proxy auth CA");
    let dir = tempfile::tempdir().unwrap();
    let upstream = TlsUpstream::start(&ca, &[b"http/1.1"]).await;
    let mut env = trust_env(&ca_file(dir.path(), "ca.pem", &ca)).to_vec();
    env.extend(proxy_env("HTTPS_PROXY", &with_user));
    let tls = start(&config(deployment("tls", &upstream.base_url()), None), &env).await;
    let a = ask(&tls.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);

    assert_eq!(
        proxy.seen(),
        [
            format!("POST http://{}/v1/chat/completions", mock.addr),
            format!("CONNECT {}", upstream.addr)
        ]
    );
    // base64("user:secret")
    assert_eq!(proxy.auth(), ["Basic dXNlcjpzZWNyZXQ="; 2]);
}

/// Fault guarded against: an `https://` proxy URL (TLS to the proxy
/// itself, as curl and reqwest read it) spoken to in the clear, so that
/// every call through it fails; a TLS upstream behind it still gets its
/// own TLS, HTTP/2 included, inside the proxy's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_proxy_url_is_reached_over_tls() {
    let ca = Ca::new("transport https proxy CA");
    let dir = tempfile::tempdir().unwrap();
    let mock = start_mock().await;
    let proxy = Proxy::start_tls(&ca).await;
    let upstream = TlsUpstream::start(&ca, &[b"h2", b"http/1.1"]).await;
    let mut env = trust_env(&ca_file(dir.path(), "ca.pem", &ca)).to_vec();
    env.extend(proxy_env("HTTP_PROXY", &proxy.https_url()));
    env.extend(proxy_env("HTTPS_PROXY", &proxy.https_url()));
    let plain = start(&config(deployment("plain", &mock.base_url()), None), &env).await;
    let a = ask(&plain.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);
    let tls = start(&config(deployment("tls", &upstream.base_url()), None), &env).await;
    let a = ask(&tls.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        proxy.seen(),
        [
            format!("POST http://{}/v1/chat/completions", mock.addr),
            format!("CONNECT {}", upstream.addr)
        ]
    );
    assert_eq!(upstream.versions(), [Version::HTTP_2]);
}

// ---------------------------------------------------------------------------
// Trust
// ---------------------------------------------------------------------------

/// Fault guarded against: a client with its own fixed roots (a private
/// CA in `SSL_CERT_FILE` not trusted: every upstream behind it
/// unreachable), or one that trusts any certificate (a certificate of an
/// unknown CA accepted), or a failed handshake charged as if the request
/// had been sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_in_ssl_cert_file_is_trusted_and_an_unknown_issuer_is_a_voided_502() {
    let ca = Ca::new("transport upstream CA");
    let other = Ca::new("transport other CA");
    let dir = tempfile::tempdir().unwrap();
    let upstream = TlsUpstream::start(&ca, &[b"h2", b"http/1.1"]).await;
    let c = config(deployment("tls", &upstream.base_url()), None);

    // The upstream's CA is not among the roots.
    let untrusting = start(&c, &trust_env(&ca_file(dir.path(), "other.pem", &other))).await;
    let a = ask(&untrusting.gw, "gpt-4o-mini").await;
    assert_error(
        &a,
        502,
        "upstream_error",
        "bad_gateway",
        "The upstream could not be reached.",
    );
    assert!(upstream.versions().is_empty(), "no request was sent");
    // The upstream was reached: its end of the handshake failed (it may
    // read the gateway's alert after the gateway answered).
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.failed_handshakes.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "no handshake reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        transport_failures(&untrusting.gw, 1).await,
        ["could not connect to upstream tls"]
    );
    assert_finished(&untrusting.gw, "tls", 502, "bad_gateway").await;
    assert_eq!(upstream_requests(&untrusting.gw, "tls", "error").await, 1.0);
    assert_eq!(
        spent(&untrusting.gw).await,
        (0, 0),
        "never sent: voided, the request count too"
    );

    let trusting = start(&c, &trust_env(&ca_file(dir.path(), "ca.pem", &ca))).await;
    let a = ask(&trusting.gw, "gpt-4o-mini").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["choices"][0]["message"]["content"], "hi");
    assert_eq!(upstream.versions().len(), 1);
}

// ---------------------------------------------------------------------------
// HTTP/2
// ---------------------------------------------------------------------------

/// Fault guarded against: a client that speaks only HTTP/1.1 (one
/// connection per concurrent request to a provider that multiplexes), or
/// one that assumes HTTP/2 where the upstream did not offer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_offering_h2_by_alpn_is_called_over_http2_and_one_offering_http1_over_http1() {
    let ca = Ca::new("transport h2 CA");
    let dir = tempfile::tempdir().unwrap();
    let h2 = TlsUpstream::start(&ca, &[b"h2", b"http/1.1"]).await;
    let h1 = TlsUpstream::start(&ca, &[b"http/1.1"]).await;
    let mut c = config(deployment("h2", &h2.base_url()), None);
    c.upstreams.push(deployment("h1", &h1.base_url()));
    c.models.push(RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(16),
        ..model("gpt-4o", &["h1"])
    });
    let running = start(&c, &trust_env(&ca_file(dir.path(), "ca.pem", &ca))).await;
    for _ in 0..2 {
        let a = ask(&running.gw, "gpt-4o-mini").await;
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let a = ask(&running.gw, "gpt-4o").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(h2.versions(), [Version::HTTP_2, Version::HTTP_2]);
    assert_eq!(h1.versions(), [Version::HTTP_11]);
}

// ---------------------------------------------------------------------------
// Redirects
// ---------------------------------------------------------------------------

/// Fault guarded against: a client that follows an upstream's redirect,
/// sending the prompt and the upstream's key to wherever `Location`
/// points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_never_followed_and_is_the_upstreams_failure() {
    let (elsewhere, elsewhere_hits) = counting().await;
    let target = format!("http://{elsewhere}/v1/chat/completions");
    let mut redirects = Vec::new();
    for status in [StatusCode::FOUND, StatusCode::TEMPORARY_REDIRECT] {
        let hits = Arc::new(AtomicUsize::new(0));
        let (h, target) = (hits.clone(), target.clone());
        let app = Router::new().fallback(move || {
            let (h, target) = (h.clone(), target.clone());
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                (status, [("location", target)], "")
            }
        });
        redirects.push((status.as_u16(), serve(app).await, hits));
    }
    let mock = start_mock().await;
    let (s302, s307) = (&redirects[0], &redirects[1]);
    let mut c = config(
        deployment("r302", &format!("http://{}/v1", s302.1)),
        Some(&mock.base_url()),
    );
    c.upstreams
        .push(deployment("r307", &format!("http://{}/v1", s307.1)));
    c.models.push(RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(16),
        ..model("gpt-4o-2024-08-06", &["r307"])
    });
    let running = start(&c, &[]).await;
    let gw = &running.gw;

    for (model, (status, _, hits)) in [("gpt-4o-mini", s302), ("gpt-4o-2024-08-06", s307)] {
        let a = ask(gw, model).await;
        assert_error(
            &a,
            502,
            "upstream_error",
            "bad_gateway",
            &format!("The upstream failed with status {status}."),
        );
        assert!(a.headers.get("location").is_none(), "{:?}", a.headers);
        assert_eq!(hits.load(Ordering::SeqCst), 1, "{status}");
        assert_eq!(
            elsewhere_hits.load(Ordering::SeqCst),
            0,
            "{status} followed"
        );
    }
    assert_eq!(upstream_requests(gw, "r302", "302").await, 1.0);
    assert_eq!(upstream_requests(gw, "r307", "307").await, 1.0);
    assert_eq!(
        spent(gw).await,
        (0, 2),
        "answered: tokens refunded, the request counts spent"
    );

    // Another deployment of the model serves it; the redirect is not followed.
    let a = ask(gw, "gpt-4o").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(s302.2.load(Ordering::SeqCst), 2);
    assert_eq!(mock.state.request_count(), 1);
    assert_eq!(elsewhere_hits.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Connect timeout, response timeout, a closed connection
// ---------------------------------------------------------------------------

/// A loopback listener whose accept queue is full (backlog 0, one
/// connection queued and never accepted): the kernel drops a new
/// connect's SYN, so the connect never completes.
struct Blackhole {
    addr: SocketAddr,
    _listener: TcpListener,
    _queued: Vec<TcpStream>,
}

async fn blackhole() -> Blackhole {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    // Connects complete until the queue is full; two in a row that do not
    // within 300 ms say it is.
    let mut unanswered = 0;
    for _ in 0..16 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(conn) => {
                queued.push(conn.unwrap());
                unanswered = 0;
            }
            Err(_) => unanswered += 1,
        }
        if unanswered == 2 {
            return Blackhole {
                addr,
                _listener: listener,
                _queued: queued,
            };
        }
    }
    panic!("the accept queue of a backlog-0 listener never filled");
}

/// An upstream that accepts connections and reads them, never answering
/// (`close` false) or closing each once a request head came (`close`
/// true); its address and the connections it accepted.
async fn unanswering(close: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if close {
                    let _ = read_head(&mut conn).await;
                    return;
                }
                // Held open, read to its end.
                let mut buf = [0u8; 4096];
                while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    (addr, accepted)
}

/// Fault guarded against: a connect that never completes waiting for the
/// whole request timeout, or counted as a response timeout (504, the
/// request count kept) although nothing was sent; or the deployment
/// cooled down for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_never_completes_is_a_voided_502_at_the_connect_timeout_and_the_next_deployment_serves(
) {
    let hole = blackhole().await;
    let mock = start_mock().await;
    let c = config(
        RawUpstream {
            connect_timeout_secs: Some(1),
            timeout_secs: Some(8),
            ..deployment("blackhole", &format!("http://{}/v1", hole.addr))
        },
        Some(&mock.base_url()),
    );
    let running = start(&c, &[]).await;
    let gw = &running.gw;

    let a = ask(gw, "gpt-4o-mini").await;
    assert_error(
        &a,
        502,
        "upstream_error",
        "bad_gateway",
        "The upstream could not be reached.",
    );
    assert!(
        a.took >= Duration::from_millis(950) && a.took < Duration::from_secs(6),
        "failed at connect_timeout_secs (1 s), not timeout_secs (8 s): {:?}",
        a.took
    );
    assert_eq!(
        transport_failures(gw, 1).await,
        ["could not connect to upstream blackhole"]
    );
    assert_finished(gw, "blackhole", 502, "bad_gateway").await;
    assert_eq!(
        spent(gw).await,
        (0, 0),
        "never sent: voided, the request count too"
    );

    // No cool-down after a connect failure.
    the_next_deployment_serves_after_the_failing_one_again(gw, &mock, "blackhole").await;
}

/// Fault guarded against: an upstream that never answers holding the
/// request past `timeout_secs`, or failing as a connect failure (502,
/// voided) although the request reached it; or the deployment cooled
/// down for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_answers_is_a_504_at_the_timeout_keeping_the_request_count() {
    let (silent, accepted) = unanswering(false).await;
    let mock = start_mock().await;
    let c = config(
        RawUpstream {
            timeout_secs: Some(1),
            ..deployment("silent", &format!("http://{silent}/v1"))
        },
        Some(&mock.base_url()),
    );
    let running = start(&c, &[]).await;
    let gw = &running.gw;

    let a = ask(gw, "gpt-4o-mini").await;
    assert_error(
        &a,
        504,
        "upstream_error",
        "timeout",
        "The upstream did not answer in time.",
    );
    failed_at_one_second(a.took);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(
        transport_failures(gw, 1).await,
        ["upstream silent timed out"]
    );
    assert_finished(gw, "silent", 504, "gateway_timeout").await;
    assert_eq!(
        spent(gw).await,
        (0, 1),
        "sent: tokens refunded, the request count spent"
    );

    // No cool-down after a timeout.
    the_next_deployment_serves_after_the_failing_one_again(gw, &mock, "silent").await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// The model's next deployment serves a second request, after `failing`
/// was tried first again and failed again (it was not cooled down).
async fn the_next_deployment_serves_after_the_failing_one_again(
    gw: &GatewayProcess,
    mock: &mock_upstream::MockUpstream,
    failing: &str,
) {
    let a = ask(gw, "gpt-4o").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.took >= Duration::from_millis(950), "{:?}", a.took);
    assert_eq!(mock.state.request_count(), 1);
    assert_eq!(transport_failures(gw, 2).await.len(), 2);
    assert_eq!(upstream_requests(gw, failing, "error").await, 2.0);
}

/// Fault guarded against: a connection closed after the request was sent
/// taken for a connect failure (voided although the upstream may have
/// done the work), or retried on the same deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_closes_without_answering_is_a_502_keeping_the_request_count() {
    let (closer, accepted) = unanswering(true).await;
    let mock = start_mock().await;
    let c = config(
        deployment("closer", &format!("http://{closer}/v1")),
        Some(&mock.base_url()),
    );
    let running = start(&c, &[]).await;
    let gw = &running.gw;

    let a = ask(gw, "gpt-4o-mini").await;
    assert_error(
        &a,
        502,
        "upstream_error",
        "bad_gateway",
        "The upstream could not be reached.",
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "not retried");
    assert_eq!(
        transport_failures(gw, 1).await,
        ["upstream closer request failed"]
    );
    assert_finished(gw, "closer", 502, "bad_gateway").await;
    assert_eq!(
        spent(gw).await,
        (0, 1),
        "sent: tokens refunded, the request count spent"
    );

    let a = ask(gw, "gpt-4o").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert_eq!(mock.state.request_count(), 1);
    assert_eq!(upstream_requests(gw, "closer", "error").await, 2.0);
}

/// Fault guarded against: `timeout_secs` bounding only the wait for the
/// answer's head, so an answer whose body stalls holds the request (and
/// its reservation) until the server's own limit. The timeout covers the
/// body: the request fails at it, as an interrupted answer, and no other
/// deployment is tried once an answer came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_body_stalls_fails_at_the_timeout_as_interrupted() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalling = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_head(&mut conn).await.is_none() {
                    return;
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"id\":";
                if conn.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                // Held open, the rest of the body never sent.
                let mut buf = [0u8; 4096];
                while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    let mock = start_mock().await;
    let c = config(
        RawUpstream {
            timeout_secs: Some(1),
            ..deployment("stalling", &format!("http://{stalling}/v1"))
        },
        Some(&mock.base_url()),
    );
    let running = start(&c, &[]).await;
    let gw = &running.gw;

    let a = ask(gw, "gpt-4o").await;
    assert_error(
        &a,
        502,
        "upstream_error",
        "bad_gateway",
        "The upstream response was interrupted.",
    );
    failed_at_one_second(a.took);
    assert_eq!(gw.wait_log("upstream body failed", 1).await.len(), 1);
    assert_finished(gw, "stalling", 502, "bad_gateway").await;
    assert_eq!(upstream_requests(gw, "stalling", "200").await, 1.0);
    assert_eq!(mock.state.request_count(), 0, "no other deployment tried");
}

/// The answer came when a 1 s timeout ran out: not before, nor long after.
fn failed_at_one_second(took: Duration) {
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(6),
        "failed at the 1 s timeout: {took:?}"
    );
}
