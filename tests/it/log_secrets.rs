//! Secrets never reach the log. Faults guarded
//! against: a webhook delivery error logged reqwest's error text, which
//! holds the URL (a Slack-style hook's path is its secret); the OTLP
//! endpoint was logged with its password. Both are now logged as upstream
//! failures are: where (scheme, host, port) and what kind of failure.

use std::time::Duration;

use crate::support::*;

const WEBHOOK_SECRET_PATH: &str = "services/T0SECRET/B0SECRET/webhook-path-secret-4711";
const OTLP_PASSWORD: &str = "otlp-password-4711";

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("address").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_errors_and_the_otlp_endpoint_are_logged_without_their_secrets() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(&mock.base_url(), 20, limits().tokens_per_day(1_000));
    let hook_port = closed_port();
    c.alerts.webhook_url = Some(format!(
        "http://127.0.0.1:{hook_port}/{WEBHOOK_SECRET_PATH}"
    ));
    c.alerts.secret_env = Some("LOG_SECRETS_ALERT_SECRET".into());
    c.alerts.thresholds_percent = Some(vec![1]);
    c.alerts.check_interval_ms = Some(100);
    c.telemetry.otlp_endpoint = Some(format!(
        "http://otel-user:{OTLP_PASSWORD}@127.0.0.1:{}",
        closed_port()
    ));
    let gw = GatewayProcess::start(
        &c.write(dir.path()),
        &[(
            "LOG_SECRETS_ALERT_SECRET",
            "log-secrets-signing-secret-0123",
        )],
    )
    .await;
    assert_eq!(post_hi(&gw, KEY).await, 200);
    // The 1 % threshold fires; the hook refuses the connection; retried.
    let retried = gw.wait_log("budget alert not delivered; retrying", 1).await;
    let fields = &retried[0]["fields"];
    assert!(
        fields["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("connection failed")),
        "{fields}"
    );
    assert_eq!(fields["webhook"], format!("http://127.0.0.1:{hook_port}/…"));
    let exported = gw
        .wait_log("request spans exported over OTLP/HTTP", 1)
        .await;
    let endpoint = exported[0]["fields"]["endpoint"].as_str().unwrap_or("");
    assert!(endpoint.starts_with("http://127.0.0.1:"), "{endpoint}");
    // Spans are exported (and fail) meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = gw.dump_logs();
    for secret in [WEBHOOK_SECRET_PATH, "T0SECRET", OTLP_PASSWORD, "otel-user"] {
        assert!(!log.contains(secret), "{secret:?} in the log:\n{log}");
    }
}

/// A Redis URL may carry the store's password (`redis://:pass@host`): a
/// gateway that cannot reach its store says where it tried, never with it.
#[test]
fn a_store_url_is_logged_without_its_password() {
    const REDIS_PASSWORD: &str = "redis-password-4711";
    let dir = tempfile::tempdir().unwrap();
    let cfg = TestConfig::standard("http://127.0.0.1:9/v1", 20, limits().tpm(1_000))
        .redis(&format!(
            "redis://:{REDIS_PASSWORD}@127.0.0.1:{}/",
            closed_port()
        ))
        .write(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("STATE_DIRECTORY", dir.path())
        .env_remove("BUDGETGATE_CONFIG")
        .output()
        .expect("run budgetgate serve");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "serve started without its store:\n{log}"
    );
    assert!(log.contains("store.url redis://127.0.0.1:"), "{log}");
    assert!(
        !log.contains(REDIS_PASSWORD),
        "the password in the log:\n{log}"
    );
}
