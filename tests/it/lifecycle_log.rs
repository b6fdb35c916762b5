//! The lifecycle's last phase (`finish`) writes the request's final log
//! line exactly once on every path: refused, answered, streamed to the
//! end, cut off, client gone mid-stream, upstream failed. Fault guarded
//! against: the final line was written in three places, and some paths
//! (an upstream failure, a client that left) wrote none or another one.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::support::config::tenant;
use crate::support::mock_upstream::Fault;
use crate::support::*;

const CUT_KEY: &str = "sk-lifecycle-cut";
const ONE_KEY: &str = "sk-lifecycle-one-rpm";

fn messages() -> Value {
    json!([{"role": "user", "content": "Tell me a long story."}])
}

/// The final lines of request `id` (lines with an `outcome`).
fn finals(gw: &GatewayProcess, id: &str) -> Vec<Value> {
    gw.logs()
        .into_iter()
        .filter(|l| l.pointer("/fields/request_id").and_then(Value::as_str) == Some(id))
        .filter(|l| l.pointer("/fields/outcome").is_some())
        .collect()
}

/// Waits for the final line of `id`, then a little longer, and checks it
/// came exactly once with `outcome`.
async fn assert_one_final(gw: &GatewayProcess, id: &str, outcome: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while finals(gw, id).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no final line for {id}; logs:\n{}",
            gw.dump_logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = finals(gw, id);
    assert_eq!(lines.len(), 1, "{id}: {lines:#?}");
    assert_eq!(
        lines[0].pointer("/fields/outcome"),
        Some(&json!(outcome)),
        "{id}: {:#}",
        lines[0]
    );
}

fn request(gw: &GatewayProcess, key: &str, id: &str, body: Value) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.root))
        .bearer_auth(key)
        .header("x-request-id", id)
        .json(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_log_line_is_written_exactly_once_on_every_path() {
    let mock = start_mock().await;
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages()}));
    let mut config = TestConfig::standard(&mock.base_url(), 20, limits().tpm(1000000));
    config.estimation.stream_extension_step = Some(10);
    config.tenants.push(tenant(
        "cut",
        "k",
        CUT_KEY,
        limits().tokens_per_day(input + 50),
    ));
    config
        .tenants
        .push(tenant("one", "k", ONE_KEY, limits().rpm(1)));
    let dir = tempfile::tempdir().unwrap();
    let path = config.write(dir.path());
    let gw = GatewayProcess::start(&path, &[]).await;
    let plain = json!({"model": "gpt-4o-mini", "messages": messages()});
    let streamed = json!({"model": "gpt-4o-mini", "messages": messages(), "stream": true});

    // Refused: the second request of a tenant allowed one per minute.
    let r = request(&gw, ONE_KEY, "lc-first", plain.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = request(&gw, ONE_KEY, "lc-refused", plain.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_one_final(&gw, "lc-refused", "refused").await;

    // Answered.
    let r = request(&gw, KEY, "lc-answered", plain.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    assert_one_final(&gw, "lc-answered", "answered").await;

    // Streamed to the end.
    let r = request(&gw, KEY, "lc-streamed", streamed.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(String::from_utf8_lossy(&r.bytes().await.unwrap()).contains("[DONE]"));
    assert_one_final(&gw, "lc-streamed", "streamed").await;

    // Cut off: the day's quota ends about 50 tokens into a 300-token answer.
    mock.state.set_output_tokens(300);
    let r = request(&gw, CUT_KEY, "lc-cut", streamed.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
    assert_one_final(&gw, "lc-cut", "cut_off").await;

    // Client gone mid-stream: the first chunk read, then the connection dropped.
    mock.state.set_token_delay(Duration::from_millis(20));
    let r = request(&gw, KEY, "lc-gone", streamed.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut chunks = r.bytes_stream();
    chunks.next().await.expect("a first chunk").unwrap();
    drop(chunks);
    assert_one_final(&gw, "lc-gone", "client_gone").await;
    mock.state.set_token_delay(Duration::ZERO);

    // Upstream failed.
    mock.state.set_fault(Some(Fault::ServerError));
    let r = request(&gw, KEY, "lc-failed", plain.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    assert_one_final(&gw, "lc-failed", "upstream_failed").await;
    mock.state.set_fault(None);
}

/// A 502 for an upstream that cannot be reached: the line of the failure
/// names the deployment and the URL it tried, without the credentials its
/// base URL carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_logged_with_its_deployment_and_url() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TestConfig::standard(
        "http://user:s3cret-in-url@127.0.0.1:9/v1",
        50,
        limits().tpm(100_000),
    )
    .write(dir.path());
    let gw = GatewayProcess::start(&cfg, &[]).await;
    let r = request(
        &gw,
        KEY,
        "unreachable-1",
        json!({"model": "gpt-4o-mini", "max_tokens": 5, "messages": messages()}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 502);
    let lines = gw.wait_log("upstream request failed", 1).await;
    let fields = &lines[0]["fields"];
    assert_eq!(fields["deployment"], "mock", "{fields}");
    assert_eq!(
        fields["url"], "http://127.0.0.1:9/v1/chat/completions",
        "{fields}"
    );
    assert!(
        !gw.dump_logs().contains("s3cret"),
        "a secret of the base URL was logged"
    );
}

/// A refused request's final line names its method and route (the path
/// itself where no route matched): before, it named neither, and a 401 on
/// `/v1/messages` read like one on `/v1/chat/completions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_requests_line_names_its_method_and_route() {
    let mock = start_mock().await;
    let mut config = TestConfig::standard(&mock.base_url(), 20, limits().tpm(1000000));
    config
        .tenants
        .push(tenant("one", "k", ONE_KEY, limits().rpm(1)));
    let dir = tempfile::tempdir().unwrap();
    let path = config.write(dir.path());
    let gw = GatewayProcess::start(&path, &[]).await;
    let client = reqwest::Client::new();
    let plain = json!({"model": "gpt-4o-mini", "messages": messages()});
    let send = |m: reqwest::Method, path: &str, key: &str, id: &str| {
        client
            .request(m, format!("{}{path}", gw.root))
            .bearer_auth(key)
            .header("x-request-id", id)
            // Anthropic's name, on /v1/messages.
            .header("request-id", id)
            .json(&plain)
    };
    let cases = [
        (
            reqwest::Method::POST,
            "/v1/chat/completions",
            ONE_KEY,
            "rr-1",
            200,
            None,
        ),
        (
            reqwest::Method::POST,
            "/v1/chat/completions",
            ONE_KEY,
            "rr-rate",
            429,
            Some(("POST", "/v1/chat/completions")),
        ),
        (
            reqwest::Method::POST,
            "/v1/messages",
            "sk-unknown",
            "rr-key",
            401,
            Some(("POST", "/v1/messages")),
        ),
        (
            reqwest::Method::POST,
            "/openai/deployments/gpt-4o-mini/chat/completions",
            "sk-unknown",
            "rr-azure",
            401,
            Some(("POST", "/openai/deployments/{deployment}/chat/completions")),
        ),
        (
            reqwest::Method::GET,
            "/v1/models",
            "sk-unknown",
            "rr-models",
            401,
            Some(("GET", "/v1/models")),
        ),
        (
            reqwest::Method::GET,
            "/v1/no-such-thing",
            KEY,
            "rr-unknown",
            404,
            Some(("GET", "/v1/no-such-thing")),
        ),
    ];
    for (m, path, key, id, status, named) in cases {
        let r = send(m, path, key, id).send().await.unwrap();
        assert_eq!(r.status(), status, "{path}");
        let Some((method, route)) = named else {
            continue;
        };
        assert_one_final(&gw, id, "refused").await;
        let line = &finals(&gw, id)[0];
        assert_eq!(
            (line.pointer("/fields/method"), line.pointer("/fields/path")),
            (Some(&json!(method)), Some(&json!(route))),
            "{id}: {line:#}"
        );
    }
}
