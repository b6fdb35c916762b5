//! The budget page as a console, in headless Chromium:
//! with the admin token a tenant's keys are created (the secret shown
//! once), rotated (the old secret keeps working through the overlap) and
//! revoked (refused at once) from the page; the panel survives the page's
//! refresh; a read-only admin token gets the API's refusal on the page.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use super::budget_page_browser::{ensure_browser, local_config, Browser, TOKEN};
use crate::support::process::GatewayProcess;
use crate::support::*;

const PANEL: &str = ".tenant[data-name=\"demo\"] > .keys-console";

fn js_panel(expr: &str) -> String {
    format!("return (() => {{ const p = document.querySelector('{PANEL}'); return p ? {expr} : null; }})()")
}

async fn status_with(gw: &GatewayProcess, key: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.root))
        .bearer_auth(key)
        .json(&json!({"model": "gpt-4o-mini", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The secret the panel shows, once it differs from `not`.
async fn shown_secret(browser: &Browser, not: &str) -> String {
    let v: Value = browser
        .wait_for(
            "a secret in the keys panel",
            &js_panel(&format!(
                "(() => {{ const s = p.querySelector('.secret-value'); return s && s.textContent !== '{not}' ? s.textContent : null; }})()"
            )),
        )
        .await;
    v.as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_created_rotated_and_revoked_from_the_budget_page_with_an_admin_token() {
    ensure_browser();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = local_config(&mock.base_url()).write(dir.path());
    let gw = GatewayProcess::start(&cfg, &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await;
    let browser = Browser::start().await;
    browser.goto(&format!("{}/admin/ui", gw.root)).await;
    browser
        .wait_for(
            "the token prompt",
            "return !document.getElementById('token-form').hidden",
        )
        .await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-submit").await;
    browser
        .wait_for("the demo tenant's keys panel", &js_panel("true"))
        .await;

    browser.click(&format!("{PANEL} > summary")).await;
    browser
        .wait_for(
            "the empty key list",
            &js_panel("p.querySelector('.key-list').textContent.includes('No keys created through the API')"),
        )
        .await;
    browser
        .type_into(&format!("{PANEL} .key-create .alias"), "Ana's laptop")
        .await;
    browser.click(&format!("{PANEL} .key-create .create")).await;
    let first = shown_secret(&browser, "").await;
    assert!(first.starts_with("sk-bg-"), "{first}");
    let listed = browser
        .wait_for(
            "the new key in the list",
            &js_panel("(() => { const k = p.querySelector('.key-list li.key'); return k ? [k.dataset.revoked, k.textContent] : null; })()"),
        )
        .await;
    assert_eq!(listed[0], "false");
    assert!(
        listed[1].as_str().unwrap().contains("Ana's laptop"),
        "{listed}"
    );
    assert_eq!(
        status_with(&gw, &first).await,
        200,
        "the key created on the page"
    );
    // The secret is shown once: listing the keys never shows it again.
    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/tenants/demo/keys", TOKEN, None).await;
    assert_eq!(s, 200);
    assert!(!v.to_string().contains(&first));

    browser
        .click(&format!("{PANEL} .key-list li.key .rotate"))
        .await;
    let second = shown_secret(&browser, &first).await;
    assert_ne!(first, second);
    assert_eq!(status_with(&gw, &second).await, 200, "the rotated secret");
    assert_eq!(
        status_with(&gw, &first).await,
        200,
        "the old secret, within its overlap"
    );

    // The page refreshes every 5 s; the open panel and its secret stay.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let kept = browser
        .js(&js_panel("[p.open, p.querySelector('.secret-value') && p.querySelector('.secret-value').textContent, document.querySelectorAll('.keys-console').length]"))
        .await;
    assert_eq!(kept[0], true, "the panel stayed open");
    assert_eq!(kept[1], json!(second));

    // Revoke: a first click asks, the second revokes.
    browser
        .click(&format!("{PANEL} .key-list li.key .revoke"))
        .await;
    browser
        .click(&format!("{PANEL} .key-list li.key .revoke"))
        .await;
    browser
        .wait_for(
            "the key shown revoked",
            &js_panel("(() => { const k = p.querySelector('.key-list li.key'); return k && k.dataset.revoked === 'true'; })()"),
        )
        .await;
    assert_eq!(status_with(&gw, &second).await, 401, "revoked on the page");

    // A read-only admin token sees the keys but cannot create one.
    let (s, v) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/admin_tokens",
        TOKEN,
        Some(json!({"role": "read"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let reader = v["token"].as_str().unwrap().to_string();
    browser.click("#forget").await;
    browser
        .wait_for(
            "the token prompt",
            "return !document.getElementById('token-form').hidden",
        )
        .await;
    browser.type_into("#token", &reader).await;
    browser.click("#token-submit").await;
    browser
        .wait_for("the keys panel again", &js_panel("true"))
        .await;
    let fresh = browser
        .js(&js_panel("[p.open, p.querySelector('.secret').hidden]"))
        .await;
    assert_eq!(
        fresh,
        json!([false, true]),
        "forgetting the token forgot the panel and its secret"
    );
    browser.click(&format!("{PANEL} > summary")).await;
    browser
        .wait_for(
            "the revoked key, listed for the reader",
            &js_panel("!!p.querySelector('.key-list li.key[data-revoked=\"true\"]')"),
        )
        .await;
    browser.click(&format!("{PANEL} .key-create .create")).await;
    let refused = browser
        .wait_for(
            "the read role's refusal",
            &js_panel("(() => { const e = p.querySelector('.keys-error'); return e && !e.hidden ? e.textContent : null; })()"),
        )
        .await;
    assert!(refused.as_str().unwrap().contains("read role"), "{refused}");
    let (_, v) = admin_call(&gw, Method::GET, "/admin/v1/tenants/demo/keys", TOKEN, None).await;
    assert_eq!(
        v["data"].as_array().unwrap().len(),
        1,
        "the reader created nothing"
    );
    browser.quit().await;
}
