//! Metric series per admin write. Every control write
//! is a policy version; faults guarded against:
//! - `budgetgate_decisions_total` carried the version as a label, and
//!   `budgetgate_policy_info` kept one series per version ever served:
//!   500 key creations took `/metrics` from 552 to 6,593 lines;
//! - a deleted tenant's series stayed in `/metrics` for good.

use reqwest::Method;
use serde_json::json;

use crate::support::*;

const ROOT: &str = "metric-series-root-token";

fn policy_info_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("budgetgate_policy_info"))
        .collect()
}

/// A real process: the recorder is its own, so every line it adds is this
/// test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_key_creations_add_no_metrics_line() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = TestConfig::standard(&mock.base_url(), 50, limits().tpm(1_000_000));
    cfg.server.admin_token_env = Some("METRIC_SERIES_ROOT".into());
    let gw = GatewayProcess::start(
        &cfg.write(dir.path()),
        &[("METRIC_SERIES_ROOT", ROOT), ("RUST_LOG", "warn")],
    )
    .await;
    let create = |n: usize| {
        let gw = &gw;
        async move {
            let (s, v) = admin_call(
                gw,
                Method::POST,
                "/admin/v1/tenants/t1/keys",
                ROOT,
                Some(json!({ "id": format!("k-{n}") })),
            )
            .await;
            assert_eq!(s, 201, "{v}");
        }
    };
    // Traffic and a first write, so that every series a write or a
    // request registers exists before the count.
    assert_eq!(post_hi(&gw, KEY).await, 200);
    create(0).await;
    let before = metrics_text(&gw).await;
    for batch in 0..50 {
        let writes = (1..=10).map(|i| create(batch * 10 + i));
        futures_util::future::join_all(writes).await;
    }
    assert_eq!(post_hi(&gw, KEY).await, 200);
    let after = metrics_text(&gw).await;
    let count = |t: &str| t.lines().count();
    assert_eq!(
        count(&after),
        count(&before),
        "500 key creations changed the line count; lines added:\n{}",
        after
            .lines()
            .filter(|l| !before.lines().any(|b| series(b) == series(l)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let info = policy_info_lines(&after);
    assert_eq!(info.len(), 1, "{info:?}");
    assert_ne!(
        policy_info_lines(&before),
        info,
        "the one series carries the new version"
    );
}

/// A sample line's series (name and labels), without its value.
fn series(line: &str) -> &str {
    line.rsplit_once(' ').map_or(line, |(s, _)| s)
}

async fn metrics_text(gw: &GatewayProcess) -> String {
    reqwest::get(format!("{}/metrics", gw.root))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tenants_series_leave_metrics_and_policy_info_stays_one_series() {
    // A tenant name of its own: the recorder is shared by this binary's tests.
    const TENANT: &str = "metric-series-gone";
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = TestConfig::standard(&mock.base_url(), 50, limits().tpm(1_000_000));
    cfg.control.database_url = Some(format!("sqlite://{}", dir.path().join("c.db").display()));
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    let (s, v) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": TENANT, "limits": {"tpm": 50000}})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = admin_call(
        &gw,
        Method::POST,
        &format!("/admin/v1/tenants/{TENANT}/keys"),
        ROOT,
        Some(json!({"id": "k"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let secret = v["secret"].as_str().unwrap().to_string();
    assert_eq!(post_hi(&gw, &secret).await, 200);
    gw.settled().await;
    let label = format!("tenant=\"{TENANT}\"");
    let text = gw.metrics_text().await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("budgetgate_decisions_total") && l.contains(&label)),
        "{text}"
    );
    assert_eq!(policy_info_lines(&text).len(), 1, "{text}");

    let (s, v) = admin_call(
        &gw,
        Method::DELETE,
        &format!("/admin/v1/tenants/{TENANT}"),
        ROOT,
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let text = gw.metrics_text().await;
    let left: Vec<&str> = text.lines().filter(|l| l.contains(&label)).collect();
    assert!(left.is_empty(), "a deleted tenant's series: {left:?}");
    let info = policy_info_lines(&text);
    assert_eq!(info.len(), 1, "{info:?}");
    assert!(info[0].ends_with(" 1"), "{info:?}");
    // The tenant's name again: its series are back.
    let (s, v) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": TENANT})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    assert!(gw.metrics_text().await.contains(&label));
}
