//! Every tenant's budgets at once: `GET /admin/v1/budgets`
//! pages tenants by name, reads a page's budgets in one store call, gives
//! every budget a `unit`, and shows a request's debit; the budget page and
//! its assets are served with their Content-Security-Policy only while the
//! admin API is enabled.

mod support;

use serde_json::Value;

use support::config::{upstream, RawTenant, RawUpstream};
use support::*;

const TOKEN: &str = "list-admin-token";

fn names(page: &Value) -> Vec<&str> {
    page["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect()
}

fn inspect_calls(metrics: &str) -> f64 {
    let scrape =
        prometheus_parse::Scrape::parse(metrics.lines().map(|l| Ok(l.to_string()))).unwrap();
    support::sample_sum(
        &scrape,
        "budgetgate_store_call_seconds_count",
        &[("op", "inspect")],
    )
}

/// One test: the store-call count below reads process-wide metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pages_tenants_in_one_store_call_per_page_with_units() {
    let mock = start_mock().await;
    let mut config =
        TestConfig::standard(&mock.base_url(), 50, limits().tpm(10000).max_concurrent(4));
    config
        .tenant("t1")
        .model_limits
        .insert("gpt-4o-mini".into(), limits().rpm(100));
    for name in ["zeta", "alpha", "mid"] {
        config.tenants.push(RawTenant {
            name: name.into(),
            limits: limits().rpm(10).tokens_per_day(1000),
            ..RawTenant::default()
        });
    }
    config.upstreams.push(RawUpstream {
        limits: limits().tpm(5000),
        ..upstream("second", Kind::Openai, &mock.base_url())
    });
    let gw = config.start().await;

    // Disabled: the 404 with the hint, for the page and its assets too.
    for path in ["/admin/v1/budgets", "/admin/ui", "/admin/ui/app.js"] {
        let r = admin_get(&gw, path, Some(TOKEN)).await;
        assert_eq!(r.status(), 404, "{path}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("BUDGETGATE_ADMIN_TOKEN"));
    }
    gw.state.set_admin_token(Some(TOKEN));
    assert_eq!(
        admin_get(&gw, "/admin/v1/budgets", None).await.status(),
        401
    );
    assert_eq!(
        admin_get(&gw, "/admin/v1/budgets", Some("wrong"))
            .await
            .status(),
        401
    );
    for bad in ["?limit=0", "?limit=501", "?limit=many"] {
        let r = admin_get(&gw, &format!("/admin/v1/budgets{bad}"), Some(TOKEN)).await;
        assert_eq!(r.status(), 400, "{bad}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], "limit");
    }

    // A request debits t1's day-less budgets: its TPM moves.
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    gw.settled().await;

    let before = inspect_calls(&gw.metrics_text().await);
    let first: Value = admin_get(&gw, "/admin/v1/budgets?limit=2", Some(TOKEN))
        .await
        .json()
        .await
        .unwrap();
    let after = inspect_calls(&gw.metrics_text().await);
    assert_eq!(after - before, 1.0, "one store call for the page");
    assert_eq!(names(&first), vec!["alpha", "mid"]);
    assert_eq!(first["next_after"], "mid");
    let ups: Vec<&str> = first["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(ups, vec!["mock", "second"]);
    let second_tpm = &first["upstreams"][1]["budgets"][0];
    assert_eq!(second_tpm["budget"], "tpm");
    assert_eq!(second_tpm["unit"], "tokens");
    assert_eq!(second_tpm["capacity"], 5000);

    let second: Value = admin_get(&gw, "/admin/v1/budgets?limit=2&after=mid", Some(TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(names(&second), vec!["t1", "zeta"]);
    assert!(second["next_after"].is_null());
    assert!(second.get("upstreams").is_none());

    let t1 = &second["tenants"][0];
    assert_eq!(t1["keys"], serde_json::json!(["k1"]));
    let budgets = t1["budgets"].as_array().unwrap();
    let find = |scope: &str, name: &str| {
        budgets
            .iter()
            .find(|b| b["scope"] == scope && b["budget"] == name)
            .unwrap_or_else(|| panic!("no {scope} {name} in {t1}"))
    };
    let tpm = find("tenant:t1", "tpm");
    assert_eq!(tpm["unit"], "tokens");
    assert_eq!(tpm["kind"], "bucket");
    assert_eq!(tpm["scope_kind"], "tenant");
    assert!(tpm["remaining"].as_i64().unwrap() < 10_000, "{tpm}");
    let slots = find("tenant:t1", "max_concurrent");
    assert_eq!(
        (slots["unit"].as_str(), slots["remaining"].as_i64()),
        (Some("slots"), Some(4))
    );
    let model_rpm = find("tenant_model:t1/gpt-4o-mini", "rpm");
    assert_eq!(model_rpm["unit"], "requests");
    assert_eq!(model_rpm["scope_name"], "gpt-4o-mini");
    assert_eq!(model_rpm["remaining"], 99);
    // Every budget of every page carries the fields a generic reader needs.
    for page in [&first, &second] {
        for t in page["tenants"].as_array().unwrap() {
            for b in t["budgets"].as_array().unwrap() {
                for field in [
                    "scope",
                    "scope_kind",
                    "budget",
                    "kind",
                    "unit",
                    "capacity",
                    "remaining",
                    "reset",
                ] {
                    assert!(!b[field].is_null(), "{field} missing in {b}");
                }
            }
        }
    }
    // The per-tenant endpoint carries the unit too.
    let one: Value = admin_get(&gw, "/admin/v1/tenants/zeta/budgets", Some(TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert!(one["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["unit"] == "requests" || b["unit"] == "tokens"));

    // The page and its assets, with their security headers.
    for (path, ctype) in [
        ("/admin/ui", "text/html; charset=utf-8"),
        ("/admin/ui/app.js", "text/javascript; charset=utf-8"),
        ("/admin/ui/app.css", "text/css; charset=utf-8"),
    ] {
        let r = admin_get(&gw, path, None).await;
        assert_eq!(r.status(), 200, "{path}");
        let h = |n: &str| r.headers()[n].to_str().unwrap().to_string();
        assert_eq!(h("content-type"), ctype);
        assert_eq!(
            h("content-security-policy"),
            "default-src 'self'; frame-ancestors 'none'"
        );
        assert_eq!(h("x-content-type-options"), "nosniff");
    }
    let html = admin_get(&gw, "/admin/ui", None)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        !html.contains("<script>") && !html.contains("style="),
        "inline code or style would break the CSP"
    );
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing from elsewhere"
    );
    assert_eq!(
        admin_get(&gw, "/admin/ui/other.js", None).await.status(),
        404
    );
}
