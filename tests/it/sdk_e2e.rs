//! End-to-end: the official `openai` Python SDK through the gateway to the
//! simulated upstream.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_chat_stream_embeddings_and_models_work_through_the_gateway() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, limits().rpm(1000).tpm(100000))
        .start()
        .await;
    let r = run_python("sdk_basic.py", &gw.base_url(), &[]).await.json();
    assert_eq!(
        r["chat_content"], r["stream_content"],
        "streamed content reassembles to the same text"
    );
    assert!(!r["chat_content"].as_str().unwrap().is_empty());
    assert_eq!(
        r["stream_usage_chunks"], 0,
        "usage chunk stripped when the client did not ask"
    );
    assert_eq!(r["embeddings"], 2);
    assert_eq!(
        r["models"],
        serde_json::json!(["gpt-4o-mini", "text-embedding-3-small"])
    );
    let h = &r["chat_headers"];
    assert!(h["x-ratelimit-remaining-tokens"].is_string(), "{h}");
    assert!(h["x-request-id"].is_string());
    assert!(h["x-upstream-request-id"]
        .as_str()
        .unwrap()
        .starts_with("req_mock_"));
    gw.settled().await;
    assert_eq!(gw.memory().live_holds(), 0, "every reservation settled");
}
