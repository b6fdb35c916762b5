//! Graceful shutdown on the real binary (a SIGTERM
//! during a stream): the listener closes at once; a stream that ends
//! within `server.shutdown_grace_secs` completes; one that does not is cut
//! off cleanly at the deadline; either way it is settled and the process
//! exits 0.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::support::*;

fn write_config(dir: &std::path::Path, mock: &str, grace_secs: u64) -> PathBuf {
    let mut config = TestConfig::standard(mock, 50, limits().tpm(100000));
    config.server.shutdown_grace_secs = Some(grace_secs as i64);
    config.write(dir)
}

/// Starts a stream, waits for its first chunk, sends SIGTERM, and returns
/// the whole stream text, the time from SIGTERM to its end, and the gateway.
async fn stream_through_sigterm(gw: &GatewayProcess, body: Value) -> (String, Duration) {
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.root))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    let first = stream.next().await.expect("a first chunk").unwrap();
    text.push_str(&String::from_utf8_lossy(&first));
    gw.signal("TERM");
    let t0 = Instant::now();
    gw.wait_log(
        "shutting down: no new connections; in-flight requests and streams may finish",
        1,
    )
    .await;
    // No new connections.
    let refused = reqwest::Client::new()
        .get(format!("{}/healthz", gw.root))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a new connection was accepted after SIGTERM"
    );
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(
            &chunk.expect("the stream ends cleanly"),
        ));
    }
    (text, t0.elapsed())
}

/// The stream's final line says it ended with `ending`, and shutdown
/// drained every settlement without a failure.
async fn assert_stream_ended_and_settled(gw: &GatewayProcess, ending: &str) {
    let finished = gw.wait_log("stream finished", 1).await;
    assert_eq!(finished[0].pointer("/fields/ending"), Some(&json!(ending)));
    let done = gw.wait_log("settlements drained", 1).await;
    assert_eq!(done[0].pointer("/fields/failed"), Some(&json!(0)));
    assert_shutdown_complete_last(gw).await;
    let settled = done[0].pointer("/fields/settled").and_then(Value::as_u64);
    assert!(settled.is_some_and(|n| n >= 1), "{}", done[0]);
}

/// `shutdown complete` is the process's last log line.
pub async fn assert_shutdown_complete_last(gw: &GatewayProcess) {
    gw.wait_log("shutdown complete", 1).await;
    let logs = gw.logs();
    let last = logs.last().and_then(|l| l.pointer("/fields/message"));
    assert_eq!(
        last,
        Some(&json!("shutdown complete")),
        "{}",
        gw.dump_logs()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_a_stream_finish_within_the_grace_period_then_exits_0() {
    let mock = start_mock().await;
    mock.state.set_token_delay(Duration::from_millis(40));
    mock.state.set_output_tokens(50);
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), &mock.base_url(), 30);
    let mut gw = GatewayProcess::start(&path, &[]).await;

    let (text, _) = stream_through_sigterm(
        &gw,
        json!({"model": "gpt-4o-mini", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let frames = sse_chunks(&text);
    assert!(frames.iter().all(|f| f.get("error").is_none()), "{text}");
    assert!(frames
        .iter()
        .any(|f| f["choices"][0]["finish_reason"] == "stop"));
    let usage = frames.iter().find(|f| f["usage"].is_object()).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 50);

    let status = gw.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "{}", gw.dump_logs());
    assert_stream_ended_and_settled(&gw, "completed").await;
    assert!(gw
        .logs_with(
            "shutdown grace period over: cutting off streams and ending requests still running"
        )
        .is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_still_running_at_the_deadline_is_cut_off_cleanly_and_settled() {
    let mock = start_mock().await;
    mock.state.set_token_delay(Duration::from_millis(50));
    mock.state.set_output_tokens(400); // 20 s: far beyond the grace period
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), &mock.base_url(), 1);
    let mut gw = GatewayProcess::start(&path, &[]).await;

    let (text, elapsed) = stream_through_sigterm(
        &gw,
        json!({"model": "gpt-4o-mini", "stream": true, "max_tokens": 1000,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert!(
        elapsed < Duration::from_secs(8),
        "the cutoff came {elapsed:?} after SIGTERM"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let frames = sse_chunks(&text);
    assert!(frames.iter().all(|f| f.get("error").is_none()), "{text}");
    let last_choice = frames
        .iter()
        .rev()
        .find(|f| f["choices"].as_array().is_some_and(|c| !c.is_empty()))
        .unwrap();
    assert_eq!(
        last_choice["choices"][0]["finish_reason"], "length",
        "{text}"
    );
    let usage = &frames.last().unwrap()["usage"];
    let delivered = frames
        .iter()
        .filter(|f| {
            f["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .count() as u64;
    assert_eq!(usage["completion_tokens"], json!(delivered));
    assert!(delivered > 0 && delivered < 400, "delivered {delivered}");

    let status = gw.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "{}", gw.dump_logs());
    gw.wait_log(
        "shutdown grace period over: cutting off streams and ending requests still running",
        1,
    )
    .await;
    assert_stream_ended_and_settled(&gw, "cut_off").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_still_waiting_for_its_upstream_at_the_deadline_gets_503_and_is_settled() {
    let mock = start_mock().await;
    // Non-streaming answers wait K × token_delay: 100 × 100 ms = 10 s.
    mock.state.set_token_delay(Duration::from_millis(100));
    mock.state.set_output_tokens(100);
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), &mock.base_url(), 1);
    let mut gw = GatewayProcess::start(&path, &[]).await;

    let root = gw.root.clone();
    let pending = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{root}/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap()
    });
    // Wait until the upstream has the request.
    let t = Instant::now();
    while mock.state.request_count() == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.signal("TERM");
    let t0 = Instant::now();
    let resp = pending.await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    // The refusal carries the request's id, the one its log line has.
    let id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .expect("the 503 carries x-request-id");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "The gateway is shutting down; retry the request."
    );
    let status = gw.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "{}", gw.dump_logs());
    let done = gw.wait_log("settlements drained", 1).await;
    assert_shutdown_complete_last(&gw).await;
    assert_eq!(done[0].pointer("/fields/settled"), Some(&json!(1)));
    assert_eq!(done[0].pointer("/fields/failed"), Some(&json!(0)));
    let logs = gw.dump_logs();
    assert!(
        logs.lines()
            .any(|l| l.contains(&format!("\"request_id\":\"{id}\""))),
        "no log line with request_id {id}: {logs}"
    );
}
