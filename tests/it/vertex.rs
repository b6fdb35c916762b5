//! `kind = "vertex"`: Claude on Vertex AI through the gateway
//! to the mock Vertex (`examples/mock_upstream/vertex.rs`), which checks
//! every bearer token (tokens it issued, unexpired; service-account JWTs
//! signed by the test key) and the project and region of every path.
//! Service-account tokens are checked again by PyJWT (`vertex_jwt.py`,
//! pinned in `tests/python/requirements.txt`), an implementation that
//! shares nothing with the gateway's crate.
//!
//! Endpoints: `streamRawPredict` (streams) and `rawPredict`; credentials:
//! a service-account key file (self-signed JWT), an `authorized_user`
//! file (its `token_uri` at the mock's token endpoint) and the metadata
//! server (`GCE_METADATA_HOST`, in a gateway process of its own).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::raw::RawUpstream;
use budgetgate::config::vertex::RawVertex;
use serde_json::{json, Value};

use crate::support::mock_upstream::vertex::{self as mock, ServiceAccount, VertexMock};
use crate::support::*;

const PROJECT: &str = "acme-prod";
pub(crate) const EAST: &str = "us-east5";
const WEST: &str = "europe-west1";
const EMAIL: &str = "gateway@acme-prod.iam.gserviceaccount.com";
const KID: &str = "test-key-1";

/// The test's RSA key (made once per process by `vertex_jwt.py keygen`).
struct TestKey {
    private_pem: String,
    public_pem: String,
    public_der: Vec<u8>,
}

fn test_key() -> &'static TestKey {
    static KEY_PAIR: OnceLock<TestKey> = OnceLock::new();
    KEY_PAIR.get_or_init(|| {
        let out = std::process::Command::new(python::python())
            .arg(repo_path("tests/python/vertex_jwt.py"))
            .arg("keygen")
            .output()
            .expect("run vertex_jwt.py keygen");
        assert!(
            out.status.success(),
            "keygen: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("keygen JSON");
        let hex = v["public_pkcs1_der_hex"].as_str().unwrap_or_default();
        let public_der = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        TestKey {
            private_pem: v["private_pem"].as_str().unwrap_or_default().into(),
            public_pem: v["public_pem"].as_str().unwrap_or_default().into(),
            public_der,
        }
    })
}

/// The mock serving (PROJECT, EAST) and (PROJECT, WEST), knowing the test key.
pub(crate) async fn start_vertex() -> VertexMock {
    let m = mock::start(PROJECT, EAST).await.expect("mock vertex");
    m.state.serve(PROJECT, WEST);
    m.state.add_service_account(ServiceAccount {
        client_email: EMAIL.into(),
        private_key_id: KID.into(),
        public_key_der: test_key().public_der.clone(),
    });
    m.state.messages.set_output_tokens(50);
    m
}

/// A service-account key file for the test key, its `token_uri` at `mock`.
pub(crate) fn key_file(dir: &Path, mock: &VertexMock) -> PathBuf {
    let path = dir.join("sa.json");
    let key = json!({
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": KID,
        "private_key": test_key().private_pem,
        "client_email": EMAIL,
        "client_id": "1234567890",
        "token_uri": format!("{}/token", mock.root_url()),
    });
    std::fs::write(&path, key.to_string()).expect("write the key file");
    path
}

/// A Vertex deployment of `mock` in `region`, with `credentials_file`.
pub(crate) fn deployment(
    name: &str,
    mock: &VertexMock,
    region: &str,
    credentials: Option<&Path>,
) -> RawUpstream {
    RawUpstream {
        name: name.into(),
        kind: Some("vertex".into()),
        base_url: mock.root_url(),
        forward_client_headers: vec!["x-mock-messages".into(), "x-mock-vertex".into()],
        vertex: Some(RawVertex {
            project: Some(PROJECT.into()),
            region: Some(region.into()),
            credentials_file: credentials.map(|p| p.display().to_string()),
            publisher: None,
        }),
        ..RawUpstream::default()
    }
}

/// `claude-test` served by `upstreams` in order (as `messages.rs` configures
/// it for Anthropic deployments), tenant `t1`.
fn config(upstreams: Vec<RawUpstream>, tenant_limits: Limits) -> TestConfig {
    let mut c = TestConfig::new();
    c.estimation.stream_extension_step = Some(256);
    let names: Vec<String> = upstreams.iter().map(|u| u.name.clone()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    c.upstreams = upstreams;
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        max_output_tokens: Some(64000),
        token_ratio: Some(1000),
        anthropic_betas: vec!["allowed-beta-2025".into()],
        ..config::model("claude-test", &names)
    });
    c.tenants
        .push(config::tenant("t1", "k1", KEY, tenant_limits));
    c
}

fn body(max_tokens: u64, stream: bool) -> Value {
    json!({"model": "claude-test", "max_tokens": max_tokens, "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

async fn post(root: &str, b: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(format!("{root}/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.json(b).send().await.expect("POST /v1/messages")
}

/// Runs `vertex_jwt.py verify` on `jwt`; the claims.
fn pyjwt_claims(jwt: &str) -> Value {
    let out = std::process::Command::new(python::python())
        .arg(repo_path("tests/python/vertex_jwt.py"))
        .args(["verify", &test_key().public_pem, EMAIL, KID, jwt])
        .output()
        .expect("run vertex_jwt.py verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "PyJWT refused the assertion: {stdout}"
    );
    serde_json::from_str::<Value>(&stdout).expect("verify JSON")["claims"].clone()
}

fn upstream_scope(name: &str) -> Scope {
    Scope::Upstream(name.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_answers_go_to_the_regional_endpoint_with_a_verified_service_account_token() {
    let m = start_vertex().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &m);
    let gw = config(
        vec![deployment("east", &m, EAST, Some(&key))],
        limits().rpm(100).tpm(100_000),
    )
    .start()
    .await;
    let r = post(
        &gw.root_url(),
        &body(1000, true),
        &[
            ("anthropic-beta", "allowed-beta-2025"),
            ("x-mock-messages", "input=7"),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: message_stop"), "{text}");
    let r = post(
        &gw.root_url(),
        &body(1000, false),
        &[("x-mock-messages", "input=7")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["usage"]["output_tokens"], 50);

    let sent = m.state.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        (sent[0].method.as_str(), sent[1].method.as_str()),
        ("streamRawPredict", "rawPredict")
    );
    for s in &sent {
        assert_eq!((s.project.as_str(), s.region.as_str()), (PROJECT, EAST));
        assert_eq!(s.model, "claude-test", "the model in the path");
        assert!(s.body.get("model").is_none(), "{}", s.body);
        assert_eq!(s.body["anthropic_version"], "vertex-2023-10-16");
        assert_eq!(
            s.header("anthropic-version"),
            None,
            "the version goes in the body"
        );
        assert_eq!(s.header("x-api-key"), None);
    }
    assert_eq!(sent[0].header("anthropic-beta"), Some("allowed-beta-2025"));
    // The service account's own JWT (no token endpoint call), checked by PyJWT.
    assert_eq!(m.state.refused(), 0);
    assert!(m.state.token_requests().is_empty());
    let bearers = m.state.bearers.lock().unwrap().clone();
    let claims = pyjwt_claims(&bearers[0]);
    assert_eq!(claims["scope"], mock::SCOPE);
    assert!(claims["exp"].as_u64().unwrap() > claims["iat"].as_u64().unwrap());

    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Rpm).await, 2);
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 2 * (7 + 50));
}

/// The same requests (cache reads and writes, streamed and not) on an
/// `anthropic` and a `vertex` deployment: the same estimate (the
/// reservation behind `anthropic-ratelimit-tokens-remaining`), the same
/// usage and the same charges to the tenant's and the deployment's budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimate_usage_and_cache_accounting_match_anthropic_deployments() {
    let scenario = "input=7,cache_read=10000,cache_creation=2000";
    let deployment_limits = limits()
        .tpm(1_000_000)
        .input_tpm(1_000_000)
        .output_tpm(1_000_000);
    let tenant_limits = limits().tpm(100_000).input_tpm(100_000).output_tpm(100_000);
    let mut seen = Vec::new();
    for kind in ["anthropic", "vertex"] {
        let anthropic = start_mock().await;
        anthropic.state.set_output_tokens(50);
        let v = start_vertex().await;
        let dir = tempfile::tempdir().unwrap();
        let key = key_file(dir.path(), &v);
        let mut u = if kind == "vertex" {
            deployment("d", &v, EAST, Some(&key))
        } else {
            config::RawUpstream {
                api_key_env: Some("CARGO_PKG_NAME".into()),
                forward_client_headers: vec!["x-mock-messages".into()],
                ..config::upstream("d", Kind::Anthropic, &anthropic.root_url())
            }
        };
        u.limits = deployment_limits.clone();
        let gw = config(vec![u], tenant_limits.clone()).start().await;
        let mut figures = Vec::new();
        for stream in [false, true] {
            let r = post(
                &gw.root_url(),
                &body(1000, stream),
                &[("x-mock-messages", scenario)],
            )
            .await;
            assert_eq!(r.status(), 200, "{kind}");
            figures.push(must_header(&r, "anthropic-ratelimit-tokens-remaining"));
            figures.push(must_header(
                &r,
                "anthropic-ratelimit-output-tokens-remaining",
            ));
            let text = r.text().await.unwrap();
            let usage = if stream {
                text.lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                    .filter(|e| e["type"] == "message_delta")
                    .map(|e| e["usage"].clone())
                    .next_back()
                    .unwrap_or_default()
            } else {
                serde_json::from_str::<Value>(&text).unwrap()["usage"].clone()
            };
            figures.push(usage.to_string());
            gw.all_settled().await;
            for scope in [Scope::Tenant("t1".into()), upstream_scope("d")] {
                for b in [BudgetName::Tpm, BudgetName::InputTpm, BudgetName::OutputTpm] {
                    figures.push(format!(
                        "{scope:?} {b:?} {}",
                        gw.used(scope.clone(), b).await
                    ));
                }
            }
        }
        seen.push(figures);
    }
    assert_eq!(seen[0], seen[1], "anthropic, then vertex");
    assert!(
        seen[1]
            .iter()
            .any(|f| f.contains("Tenant(\"t1\") Tpm 24114")),
        "{:?}",
        seen[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_region_cools_down_and_the_next_region_serves_the_request() {
    let m = start_vertex().await;
    m.state.throttle_region(EAST);
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &m);
    let mut east = deployment("east", &m, EAST, Some(&key));
    let mut west = deployment("west", &m, WEST, Some(&key));
    east.limits = limits().tpm(100_000);
    west.limits = limits().tpm(100_000);
    let gw = config(vec![east, west], limits().tpm(100_000))
        .start()
        .await;
    for _ in 0..2 {
        let r = post(
            &gw.root_url(),
            &body(100, true),
            &[("x-mock-messages", "input=7")],
        )
        .await;
        assert_eq!(r.status(), 200, "no client-visible error");
        assert!(r.text().await.unwrap().contains("event: message_stop"));
    }
    let regions: Vec<String> = m
        .state
        .requests()
        .iter()
        .map(|r| r.region.clone())
        .collect();
    assert_eq!(regions, [EAST, WEST, WEST], "east once, then cooling down");
    gw.all_settled().await;
    assert_eq!(
        gw.used(upstream_scope("east"), BudgetName::Tpm).await,
        0,
        "refunded"
    );
    assert_eq!(
        gw.used(upstream_scope("west"), BudgetName::Tpm).await,
        2 * (7 + 50)
    );
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 2 * (7 + 50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_everywhere_answers_429_with_retry_after() {
    let m = start_vertex().await;
    m.state.throttle_region(EAST);
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &m);
    let mut u = deployment("east", &m, EAST, Some(&key));
    u.cooldown_secs = Some(7);
    let gw = config(vec![u], limits().tpm(100_000)).start().await;
    let r = post(&gw.root_url(), &body(100, false), &[]).await;
    assert_eq!(r.status(), 429);
    assert_eq!(must_header(&r, "retry-after"), "7");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    // Cooling down: the next request does not reach the region.
    let r = post(&gw.root_url(), &body(100, false), &[]).await;
    assert_eq!(r.status(), 429);
    assert!(header(&r, "retry-after").is_some());
    assert_eq!(m.state.requests().len(), 1);
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 0, "refunded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_argument_is_a_400_invalid_request_error_with_the_clouds_message() {
    let m = start_vertex().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &m);
    let gw = config(
        vec![deployment("east", &m, EAST, Some(&key))],
        limits().tpm(100_000),
    )
    .start()
    .await;
    let r = post(
        &gw.root_url(),
        &body(100, false),
        &[("x-mock-vertex", "invalid")],
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(
        v["error"]["message"],
        "messages.0.content: Input should be a valid list (mock)"
    );
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 0);
}

/// Permission denied, and a token the cloud does not accept (a key it does
/// not know): 502 naming the deployment, never the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_a_502_naming_the_deployment() {
    let m = start_vertex().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &m);
    let stranger = mock::start(PROJECT, EAST)
        .await
        .expect("a mock that knows no key");
    let gw = config(
        vec![
            deployment("east", &m, EAST, Some(&key)),
            deployment("elsewhere", &stranger, EAST, Some(&key)),
        ],
        limits().tpm(100_000),
    )
    .start()
    .await;
    let r = post(
        &gw.root_url(),
        &body(100, false),
        &[("x-mock-vertex", "denied")],
    )
    .await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("east") && msg.contains("PERMISSION_DENIED"),
        "{msg}"
    );
    assert_eq!(
        m.state.requests().len(),
        1,
        "no retry elsewhere: the gateway's fault"
    );

    let gw2 = config(
        vec![deployment("elsewhere", &stranger, EAST, Some(&key))],
        limits().tpm(100_000),
    )
    .start()
    .await;
    let r = post(&gw2.root_url(), &body(100, false), &[]).await;
    assert_eq!(r.status(), 502);
    let text = r.text().await.unwrap();
    assert!(text.contains("elsewhere") && text.contains("401"), "{text}");
    assert_eq!(stranger.state.refused(), 1);
    let bearer = stranger.state.bearers.lock().unwrap()[0].clone();
    assert!(!text.contains(&bearer[..20]), "never the token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_and_timeout_cool_the_deployment_down_and_answer_503_and_504() {
    for (fault, status) in [("unavailable", 503), ("timeout", 504)] {
        let m = start_vertex().await;
        let dir = tempfile::tempdir().unwrap();
        let key = key_file(dir.path(), &m);
        let gw = config(
            vec![deployment("east", &m, EAST, Some(&key))],
            limits().tpm(100_000),
        )
        .start()
        .await;
        let r = post(
            &gw.root_url(),
            &body(100, false),
            &[("x-mock-vertex", fault)],
        )
        .await;
        assert_eq!(r.status(), status, "{fault}");
        // Cooling down: not tried again at once.
        let r = post(&gw.root_url(), &body(100, false), &[]).await;
        assert_eq!(r.status(), 429, "{fault}: {:?}", r.text().await);
        assert_eq!(m.state.requests().len(), 1, "{fault}");
    }
}

/// A deployment whose credentials file is missing is skipped: the gateway
/// starts, `/readyz` names it, the other deployment serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_without_loadable_credentials_is_skipped_and_named_by_readyz() {
    let m = start_vertex().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &m);
    let missing = dir.path().join("no-such-key.json");
    let gw = config(
        vec![
            deployment("broken", &m, EAST, Some(&missing)),
            deployment("west", &m, WEST, Some(&key)),
        ],
        limits().tpm(100_000),
    )
    .start()
    .await;
    let r = reqwest::get(format!("{}/readyz", gw.root_url()))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["skipped_deployments"], json!(["broken"]), "{v}");
    let r = post(&gw.root_url(), &body(100, false), &[]).await;
    assert_eq!(r.status(), 200);
    let regions: Vec<String> = m
        .state
        .requests()
        .iter()
        .map(|r| r.region.clone())
        .collect();
    assert_eq!(regions, [WEST]);
}

/// `check-config` names the credentials each Vertex deployment would use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_names_the_credential_source() {
    let m = start_vertex().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &m);
    let c = config(
        vec![
            deployment("east", &m, EAST, Some(&key)),
            deployment("west", &m, WEST, None),
        ],
        limits(),
    );
    let path = c.write(dir.path());
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .args(["check-config"])
        .arg(&path)
        .env("HOME", dir.path())
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env("GCE_METADATA_HOST", "127.0.0.1:1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "upstream \"east\" (vertex, project {PROJECT}, region {EAST}): credentials file {} (service_account, {EMAIL})",
            key.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "upstream \"west\" (vertex, project {PROJECT}, region {WEST}): Application Default Credentials: the metadata server at 127.0.0.1:1"
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("PRIVATE KEY"));
}

/// The gateway as a process, one deployment on the metadata server (its
/// tokens living 12 s) and one on the key file: a token refreshed before
/// the first expired, no restart; an in-stream error ends in an `error`
/// event and is settled `upstream_failed`; no token, JWT or key in any log
/// line (at `RUST_LOG=debug`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_tokens_are_refreshed_before_expiry_and_no_credential_is_logged() {
    let m = start_vertex().await;
    m.state.set_token_ttl(Duration::from_secs(12));
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &m);
    let c = config(
        vec![
            deployment("metadata", &m, EAST, None),
            deployment("keyfile", &m, WEST, Some(&key)),
        ],
        limits().tpm(1_000_000),
    );
    let path = c.write(dir.path());
    let home = dir.path().display().to_string();
    let host = m.root_url().trim_start_matches("http://").to_string();
    assert!(std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").is_none());
    let gw = GatewayProcess::start(
        &path,
        &[
            ("GCE_METADATA_HOST", &host),
            ("HOME", &home),
            ("RUST_LOG", "debug"),
        ],
    )
    .await;
    let started = Instant::now();
    let r = post(&gw.root, &body(100, true), &[]).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("event: message_stop"));
    // Past the first token's expiry.
    tokio::time::sleep(Duration::from_secs(13).saturating_sub(started.elapsed())).await;
    let r = post(&gw.root, &body(100, false), &[]).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(m.state.refused(), 0, "no expired token was sent");
    let issued = m.state.token_requests();
    assert!(
        issued.len() >= 2 && issued.iter().all(|i| *i == "metadata"),
        "{issued:?}"
    );
    let times = m.state.issue_times();
    assert!(
        times[1].0 < times[0].1,
        "the second token came before the first expired"
    );
    let bearers = m.state.bearers.lock().unwrap().clone();
    assert_ne!(bearers[0], bearers[1], "a fresh token, no restart");

    // The key-file deployment (the metadata one throttled): an in-stream error.
    m.state.throttle_region(EAST);
    let r = post(
        &gw.root,
        &body(100, true),
        &[("x-mock-vertex", "stream_error")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let id = must_header(&r, "request-id");
    let text = r.text().await.unwrap();
    assert!(
        text.contains("event: error") && text.contains("overloaded_error"),
        "{text}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let outcome = loop {
        let o = gw
            .logs()
            .into_iter()
            .filter(|l| {
                l.pointer("/fields/request_id").and_then(Value::as_str) == Some(id.as_str())
            })
            .find_map(|l| l.pointer("/fields/outcome").cloned());
        if let Some(o) = o {
            break o;
        }
        assert!(
            Instant::now() < deadline,
            "no final line for {id}: {}",
            gw.dump_logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(outcome, "upstream_failed");

    let logs = gw.dump_logs();
    let mut secrets: Vec<String> = m.state.issued_tokens();
    secrets.extend(m.state.bearers.lock().unwrap().iter().cloned());
    for line in test_key()
        .private_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
    {
        secrets.push(line.to_string());
    }
    assert!(secrets.len() > 30);
    for s in secrets.iter().filter(|s| s.len() >= 16) {
        assert!(!logs.contains(s.as_str()), "a credential in the log: {s}");
    }
    assert!(!logs.contains("ya29.") && !logs.contains("PRIVATE KEY"));
    assert!(
        gw.logs_with("vertex credentials loaded").len() == 2,
        "both sources named at start: {logs}"
    );
}

/// An `authorized_user` file (gcloud's application-default login): its
/// refresh token goes to its `token_uri`, the mock's token endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorized_user_file_gets_its_token_from_its_token_uri() {
    let m = start_vertex().await;
    m.state.add_refresh_token("1//refresh-test");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("adc.json");
    std::fs::write(
        &file,
        json!({"type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
               "client_secret": "d-secret", "refresh_token": "1//refresh-test",
               "token_uri": format!("{}/token", m.root_url())})
        .to_string(),
    )
    .unwrap();
    let gw = config(
        vec![deployment("east", &m, EAST, Some(&file))],
        limits().tpm(100_000),
    )
    .start()
    .await;
    let r = post(&gw.root_url(), &body(100, false), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(m.state.token_requests(), ["token_endpoint"]);
    let issued = m.state.issued_tokens();
    assert_eq!(m.state.bearers.lock().unwrap().clone(), issued);
}
