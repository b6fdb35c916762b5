//! SigV4 on `kind = "bedrock"`: the real binary, each process
//! with its own environment, so the AWS SDK's credential providers read
//! what each test gives them: static keys, the container endpoint, a web
//! identity token file exchanged with STS, IMDSv2 (all served by the
//! mock, `examples/mock_upstream/bedrock.rs`, which verifies every
//! signature with its own copy of the secret). Plus the known-answer test
//! against botocore's `SigV4Auth`, run offline with `$BUDGETGATE_PYTHON`.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use budgetgate::config::bedrock::RawBedrock;
use serde_json::{json, Value};

use crate::support::mock_upstream::bedrock::{BedrockFault, ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

/// A SigV4 deployment `name` on `mock` calling `api`, signing for `region`
/// as `signing_name`; `model` maps to `id`.
fn sigv4_upstream(
    name: &str,
    mock: &MockUpstream,
    api: &str,
    region: &str,
    signing_name: Option<&str>,
    model: &str,
) -> config::RawUpstream {
    config::RawUpstream {
        models: Some([(model.to_string(), format!("us.anthropic.{model}-v1:0"))].into()),
        bedrock: Some(RawBedrock {
            region: Some(region.into()),
            api: Some(api.into()),
            signing_name: signing_name.map(str::to_string),
            ..RawBedrock::default()
        }),
        ..config::upstream(name, Kind::Bedrock, &mock.root_url())
    }
}

/// One model per deployment (`claude-<deployment>`), tenant `t1`.
fn config_of(ups: Vec<config::RawUpstream>) -> TestConfig {
    let mut c = TestConfig::new();
    for u in &ups {
        let model = u
            .models
            .as_ref()
            .and_then(|m| m.keys().next().cloned())
            .expect("a model per deployment");
        c.models.push(config::RawModel {
            encoding: Some("o200k_base".into()),
            default_max_output_tokens: Some(256),
            max_output_tokens: Some(64000),
            ..config::model(&model, &[u.name.as_str()])
        });
    }
    c.upstreams = ups;
    c.tenants
        .push(config::tenant("t1", "k1", KEY, limits().tpm(1_000_000)));
    c
}

/// The environment of a gateway that finds no AWS credentials but those
/// the test gives: an empty home, IMDS off unless the test turns it on.
fn bare_env(home: &Path) -> Vec<(String, String)> {
    vec![
        ("HOME".into(), home.display().to_string()),
        ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        (
            "AWS_CONFIG_FILE".into(),
            home.join("no-config").display().to_string(),
        ),
        (
            "AWS_SHARED_CREDENTIALS_FILE".into(),
            home.join("no-credentials").display().to_string(),
        ),
    ]
}

async fn start(c: &TestConfig, dir: &Path, env: &[(String, String)]) -> GatewayProcess {
    let path = c.write(dir);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    GatewayProcess::start(&path, &env).await
}

async fn ask(gw: &GatewayProcess, model: &str, stream: bool) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/messages", gw.root))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": model, "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("POST /v1/messages");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Every secret a log line must not hold: the secret keys and session
/// tokens the mock issued or knows, and every signature it received.
fn assert_logs_hold_no_secret(gw: &GatewayProcess, mock: &MockUpstream, extra: &[&str]) {
    let logs = gw.dump_logs();
    let mut secrets: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    secrets.push(SECRET_ACCESS_KEY.into());
    for r in mock.state.requests() {
        for name in ["authorization", "x-amz-security-token", "x-api-key"] {
            if let Some(v) = r.header(name) {
                secrets.push(v.to_string());
                if let Some(sig) = v.split("Signature=").nth(1) {
                    secrets.push(sig.to_string());
                }
            }
        }
    }
    for s in secrets.iter().filter(|s| s.len() >= 8) {
        assert!(
            !logs.contains(s.as_str()),
            "a log line holds a secret ({} chars)",
            s.len()
        );
    }
    assert!(!logs.contains("AWS4-HMAC-SHA256 Credential"));
}

/// Endpoints: InvokeModel(WithResponseStream) and the Messages endpoint,
/// signed with keys from the environment; the mock recomputes every
/// signature. A wrong secret, region or service name is refused by the
/// mock and answered 502 naming the deployment, counted in
/// `budgetgate_upstream_auth_failures_total`. No log line (at debug)
/// holds a secret, token or signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_credentials_sign_both_apis_and_bad_signatures_are_refused() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(6);
    let dir = tempfile::tempdir().unwrap();
    let c = config_of(vec![
        sigv4_upstream("invoke", &mock, "invoke", "us-east-1", None, "claude-a"),
        sigv4_upstream("mantle", &mock, "messages", "us-east-1", None, "claude-b"),
        sigv4_upstream(
            "wrong-region",
            &mock,
            "invoke",
            "eu-west-3",
            None,
            "claude-c",
        ),
        sigv4_upstream(
            "wrong-service",
            &mock,
            "invoke",
            "us-east-1",
            Some("bedrock-runtime"),
            "claude-d",
        ),
    ]);
    let mut env = bare_env(dir.path());
    env.push(("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY_ID.into()));
    env.push(("AWS_SECRET_ACCESS_KEY".into(), SECRET_ACCESS_KEY.into()));
    env.push(("RUST_LOG".into(), "debug".into()));
    let gw = start(&c, dir.path(), &env).await;
    for model in ["claude-a", "claude-b"] {
        for stream in [true, false] {
            let (status, text) = ask(&gw, model, stream).await;
            assert_eq!(status, 200, "{model} stream={stream}: {text}");
            if stream {
                assert!(text.contains("event: message_stop"), "{text}");
            }
        }
    }
    assert_eq!(mock.state.bedrock.signed_by(), [ACCESS_KEY_ID; 4]);
    assert!(mock.state.bedrock.refused().is_empty());
    let paths: Vec<String> = mock
        .state
        .requests()
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(
        paths,
        [
            "/model/us.anthropic.claude-a-v1%3A0/invoke-with-response-stream",
            "/model/us.anthropic.claude-a-v1%3A0/invoke",
            "/anthropic/v1/messages",
            "/anthropic/v1/messages",
        ]
    );
    for (model, deployment) in [("claude-c", "wrong-region"), ("claude-d", "wrong-service")] {
        let (status, text) = ask(&gw, model, false).await;
        assert_eq!(status, 502, "{text}");
        assert!(
            text.contains(&format!("Deployment {deployment} rejected")),
            "{text}"
        );
        assert_eq!(
            gw.metric(
                "budgetgate_upstream_auth_failures_total",
                &[("deployment", deployment)]
            )
            .await,
            1.0
        );
    }
    assert_eq!(
        mock.state.bedrock.refused(),
        ["InvalidSignatureException", "InvalidSignatureException"]
    );
    assert_logs_hold_no_secret(&gw, &mock, &[]);
    drop(gw);

    // The right key id with a wrong secret: the signature does not verify.
    let mut env = bare_env(dir.path());
    env.push(("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY_ID.into()));
    env.push((
        "AWS_SECRET_ACCESS_KEY".into(),
        "not-the-secret-0123456789".into(),
    ));
    let gw = start(&c, dir.path(), &env).await;
    let (status, text) = ask(&gw, "claude-a", true).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("Deployment invoke rejected"), "{text}");
    assert!(!text.contains("not-the-secret"), "{text}");
    assert_eq!(
        mock.state.bedrock.refused().last().map(String::as_str),
        Some("InvalidSignatureException")
    );
    assert_eq!(
        gw.metric(
            "budgetgate_upstream_auth_failures_total",
            &[("deployment", "invoke")]
        )
        .await,
        1.0
    );
    assert_logs_hold_no_secret(&gw, &mock, &["not-the-secret-0123456789"]);
}

/// An expiring container credential is replaced before it expires,
/// without a restart: the endpoint issues credentials that expire 3 s
/// after the refresh margin; the first requests sign with the first, a
/// request after 3.5 s with a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_container_credential_is_refreshed_before_expiry() {
    let mock = start_mock().await;
    mock.state.bedrock.set_issued_ttl(
        budgetgate::upstreams::bedrock::credentials::REFRESH_BEFORE + Duration::from_secs(3),
    );
    let dir = tempfile::tempdir().unwrap();
    let c = config_of(vec![sigv4_upstream(
        "br",
        &mock,
        "invoke",
        "us-east-1",
        None,
        "claude-a",
    )]);
    let mut env = bare_env(dir.path());
    env.push((
        "AWS_CONTAINER_CREDENTIALS_FULL_URI".into(),
        format!("{}/mock-aws/container-credentials", mock.root_url()),
    ));
    let gw = start(&c, dir.path(), &env).await;
    for _ in 0..2 {
        assert_eq!(ask(&gw, "claude-a", true).await.0, 200);
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(ask(&gw, "claude-a", false).await.0, 200);
    let by = mock.state.bedrock.signed_by();
    assert_eq!(by.len(), 3);
    assert!(by[0].starts_with("ASIAMOCKCONTAINER"), "{by:?}");
    assert_eq!(by[0], by[1], "reused while fresh");
    assert_ne!(by[1], by[2], "replaced before it expired");
    assert!(by[2].starts_with("ASIAMOCKCONTAINER"), "{by:?}");
    assert!(mock.state.bedrock.refused().is_empty());
    assert_logs_hold_no_secret(&gw, &mock, &[]);
}

/// A web identity token file (as EKS and other OIDC setups mount it),
/// exchanged with STS at `AWS_ENDPOINT_URL_STS`; when the file is
/// rewritten, the next refresh sends the new token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_web_identity_token_file_is_picked_up() {
    let mock = start_mock().await;
    mock.state.bedrock.set_issued_ttl(
        budgetgate::upstreams::bedrock::credentials::REFRESH_BEFORE + Duration::from_secs(3),
    );
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "web-identity-token-one").unwrap();
    let c = config_of(vec![sigv4_upstream(
        "br",
        &mock,
        "invoke",
        "us-east-1",
        None,
        "claude-a",
    )]);
    let mut env = bare_env(dir.path());
    env.extend([
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE".to_string(),
            token.display().to_string(),
        ),
        (
            "AWS_ROLE_ARN".into(),
            "arn:aws:iam::123456789012:role/mock".into(),
        ),
        ("AWS_ROLE_SESSION_NAME".into(), "budgetgate-test".into()),
        ("AWS_REGION".into(), "us-east-1".into()),
        ("AWS_ENDPOINT_URL_STS".into(), mock.root_url()),
    ]);
    let gw = start(&c, dir.path(), &env).await;
    assert_eq!(ask(&gw, "claude-a", true).await.0, 200);
    std::fs::write(&token, "web-identity-token-two").unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(ask(&gw, "claude-a", false).await.0, 200);
    assert_eq!(
        mock.state.bedrock.web_identity_tokens(),
        ["web-identity-token-one", "web-identity-token-two"]
    );
    let by = mock.state.bedrock.signed_by();
    assert!(by.iter().all(|k| k.starts_with("ASIAMOCKSTS")), "{by:?}");
    assert_ne!(by[0], by[1]);
    assert_logs_hold_no_secret(
        &gw,
        &mock,
        &["web-identity-token-one", "web-identity-token-two"],
    );
}

/// IMDSv2 at `AWS_EC2_METADATA_SERVICE_ENDPOINT`: the chain's last source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_metadata_credentials_sign_requests() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = config_of(vec![sigv4_upstream(
        "br",
        &mock,
        "messages",
        "us-east-1",
        None,
        "claude-a",
    )]);
    let mut env: Vec<(String, String)> = bare_env(dir.path())
        .into_iter()
        .filter(|(k, _)| k != "AWS_EC2_METADATA_DISABLED")
        .collect();
    env.push(("AWS_EC2_METADATA_SERVICE_ENDPOINT".into(), mock.root_url()));
    let gw = start(&c, dir.path(), &env).await;
    let (status, text) = ask(&gw, "claude-a", true).await;
    assert_eq!(status, 200, "{text}\n{}", gw.dump_logs());
    let by = mock.state.bedrock.signed_by();
    assert!(by[0].starts_with("ASIAMOCKIMDS"), "{by:?}");
    assert_logs_hold_no_secret(&gw, &mock, &[]);
}

/// A deployment whose credentials cannot be loaded at start is skipped:
/// the gateway starts, logs it, `/readyz` names it, and its model is
/// served by its other deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_without_credentials_is_skipped_at_start() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    mock.state.bedrock.set_api_key(env!("CARGO_PKG_NAME"));
    let mut c = config_of(vec![sigv4_upstream(
        "no-creds",
        &mock,
        "invoke",
        "us-east-1",
        None,
        "claude-a",
    )]);
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        models: Some(
            [(
                "claude-a".to_string(),
                "us.anthropic.claude-a-v1:0".to_string(),
            )]
            .into(),
        ),
        bedrock: Some(RawBedrock {
            region: Some("us-east-1".into()),
            api: Some("messages".into()),
            ..RawBedrock::default()
        }),
        ..config::upstream("with-key", Kind::Bedrock, &mock.root_url())
    });
    c.models[0].upstreams.push("with-key".into());
    let mut env = bare_env(dir.path());
    env.push(("CARGO_PKG_NAME".into(), env!("CARGO_PKG_NAME").into()));
    let gw = start(&c, dir.path(), &env).await;
    let skipped = gw
        .wait_log(
            "deployment skipped: its AWS credentials could not be loaded",
            1,
        )
        .await;
    assert_eq!(
        skipped[0]
            .pointer("/fields/deployment")
            .and_then(Value::as_str),
        Some("no-creds")
    );
    let ready: Value = reqwest::get(format!("{}/readyz", gw.root))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["skipped_deployments"], json!(["no-creds"]));
    let (status, text) = ask(&gw, "claude-a", false).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(mock.state.requests().len(), 1);
    assert_eq!(mock.state.requests()[0].path, "/anthropic/v1/messages");
}

/// Fault guarded against: a skipped deployment was a cool-down that
/// never ended, so a model with no other deployment answered 429 with
/// `retry-after: 18444947451201`. It answers 502 naming the deployment,
/// as Vertex's skipped deployments do, never a rate limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_whose_only_deployment_was_skipped_answers_502_naming_it() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = config_of(vec![sigv4_upstream(
        "no-creds-only",
        &mock,
        "invoke",
        "us-east-1",
        None,
        "claude-a",
    )]);
    let gw = start(&c, dir.path(), &bare_env(dir.path())).await;
    gw.wait_log(
        "deployment skipped: its AWS credentials could not be loaded",
        1,
    )
    .await;
    for stream in [false, true] {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/messages", gw.root))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .json(
                &json!({"model": "claude-a", "max_tokens": 64, "stream": stream,
                "messages": [{"role": "user", "content": "hi"}]}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502);
        assert!(r.headers().get("retry-after").is_none());
        let text = r.text().await.unwrap();
        assert!(text.contains("no-creds-only"), "{text}");
        assert!(!text.contains("rate_limit"), "{text}");
    }
    assert!(mock.state.requests().is_empty());
}

/// Fault guarded against: a reload that added a SigV4 deployment never
/// checked its credentials; its local failure was final, so the model's
/// healthy second deployment was never tried (502s, the mock received
/// nothing, `/readyz` silent). The reload checks them as the start does,
/// `/readyz` names the deployment, and the model is served by the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_added_by_a_reload_without_credentials_is_skipped() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(6);
    let dir = tempfile::tempdir().unwrap();
    mock.state.bedrock.set_api_key(env!("CARGO_PKG_NAME"));
    let with_key = config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        models: Some(
            [(
                "claude-a".to_string(),
                "us.anthropic.claude-a-v1:0".to_string(),
            )]
            .into(),
        ),
        bedrock: Some(RawBedrock {
            region: Some("us-east-1".into()),
            api: Some("messages".into()),
            ..RawBedrock::default()
        }),
        ..config::upstream("with-key", Kind::Bedrock, &mock.root_url())
    };
    let mut c = config_of(vec![with_key.clone()]);
    let mut env = bare_env(dir.path());
    env.push(("CARGO_PKG_NAME".into(), env!("CARGO_PKG_NAME").into()));
    let gw = start(&c, dir.path(), &env).await;
    assert_eq!(ask(&gw, "claude-a", false).await.0, 200);
    // The reload puts a SigV4 deployment without credentials first.
    c.upstreams.insert(
        0,
        sigv4_upstream("added", &mock, "invoke", "us-east-1", None, "claude-a"),
    );
    c.models[0].upstreams.insert(0, "added".into());
    c.write(dir.path());
    gw.signal("HUP");
    gw.wait_log("policy reloaded", 1).await;
    gw.wait_log(
        "deployment skipped: its AWS credentials could not be loaded",
        1,
    )
    .await;
    let ready: Value = reqwest::get(format!("{}/readyz", gw.root))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["skipped_deployments"], json!(["added"]), "{ready}");
    for stream in [false, true, false] {
        let (status, text) = ask(&gw, "claude-a", stream).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(mock.state.requests().len(), 4, "every request served");
    assert!(mock
        .state
        .requests()
        .iter()
        .all(|r| r.path == "/anthropic/v1/messages"));
}

/// `check-config` names the credential source each SigV4 deployment would
/// use (the first the SDK's chain finds in this environment), and the
/// deployments a model skips for want of an id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_names_the_credential_source() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config_of(vec![sigv4_upstream(
        "br",
        &mock,
        "invoke",
        "us-east-1",
        None,
        "claude-a",
    )]);
    c.models[0].upstreams.push("br2".into());
    c.upstreams.push(sigv4_upstream(
        "br2",
        &mock,
        "invoke",
        "us-west-2",
        None,
        "claude-z",
    ));
    let path = c.write(dir.path());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"));
    cmd.arg("check-config").arg(&path);
    for (k, v) in bare_env(dir.path()) {
        cmd.env(k, v);
    }
    cmd.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_PROFILE");
    cmd.env(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "http://127.0.0.1:9/creds",
    );
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("upstreams \"br\": kind = \"bedrock\"")
            && stdout.contains("the container credentials endpoint"),
        "{stdout}"
    );
    assert!(
        stdout.contains("deployment \"br2\" has no id for it"),
        "{stdout}"
    );
}

/// Known answer: a fixed request, credential and time signed by the
/// gateway's signer and by botocore's `SigV4Auth` (PyPI, pinned in
/// tests/python/requirements.txt): the same `Authorization` header, byte
/// for byte (the model id's `:` percent-encoded in the path, signed
/// double-encoded as SigV4 asks of Bedrock).
#[test]
fn the_signature_equals_botocores_byte_for_byte() {
    let url = "https://bedrock-runtime.us-east-1.amazonaws.com/model/us.anthropic.claude-opus-4-8-v1%3A0/invoke-with-response-stream";
    let body = r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;
    let (key, secret, token) = (
        "AKIDEXAMPLE",
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        "FwoGZXIvYXdzEXAMPLESESSIONTOKEN",
    );
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/vnd.amazon.eventstream"),
    ];
    let creds =
        aws_credential_types::Credentials::new(key, secret, Some(token.into()), None, "test");
    // 2026-11-30T12:00:00Z
    let time = UNIX_EPOCH + Duration::from_secs(1_796_040_000);
    let ours = budgetgate::upstreams::bedrock::sigv4::sign_request(
        "POST",
        url,
        &headers,
        body.as_bytes(),
        &creds,
        "us-east-1",
        "bedrock",
        time,
    )
    .unwrap();
    let ours = |name: &str| {
        ours.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let script = r#"
import datetime, json, sys
from unittest import mock
import botocore.auth
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
a = json.loads(sys.argv[1])
req = AWSRequest(method="POST", url=a["url"], data=a["body"].encode(), headers=a["headers"])
fixed = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)
with mock.patch.object(botocore.auth, "get_current_datetime", lambda *a, **k: fixed):
    SigV4Auth(Credentials(a["key"], a["secret"], a["token"]), "bedrock", "us-east-1").add_auth(req)
print(json.dumps({k.lower(): v for k, v in req.headers.items()}))
"#;
    let args = json!({"url": url, "body": body, "key": key, "secret": secret, "token": token,
        "headers": headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>()});
    let out = std::process::Command::new(crate::support::python::python())
        .args(["-c", script, &args.to_string()])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "botocore (pip install -r tests/python/requirements.txt): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs["x-amz-date"], "20261130T120000Z");
    assert_eq!(ours("x-amz-date"), "20261130T120000Z");
    assert_eq!(ours("x-amz-security-token"), token);
    let auth = ours("authorization");
    assert!(
        auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/us-east-1/bedrock/aws4_request"
        ),
        "{auth}"
    );
    assert_eq!(theirs["authorization"].as_str(), Some(auth.as_str()));
}

/// The throttled-everywhere answer of a SigV4 deployment: 429 with
/// `retry-after` (the deployment's cool-down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_on_the_only_region_answers_429_with_retry_after() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config_of(vec![sigv4_upstream(
        "br",
        &mock,
        "invoke",
        "us-east-1",
        None,
        "claude-a",
    )]);
    c.upstreams[0].cooldown_secs = Some(4);
    let mut env = bare_env(dir.path());
    env.push(("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY_ID.into()));
    env.push(("AWS_SECRET_ACCESS_KEY".into(), SECRET_ACCESS_KEY.into()));
    let gw = start(&c, dir.path(), &env).await;
    mock.state.bedrock.set_fault(BedrockFault::Throttling, 1);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/messages", gw.root))
        .header("x-api-key", KEY)
        .json(&json!({"model": "claude-a", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after").as_deref(), Some("4"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
}

/// The mock refuses what AWS refuses: a signature by a credential that
/// has expired (`ExpiredTokenException`) and one by a key it does not
/// know (`UnrecognizedClientException`), each signed by the gateway's own
/// signer and sent straight to the mock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_refuses_an_expired_or_unknown_credential() {
    let mock = start_mock().await;
    mock.state.bedrock.add_key(
        "ASIAMOCKEXPIRED00001",
        "expired-secret-0123456789",
        Some("expired-session-token"),
        Some(SystemTime::now() - Duration::from_secs(1)),
    );
    let url = format!(
        "{}/model/us.anthropic.claude-a-v1%3A0/invoke",
        mock.root_url()
    );
    let body = br#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":8,"messages":[]}"#;
    for (key, secret, token, refused) in [
        (
            "ASIAMOCKEXPIRED00001",
            "expired-secret-0123456789",
            Some("expired-session-token"),
            "ExpiredTokenException",
        ),
        (
            "AKIANOBODY0000000001",
            "whatever-secret",
            None,
            "UnrecognizedClientException",
        ),
    ] {
        let creds = aws_credential_types::Credentials::new(
            key,
            secret,
            token.map(str::to_string),
            None,
            "test",
        );
        let headers = [
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ];
        let signed = budgetgate::upstreams::bedrock::sigv4::sign_request(
            "POST",
            &url,
            &headers,
            body,
            &creds,
            "us-east-1",
            "bedrock",
            SystemTime::now(),
        )
        .unwrap();
        let mut req = reqwest::Client::new().post(&url).body(body.to_vec());
        for (n, v) in headers
            .iter()
            .map(|(n, v)| (*n, v.to_string()))
            .chain(signed)
        {
            req = req.header(n, v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 403);
        assert!(must_header(&r, "x-amzn-errortype").starts_with(refused));
    }
    assert_eq!(
        mock.state.bedrock.refused(),
        ["ExpiredTokenException", "UnrecognizedClientException"]
    );
}

/// A SigV4 deployment a reload adds, whose credentials load, serves the
/// next request (its chain built by the reload's load, signing with the
/// environment's key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_added_by_a_reload_with_credentials_serves() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(6);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config_of(vec![sigv4_upstream(
        "first",
        &mock,
        "invoke",
        "us-east-1",
        None,
        "claude-a",
    )]);
    let mut env = bare_env(dir.path());
    env.push(("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY_ID.into()));
    env.push(("AWS_SECRET_ACCESS_KEY".into(), SECRET_ACCESS_KEY.into()));
    let gw = start(&c, dir.path(), &env).await;
    assert_eq!(ask(&gw, "claude-a", false).await.0, 200);
    let added = sigv4_upstream("added", &mock, "messages", "us-east-1", None, "claude-b");
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        max_output_tokens: Some(64000),
        ..config::model("claude-b", &["added"])
    });
    c.upstreams.push(added);
    c.write(dir.path());
    gw.signal("HUP");
    gw.wait_log("policy reloaded", 1).await;
    for stream in [false, true] {
        let (status, text) = ask(&gw, "claude-b", stream).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(mock.state.bedrock.signed_by(), [ACCESS_KEY_ID; 3]);
    let ready: Value = reqwest::get(format!("{}/readyz", gw.root))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(ready.get("skipped_deployments").is_none(), "{ready}");
}
