//! Budget arithmetic through the whole gateway (issue: the gateway end to
//! end on the embedded store): exact admission, refunds, debt, output caps,
//! all-or-nothing, impossible requests. The clock is frozen, so nothing
//! refills unless a test moves it.

use std::time::Duration;

use crate::support::*;
use budgetgate::budget::BudgetName;
use budgetgate::clock::Clock;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_parallel_sdk_requests_admit_exactly_floor_of_capacity_over_estimate() {
    let mock = start_mock().await;
    mock.state.hold();
    let mut c = TestConfig::standard(&mock.base_url(), 100, limits().tpm(1000).rpm(1000));
    // No bound known: an uncapped request reserves (and is capped at) the
    // default, so E is exact.
    c.model("gpt-4o-mini").max_output_tokens = None;
    let gw = c.start().await;
    let e = chat_input_tokens(
        &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
    ) + 100;
    let expected = (1000 / e) as usize;

    let base = gw.base_url();
    let py = tokio::spawn(async move { run_python("sdk_burst.py", &base, &["50"]).await });
    // Every admitted request waits at the upstream; refusals return at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut stable_since = None;
    loop {
        let held = mock.state.held_count();
        assert!(
            held <= expected,
            "more requests reached the upstream ({held}) than fit ({expected})"
        );
        assert!(
            gw.memory().live_holds() as u64 * e <= 1000,
            "live reservations exceed the bucket"
        );
        if held == expected {
            let since = *stable_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() > Duration::from_millis(500) {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {held} of {expected} admissions reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    mock.state.release();
    let r = py.await.unwrap().json();
    let results = r.as_array().unwrap();
    let admitted = results.iter().filter(|x| x["ok"] == true).count();
    assert_eq!(
        admitted, expected,
        "E = {e}: admitted {admitted}, expected floor(1000/E) = {expected}"
    );
    for x in results.iter().filter(|x| x["ok"] != true) {
        assert_eq!(x["status"], 429, "{x}");
        assert_eq!(x["code"], "rate_limit_exceeded", "{x}");
        assert_eq!(x["type"], "tokens", "{x}");
        assert!(
            x["retry_after"].as_str().unwrap().parse::<u64>().unwrap() >= 1,
            "{x}"
        );
        assert!(x["remaining_tokens"].is_string(), "{x}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_output_is_refunded_and_shows_in_the_next_remaining_tokens() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let mut c = TestConfig::standard(&mock.base_url(), 100, limits().tpm(1000).rpm(1000));
    // No bound known: an uncapped request reserves the default whole.
    c.model("gpt-4o-mini").max_output_tokens = None;
    let gw = c.start().await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let input = chat_input_tokens(&body);
    let e = input + 100;
    let a = input + 10; // the mock's prompt count equals OpenAI's rule, which the estimate equals
    let r1 = post_chat(&gw, KEY, &body).await;
    assert_eq!(r1.status(), 200);
    let v: Value = r1.json().await.unwrap();
    assert_eq!(v["usage"]["total_tokens"].as_u64().unwrap(), a);
    gw.settled().await;
    let r2 = post_chat(&gw, KEY, &body).await;
    let remaining: i64 = header(&r2, "x-ratelimit-remaining-tokens")
        .unwrap()
        .parse()
        .unwrap();
    // Without the refund: 1000 - E - E. With it: higher by E - A.
    assert_eq!(remaining, 1000 - e as i64 - e as i64 + (e - a) as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underestimate_becomes_debt_that_delays_the_next_admission_exactly() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, limits().tpm(1000))
        .start()
        .await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10});
    let input = chat_input_tokens(&body);
    let e = input + 10;
    // The upstream reports far more input than estimated (an estimate
    // short of the provider's tokenizer), within what the gateway trusts
    // (DESIGN "The upstream's usage is bounded"): the output stays within
    // the cap sent.
    mock.state.set_usage_override(Some(input + 1000), Some(10));
    let a = input + 1000 + 10;
    assert_eq!(post_chat(&gw, KEY, &body).await.status(), 200);
    gw.settled().await;
    mock.state.set_usage_override(None, None);
    assert_eq!(gw.t1(BudgetName::Tpm).await, 1000 - a as i64);
    // Level is 1000 - A (negative); the next request needs E: wait = (E - (1000 - A)) tokens at 1000/min.
    let wait_micros = (e as i64 - (1000 - a as i64)) as u64 * 60_000_000 / 1000;
    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 429);
    assert_eq!(
        header(&r, "retry-after-ms").unwrap(),
        wait_micros.div_ceil(1000).to_string()
    );
    gw.clock.advance(wait_micros - 1);
    assert_eq!(
        post_chat(&gw, KEY, &body).await.status(),
        429,
        "one microsecond early is still refused"
    );
    gw.clock.advance(1);
    assert_eq!(
        post_chat(&gw, KEY, &body).await.status(),
        200,
        "admitted exactly when the debt is repaid"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_output_cap_goes_upstream_unless_an_uncapped_answer_has_a_bound() {
    let mock = start_mock().await;
    let mut c = TestConfig::standard(&mock.base_url(), 100, limits().tpm(100000));
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(100),
        ..config::model("gpt-4o", &["mock"])
    });
    let gw = c.start().await;
    let uncapped = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post_chat(&gw, KEY, &uncapped).await.status(), 200);
    let capped = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7});
    assert_eq!(post_chat(&gw, KEY, &capped).await.status(), 200);
    let unbounded = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post_chat(&gw, KEY, &unbounded).await.status(), 200);
    let reqs = mock.state.requests();
    assert!(
        reqs[0].body.get("max_completion_tokens").is_none(),
        "uncapped, on a model with a bound (max_output_tokens): no cap"
    );
    assert_eq!(
        reqs[1].body["max_completion_tokens"], 7,
        "capped: the client's cap"
    );
    assert_eq!(
        reqs[2].body["max_completion_tokens"], 100,
        "uncapped, no bound known: the reserved output is the cap"
    );
    assert!(
        reqs.iter().all(|r| r.header("authorization").is_none()),
        "the client's key is never forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_model_budget_leaves_the_tenant_bucket_unchanged() {
    let mock = start_mock().await;
    let mut config = TestConfig::standard(&mock.base_url(), 100, limits().tpm(100000).rpm(100));
    config
        .tenant("t1")
        .model_limits
        .insert("gpt-4o-mini".into(), limits().tpm(150));
    let gw = config.start().await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post_chat(&gw, KEY, &body).await.status(), 200);
    gw.settled().await;
    let tpm_before = gw.t1(BudgetName::Tpm).await;
    let rpm_before = gw.t1(BudgetName::Rpm).await;
    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("tenant_model:t1/gpt-4o-mini"), "{msg}");
    assert_eq!(gw.t1(BudgetName::Tpm).await, tpm_before);
    assert_eq!(gw.t1(BudgetName::Rpm).await, rpm_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_larger_than_capacity_is_refused_for_good_and_changes_nothing() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, limits().tpm(1000).rpm(10))
        .start()
        .await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000});
    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-should-retry").as_deref(), Some("false"));
    assert!(header(&r, "retry-after").is_none());
    assert!(header(&r, "retry-after-ms").is_none());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "tokens");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("capacity 1000") && msg.contains("requested"),
        "{msg}"
    );
    assert_eq!(gw.t1(BudgetName::Tpm).await, 1000);
    assert_eq!(gw.t1(BudgetName::Rpm).await, 10);
    assert_eq!(mock.state.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncapped_default_is_lowered_to_fit_the_bucket() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 1000, limits().tpm(300))
        .start()
        .await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let input = chat_input_tokens(&body);
    assert_eq!(post_chat(&gw, KEY, &body).await.status(), 200);
    assert_eq!(
        mock.state.requests()[0].body["max_completion_tokens"],
        300 - input
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_32_kb_is_estimated_exactly_forwarded_unchanged_and_settled() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let gw = TestConfig::standard(&mock.base_url(), 100, limits().tpm(1000000).rpm(10))
        .start()
        .await;
    let system =
        "The gateway reserves tokens before forwarding — naïve café 日本語.\n".repeat(1500);
    let body = json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "temperature": 0.25,
    });
    let bytes = serde_json::to_vec(&body).unwrap();
    assert!(bytes.len() > budgetgate::estimate::OFF_IO_THREAD_BYTES);
    let input = chat_input_tokens(&body);
    assert!(input > 10_000, "{input}");
    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 200);
    // Reserved: exactly the estimate (input + max_tokens).
    assert_eq!(
        header(&r, "x-ratelimit-remaining-tokens").unwrap(),
        (1_000_000 - input - 50).to_string()
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(input));
    assert_eq!(mock.state.requests()[0].body, body);
    gw.settled().await;
    // Settled: the unused output is refunded.
    assert_eq!(gw.t1(BudgetName::Tpm).await, 1_000_000 - input as i64 - 10);
    assert_eq!(gw.memory().live_holds(), 0);
    // The same prompt again (now from the token-count cache): the same figure.
    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "x-ratelimit-remaining-tokens").unwrap(),
        (1_000_000 - input - 10 - input - 50).to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untouched_fields_are_forwarded_in_the_clients_order_byte_for_byte() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, limits().tpm(100000))
        .start()
        .await;
    // Odd but valid JSON: spacing, a number written with a trailing zero,
    // an escaped member name, members out of alphabetical order.
    let raw = r#"{"model":"gpt-4o-mini","temperature":0.250,"messages":[{"role":"user","content":"hi"}],"metadata":{"b":"1",  "a":"2"},"user\u0041":"x","max_tokens":5}"#;
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    // `model` is the one field the gateway rewrites here (to the upstream's
    // model name); it goes last, everything else is the client's text.
    let forwarded = mock.state.requests()[0].raw_body.clone();
    assert_eq!(
        std::str::from_utf8(&forwarded).unwrap(),
        r#"{"temperature":0.250,"messages":[{"role":"user","content":"hi"}],"metadata":{"b":"1",  "a":"2"},"userA":"x","max_tokens":5,"model":"gpt-4o-mini"}"#
    );
}

/// A rolling 5-hour quota through the gateway on a frozen clock: refused
/// at the limit with `retry-after` (and the `RateLimit` field's `t`) at the
/// instant the oldest sub-bucket has slid out, within one 5-minute
/// sub-bucket of when an exact log would admit; admitted again from then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5h_window_refuses_at_its_limit_and_admits_when_the_oldest_sub_bucket_slides_out() {
    const G: u64 = 300_000_000;
    const W: u64 = 5 * 3_600_000_000;
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 20,
        "messages": [{"role": "user", "content": "hi"}]});
    let reserve = chat_input_tokens(&body) + 20;
    // Room for two reservations, not three.
    let c = TestConfig::standard(
        &mock.base_url(),
        100,
        limits().tokens_per_5h(reserve * 5 / 2),
    );
    let gw = c.start().await;
    // 40 s into a sub-bucket: the first request.
    let t0 = gw.clock.now_micros() - gw.clock.now_micros() % G + 40_000_000;
    gw.clock.set(t0);
    let (s, _, _) = post_chat_json(&gw, KEY, &body).await;
    assert_eq!(s, 200);
    gw.settled().await;
    // An hour later, the rest.
    gw.clock.set(t0 + 3_600_000_000);
    let mut admitted = 1;
    let (status, v, h) = loop {
        let (s, v, h) = post_chat_json(&gw, KEY, &body).await;
        gw.settled().await;
        if s != 200 {
            break (s, v, h);
        }
        admitted += 1;
        assert!(admitted < 10, "never refused");
    };
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("tokens_per_5h") && msg.contains("rolling window"),
        "{msg}"
    );
    let now = gw.clock.now_micros();
    // The first request's sub-bucket lies wholly beyond the window from
    // t0 − 40 s + 61 sub-buckets; an exact log would admit at t0 + W.
    let slides_out = t0 - 40_000_000 + 61 * G;
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert_eq!(retry, (slides_out - now).div_ceil(1_000_000));
    let exact = (t0 + W - now) / 1_000_000;
    assert!(
        retry >= exact && retry - exact <= G / 1_000_000,
        "{retry} vs {exact}"
    );
    let field = h["ratelimit"].to_str().unwrap();
    assert!(field.contains(&format!(";t={retry}")), "{field}");

    gw.clock.set(slides_out - 1);
    assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 429);
    gw.clock.set(slides_out);
    assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 200);
}

/// The admin API's budget list and a tenant's budgets name when a rolling
/// window's oldest units slide out, and how many: the first request's
/// charge, at the end of its sub-bucket plus the window; a window from
/// first use has no slide (it resets whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_names_when_a_rolling_windows_next_units_slide_out() {
    const G: u64 = 300_000_000;
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 20,
        "messages": [{"role": "user", "content": "hi"}]});
    let mut c = TestConfig::standard(
        &mock.base_url(),
        100,
        limits().rpm(1000).tokens_per_5h(100_000),
    );
    c.tenants[0].keys[0].limits.tokens_per_week = Some(100_000);
    let gw = c.start().await;
    gw.state.set_admin_token(Some("admin-slides"));
    let t0 = gw.clock.now_micros() - gw.clock.now_micros() % G + 40_000_000;
    gw.clock.set(t0);
    assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 200);
    gw.settled().await;
    let charged = chat_input_tokens(&body) + 10;
    gw.clock.set(t0 + 3_600_000_000);
    let r = admin_get(&gw, "/admin/v1/budgets", Some("admin-slides")).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let budgets = v["tenants"][0]["budgets"].as_array().unwrap();
    let find = |name: &str| {
        budgets
            .iter()
            .find(|b| b["budget"] == name)
            .unwrap_or_else(|| panic!("no {name} in {v}"))
    };
    let five = find("tokens_per_5h");
    // t0's sub-bucket slides out 61 sub-buckets after its start.
    let out = t0 - 40_000_000 + 61 * G;
    assert_eq!(
        five["next_slide"],
        json!({"in_micros": out - (t0 + 3_600_000_000), "in": five["next_slide"]["in"], "units": charged}),
        "{five}"
    );
    let week = find("tokens_per_week");
    // A week's sub-buckets are hours.
    let h = 3_600_000_000u64;
    let week_out = t0 - t0 % h + 169 * h;
    assert_eq!(
        week["next_slide"]["in_micros"],
        json!(week_out - (t0 + h)),
        "{week}"
    );
    assert_eq!(week["next_slide"]["units"], json!(charged));
    // Budgets that do not roll have none.
    assert!(find("rpm")["next_slide"].is_null());
}

/// `window = "from_first_use"`: the 5-hour quota starts at the first
/// request and resets whole at that window's end: refused at the limit
/// with `retry-after` exactly the end (a reset, not a slide), admitted
/// again from the end with the whole limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5h_window_from_first_use_resets_whole_at_its_end() {
    const W: u64 = 5 * 3_600_000_000;
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 20,
        "messages": [{"role": "user", "content": "hi"}]});
    let reserve = chat_input_tokens(&body) + 20;
    let mut l = limits().tokens_per_5h(reserve * 5 / 2);
    l.window = Some("from_first_use".into());
    let c = TestConfig::standard(&mock.base_url(), 100, l);
    let gw = c.start().await;
    let t0 = gw.clock.now_micros() + 123_456_789;
    gw.clock.set(t0);
    let (s, _, h) = post_chat_json(&gw, KEY, &body).await;
    assert_eq!(s, 200);
    gw.settled().await;
    let policy = h["ratelimit-policy"]
        .to_str()
        .unwrap_or_default()
        .to_owned();
    gw.clock.set(t0 + 3_600_000_000);
    let (status, v, h) = loop {
        let (s, v, h) = post_chat_json(&gw, KEY, &body).await;
        gw.settled().await;
        if s != 200 {
            break (s, v, h);
        }
    };
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("tokens_per_5h") && msg.contains("resets") && !msg.contains("rolling"),
        "{msg}"
    );
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert_eq!(
        retry,
        (t0 + W - gw.clock.now_micros()).div_ceil(1_000_000),
        "{policy}"
    );
    gw.clock.set(t0 + W - 1);
    assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 429);
    gw.clock.set(t0 + W);
    // A new window: two reservations fit again.
    for _ in 0..2 {
        assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 200);
        gw.settled().await;
    }
}
