//! The `serve` command's listener (DESIGN section 7, thread per core): the
//! serving threads of one gateway share its port with `SO_REUSEPORT`, but a
//! second gateway started on a port a first one holds refuses to start,
//! instead of silently taking half of the first one's clients.
//!
//! Run: `cargo test --test it listen::`.

use std::time::Duration;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_a_port_in_use_refuses_to_start_and_the_first_serves_on() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = TestConfig::standard(&mock.base_url(), 50, limits().rpm(100)).write(dir.path());
    let first = GatewayProcess::start(&cfg, &[]).await;
    let addr = first.root.strip_prefix("http://").expect("http root");

    let second = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
            .args(["serve", "--threads", "2", "--config"])
            .arg(&cfg)
            .args(["--listen", addr])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the second gateway exits instead of serving")
    .expect("run budgetgate");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );

    let r = reqwest::Client::new()
        .get(format!("{}/v1/models", first.root))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("GET /v1/models");
    assert_eq!(r.status(), 200, "the first gateway still serves");
}
