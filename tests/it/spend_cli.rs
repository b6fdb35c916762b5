//! `budgetgate spend` (the spend queries and CSV export
//! through the CLI): the binary against a running gateway prints the
//! ledger's totals and rows as the admin API gives them, CSV included; a
//! refused query prints the API's message on stderr and fails.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const TOKEN: &str = "spend-cli-admin-token";

fn spend(gw: &Gateway, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .arg("spend")
        .args(args)
        .env("BUDGETGATE_URL", gw.root_url())
        .env("BUDGETGATE_ADMIN_TOKEN", TOKEN)
        .output()
        .expect("run budgetgate");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgetgate_spend_prints_the_ledgers_totals_and_rows_as_json_and_csv() {
    let mock = start_mock().await;
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits().usd_per_day("100"));
    c.model("gpt-4o-mini").price = Some(price("0.15", "0.60"));
    c.ledger.batch_interval_ms = Some(100);
    let gw = c.start().await;
    gw.state.set_admin_token(Some(TOKEN));
    for _ in 0..3 {
        assert_eq!(post_hi(&gw, KEY).await, 200);
    }
    gw.settled().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = admin_get(&gw, "/admin/v1/spend/rows", Some(TOKEN)).await;
        let v: Value = r.json().await.unwrap();
        if v["data"].as_array().map_or(0, |a| a.len()) == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rows not written: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let api: Value = admin_get(
        &gw,
        "/admin/v1/spend?group_by=model&period=month",
        Some(TOKEN),
    )
    .await
    .json()
    .await
    .unwrap();
    let json_out = spend(&gw, &["--group-by", "model", "--period", "month"]).unwrap();
    let cli: Value = serde_json::from_str(&json_out).expect("JSON");
    assert_eq!(cli["data"], api["data"]);
    let group = &cli["data"][0];
    assert_eq!(group["requests"], 3);
    assert!(group["cost_micros"].as_u64().unwrap() > 0);

    let csv = spend(&gw, &["--group-by", "model", "--period", "month", "--csv"]).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    println!("budgetgate spend --csv:\n{csv}");
    assert_eq!(lines.len(), 2, "a header and one group: {csv}");
    assert!(lines[0].contains("cost_micros"), "{}", lines[0]);
    assert!(lines[1].contains("gpt-4o-mini"), "{}", lines[1]);
    assert!(
        lines[1].contains(&group["cost_micros"].to_string()),
        "{}",
        lines[1]
    );

    let rows = spend(&gw, &["--rows", "--csv", "--limit", "2"]).unwrap();
    assert_eq!(rows.lines().count(), 3, "a header and two rows: {rows}");

    // One request by the id its client saw.
    let all: Value = serde_json::from_str(&spend(&gw, &["--rows"]).unwrap()).unwrap();
    let id = all["data"][1]["request_id"].as_str().unwrap().to_string();
    let one: Value =
        serde_json::from_str(&spend(&gw, &["--rows", "--request-id", &id]).unwrap()).unwrap();
    assert_eq!(one["data"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["data"][0], all["data"][1]);

    let refused = spend(&gw, &["--group-by", "colour"]).unwrap_err();
    assert!(
        refused.contains("400") && refused.contains("group_by"),
        "{refused}"
    );
}
