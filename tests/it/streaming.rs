//! Streaming acceptance (DESIGN section 5): relay by frames, meter
//! every chunk, extend the reservation, cut off cleanly, settle what was
//! delivered on every exit path. Each test is named after the fault it
//! guards against.
//!
//! Pure tests drive `FrameSplitter` + `StreamProcessor` over the recorded
//! streams in `tests/fixtures/`; end-to-end tests run the gateway in-process
//! on a frozen clock against the simulated upstream (or a raw fixture
//! upstream) and drive it with the official `openai` Python SDK.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::mock_upstream::{self, Fault};
use crate::support::store_spy::{Call, Hooks, Spy};
use crate::support::*;
use async_trait::async_trait;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::{BudgetName, StoreError};
use budgetgate::clock::{Clock, ManualClock};
use budgetgate::config::estimate::Encoding;
use budgetgate::dialects::Dialect;
use budgetgate::dialects::UsageBreakdown as Usage;
use budgetgate::upstreams::relay::{FrameAction, StreamProcessor};
use budgetgate::upstreams::sse::FrameSplitter;
use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------------------
// Recorded streams
// ---------------------------------------------------------------------------

/// One recorded upstream stream and what the relay must make of it.
struct Fixture {
    name: &'static str,
    choices: u64,
    /// Output tokens counted from the deltas (o200k_base, per delta).
    tokens: u64,
    /// The upstream's usage chunk, if it sends one.
    usage: Option<Usage>,
    /// True when the stream carries `id:`/`retry:`-only frames (dropped for
    /// every client), so a usage-asking client does not get the raw bytes.
    has_field_only_frames: bool,
}

const FIXTURES: &[Fixture] = &[
    Fixture {
        name: "openai_chat_usage",
        choices: 1,
        tokens: 24,
        usage: Some(Usage::from_counts(19, 24)),
        has_field_only_frames: false,
    },
    Fixture {
        name: "crlf_comments_fields",
        choices: 1,
        tokens: 12,
        usage: None,
        has_field_only_frames: true,
    },
    Fixture {
        name: "azure_content_filter",
        choices: 1,
        tokens: 7,
        usage: Some(Usage::from_counts(13, 7)),
        has_field_only_frames: false,
    },
    Fixture {
        name: "n2_interleaved",
        choices: 2,
        tokens: 9,
        usage: Some(Usage::from_counts(11, 9)),
        has_field_only_frames: false,
    },
    Fixture {
        name: "tool_calls_cr",
        choices: 1,
        tokens: 11,
        usage: None,
        has_field_only_frames: false,
    },
];

fn fixture_bytes(file: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// What the relay made of a stream, independent of how it was split.
#[derive(Debug, PartialEq, Eq)]
struct Relayed {
    client: Vec<u8>,
    tokens: u64,
    usage: Option<Usage>,
    done: bool,
    all_finished: bool,
}

/// Feeds `pieces` through a splitter and a processor the way `relay::run`
/// does, end of stream included.
fn relay_pieces<'a>(
    pieces: impl IntoIterator<Item = &'a [u8]>,
    wants_usage: bool,
    choices: u64,
) -> Relayed {
    let mut splitter = FrameSplitter::new();
    let mut proc = StreamProcessor::new(
        Dialect::ChatCompletions,
        Encoding::O200kBase,
        wants_usage,
        choices,
    );
    let mut client = Vec::new();
    let mut take = |frame: Bytes, proc: &mut StreamProcessor| {
        if let FrameAction::Forward(b) = proc.on_frame(frame) {
            client.extend_from_slice(&b);
        }
    };
    for piece in pieces {
        for frame in splitter.push(piece) {
            take(frame, &mut proc);
        }
    }
    if let Some(last) = splitter.finish() {
        take(last, &mut proc);
    }
    Relayed {
        client,
        tokens: proc.output_tokens(),
        usage: proc.usage(),
        done: proc.is_done(),
        all_finished: proc.all_finished(),
    }
}

#[test]
fn finish_reasons_of_choices_never_requested_do_not_finish_the_stream() {
    let frame = |idx: u64| {
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": idx, "delta": {"content": "hi"}, "finish_reason": "stop"}]})
        )
    };
    let bytes = format!("{}{}", frame(7), frame(8));
    let r = relay_pieces([bytes.as_bytes()], false, 1);
    assert!(!r.all_finished, "choice 0 never finished");
    let bytes = format!("{}{}", frame(1), frame(0));
    assert!(relay_pieces([bytes.as_bytes()], false, 2).all_finished);
}

/// `client` without the gateway's usage chunk, which must sit right before
/// the `data: [DONE]` frame of `expected` and report `tokens` of output.
fn without_gateway_usage(client: &[u8], expected: &[u8], tokens: u64) -> Vec<u8> {
    let done = expected
        .windows(12)
        .rposition(|w| w == b"data: [DONE]")
        .expect("[DONE] in the expected bytes");
    let tail = expected.len() - done;
    assert!(client.len() > expected.len(), "a usage chunk was added");
    let added = &client[done..client.len() - tail];
    let text = std::str::from_utf8(added).expect("utf-8");
    let json = text
        .strip_prefix("data: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .expect("one data frame");
    let v: Value = serde_json::from_str(json).expect("JSON usage chunk");
    assert_eq!(
        v["usage"]["completion_tokens"], tokens,
        "the gateway's count"
    );
    assert_eq!(v["choices"], json!([]));
    [&client[..done], &client[client.len() - tail..]].concat()
}

fn relay_split_at(bytes: &[u8], cuts: &[usize], wants_usage: bool, choices: u64) -> Relayed {
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for &c in cuts {
        pieces.push(&bytes[start..c]);
        start = c;
    }
    pieces.push(&bytes[start..]);
    relay_pieces(pieces, wants_usage, choices)
}

#[test]
fn dropped_frames_only_id_retry_and_unrequested_usage_chunk_client_bytes_are_upstream_bytes() {
    for f in FIXTURES {
        let upstream = fixture_bytes(&format!("{}.sse", f.name));
        let without_usage = fixture_bytes(&format!("{}.client.sse", f.name));
        let with_usage = if f.has_field_only_frames {
            without_usage.clone()
        } else {
            upstream.clone()
        };
        for (wants_usage, expected) in [(false, &without_usage), (true, &with_usage)] {
            let mut r = relay_pieces([upstream.as_slice()], wants_usage, f.choices);
            if wants_usage && f.usage.is_none() {
                // The client asked for usage and the upstream sent
                // none: the gateway's usage chunk comes right before `[DONE]`;
                // every upstream frame is still relayed byte for byte.
                r.client = without_gateway_usage(&r.client, expected, f.tokens);
            }
            assert!(
                r.client == *expected,
                "{} (client usage {wants_usage}): client bytes differ from the expected file\n got: {}\nwant: {}",
                f.name,
                String::from_utf8_lossy(&r.client),
                String::from_utf8_lossy(expected)
            );
            assert_eq!(r.tokens, f.tokens, "{}: counted output tokens", f.name);
            assert_eq!(
                r.usage, f.usage,
                "{}: upstream usage (last one wins)",
                f.name
            );
            assert!(r.done, "{}: [DONE] seen", f.name);
            assert!(r.all_finished, "{}: every choice finished", f.name);
        }
    }
}

/// Frames a splitter cuts from `pieces`, end of stream included.
fn frames_of<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<Bytes> {
    let mut splitter = FrameSplitter::new();
    let mut frames: Vec<Bytes> = pieces.into_iter().flat_map(|p| splitter.push(p)).collect();
    frames.extend(splitter.finish());
    frames
}

#[test]
fn frame_split_across_reads_at_every_byte_offset_relays_the_same_bytes_and_tokens() {
    // Every two-way split goes through FrameSplitter + StreamProcessor. The
    // processor's only input is the frame sequence, so a split that yields
    // exactly the unsplit frames yields the unsplit result; any other split
    // is processed afresh and compared (this keeps the test fast in debug
    // builds instead of re-counting tokens thousands of times).
    for f in FIXTURES {
        let upstream = fixture_bytes(&format!("{}.sse", f.name));
        let process = |frames: &[Bytes], wants_usage: bool| {
            let mut proc = StreamProcessor::new(
                Dialect::ChatCompletions,
                Encoding::O200kBase,
                wants_usage,
                f.choices,
            );
            let mut client = Vec::new();
            for frame in frames {
                if let FrameAction::Forward(b) = proc.on_frame(frame.clone()) {
                    client.extend_from_slice(&b);
                }
            }
            Relayed {
                client,
                tokens: proc.output_tokens(),
                usage: proc.usage(),
                done: proc.is_done(),
                all_finished: proc.all_finished(),
            }
        };
        let whole = [false, true].map(|u| relay_pieces([upstream.as_slice()], u, f.choices));
        let whole_frames = frames_of([upstream.as_slice()]);
        for cut in 0..=upstream.len() {
            let frames = frames_of([&upstream[..cut], &upstream[cut..]]);
            if frames == whole_frames {
                continue; // the processor sees exactly what it saw unsplit
            }
            for (wants_usage, whole) in [false, true].into_iter().zip(&whole) {
                let split = process(&frames, wants_usage);
                assert!(
                    split == *whole,
                    "{}: split at byte {cut} (usage {wants_usage}) differs",
                    f.name
                );
            }
        }
        for (wants_usage, whole) in [false, true].into_iter().zip(&whole) {
            let bytewise = relay_pieces(upstream.chunks(1), wants_usage, f.choices);
            assert!(bytewise == *whole, "{}: one byte per read differs", f.name);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn frame_split_across_random_multi_way_reads_relays_the_same_bytes_and_tokens(
        which in 0..FIXTURES.len(),
        wants_usage in any::<bool>(),
        mut cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let f = &FIXTURES[which];
        let upstream = fixture_bytes(&format!("{}.sse", f.name));
        let mut cuts: Vec<usize> = cuts.drain(..).map(|i| i.index(upstream.len() + 1)).collect();
        cuts.sort_unstable();
        let whole = relay_pieces([upstream.as_slice()], wants_usage, f.choices);
        let split = relay_split_at(&upstream, &cuts, wants_usage, f.choices);
        prop_assert_eq!(split, whole);
    }
}

#[test]
fn content_filter_chunks_and_keepalives_pass_through_and_count_zero_tokens() {
    let upstream = fixture_bytes("azure_content_filter.sse");
    let mut splitter = FrameSplitter::new();
    let mut proc = StreamProcessor::new(Dialect::ChatCompletions, Encoding::O200kBase, false, 1);
    let mut seen = 0;
    for frame in splitter.push(&upstream) {
        let text = String::from_utf8_lossy(&frame).into_owned();
        let before = proc.output_tokens();
        let action = proc.on_frame(frame.clone());
        let zero_token_frame = text.starts_with(": keep-alive")
            || text.contains("prompt_filter_results")
            || text.contains("content_filter_offsets");
        if zero_token_frame {
            seen += 1;
            assert_eq!(
                action,
                FrameAction::Forward(frame),
                "forwarded byte for byte: {text}"
            );
            assert_eq!(proc.output_tokens(), before, "counts zero tokens: {text}");
        }
    }
    assert_eq!(
        seen, 3,
        "the fixture has a prompt filter chunk, a keep-alive and an offsets chunk"
    );
}

#[test]
fn azure_filter_chunk_first_cutoff_chunk_keeps_the_real_id_and_model() {
    // Azure's first chunk has `"id":""`, `"model":""`; the cutoff chunk must
    // carry the completion's real id and model, like every other chunk.
    let upstream = fixture_bytes("azure_content_filter.sse");
    let mut splitter = FrameSplitter::new();
    let mut proc = StreamProcessor::new(Dialect::ChatCompletions, Encoding::O200kBase, true, 1);
    for frame in splitter.push(&upstream).into_iter().take(4) {
        proc.on_frame(frame);
    }
    let frames = proc.cutoff_frames(13);
    assert_eq!(frames.len(), 3, "final chunk, usage chunk, [DONE]");
    let chunk: Value = serde_json::from_slice(frames[0].strip_prefix(b"data: ").unwrap()).unwrap();
    assert_eq!(chunk["id"], "chatcmpl-AzB1e2f3g4h5i6j7k8l9m0");
    assert_eq!(chunk["model"], "gpt-4o-2024-11-20");
    assert_eq!(chunk["created"], 1741570283);
    assert_eq!(chunk["choices"][0]["finish_reason"], "length");
    let usage: Value = serde_json::from_slice(frames[1].strip_prefix(b"data: ").unwrap()).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    assert_eq!(usage["usage"]["prompt_tokens"], 13);
    assert_eq!(&frames[2][..], b"data: [DONE]\n\n");
}

// ---------------------------------------------------------------------------
// End-to-end harness
// ---------------------------------------------------------------------------

/// The standard config with the stream extension `step` and the output
/// default exposed.
fn stream_config(upstream: &str, default_out: u64, step: u64, tenant_limits: Limits) -> TestConfig {
    let mut config = TestConfig::standard(upstream, default_out, tenant_limits);
    config.estimation.stream_extension_step = Some(step as i64);
    config
}

fn msgs(text: &str) -> Value {
    json!([{"role": "system", "content": "You are a storyteller."}, {"role": "user", "content": text}])
}

// ---------------------------------------------------------------------------
// Cutoff and extension
// ---------------------------------------------------------------------------

async fn cutoff_case(client_usage: bool) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(300);
    let messages = msgs("Write an endless story.");
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages}));
    let quota = input + 50;
    let gw = stream_config(&mock.base_url(), 20, 10, limits().tokens_per_day(quota))
        .start()
        .await;
    let mut kwargs = json!({"model": "gpt-4o-mini", "messages": messages});
    if client_usage {
        kwargs["stream_options"] = json!({"include_usage": true});
    }
    let r = sdk_stream(&gw, &kwargs).await;
    assert!(
        r["error"].is_null(),
        "the SDK parsed the cutoff without an exception: {r}"
    );
    let delivered = deltas(&r, "0");
    assert!(
        (49..=51).contains(&delivered),
        "about 50 tokens delivered, got {delivered}: {r}"
    );
    assert_eq!(r["finish"]["0"], "length", "{r}");
    if client_usage {
        assert_eq!(r["usage_chunks"], 1, "the client asked for usage: {r}");
        assert_eq!(r["usage"]["completion_tokens"], delivered, "{r}");
        assert_eq!(r["usage"]["prompt_tokens"], input, "{r}");
    } else {
        assert_eq!(
            r["usage_chunks"], 0,
            "the client did not ask for usage: {r}"
        );
    }
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input + delivered,
        "settled exactly what was delivered"
    );
    // The upstream was asked for usage and sent no cap (as the client);
    // the stream was aborted.
    let sent = &mock.state.requests()[0].body;
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert!(sent.get("max_completion_tokens").is_none(), "{sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_exhausted_mid_stream_cuts_off_cleanly_for_the_sdk_without_usage() {
    cutoff_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_exhausted_mid_stream_cuts_off_cleanly_for_the_sdk_with_usage() {
    cutoff_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_extension_step_grants_the_largest_admissible_remainder_before_cutoff() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(300);
    let messages = msgs("Another endless story.");
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages}));
    // 20 reserved, +10, +10, then only 5 of the next 10 fit: 45 delivered.
    let gw = stream_config(
        &mock.base_url(),
        20,
        10,
        limits().tokens_per_day(input + 45),
    )
    .start()
    .await;
    let resp = post_chat(
        &gw,
        KEY,
        &json!({"model": "gpt-4o-mini", "messages": messages, "stream": true}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await.unwrap();
    let payloads = sse_data(&body);
    assert_eq!(
        payloads.last().map(String::as_str),
        Some("[DONE]"),
        "ends with [DONE]"
    );
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).expect("every chunk is JSON"))
        .collect();
    assert_eq!(content_chunks(&chunks), 45);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(
        last["id"], chunks[0]["id"],
        "the cutoff chunk carries the completion's id"
    );
    assert!(
        chunks
            .iter()
            .all(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty())),
        "no usage chunk"
    );
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::TokensPerDay).await, input + 45);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_gone_before_first_byte_is_a_429_with_headers_not_a_200_stream() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(300);
    let messages = msgs("Once more.");
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages}));
    let gw = stream_config(
        &mock.base_url(),
        20,
        10,
        limits().rpm(100).tpm(100000).tokens_per_day(input + 30),
    )
    .start()
    .await;
    let body = json!({"model": "gpt-4o-mini", "messages": messages, "stream": true});
    let first = post_chat(&gw, KEY, &body).await;
    assert_eq!(first.status(), 200);
    let _ = first.bytes().await.unwrap();
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input + 30,
        "the quota is used up exactly"
    );
    let requests_before = mock.state.request_count();
    let second = post_chat(&gw, KEY, &body).await;
    assert_eq!(
        second.status(),
        429,
        "refused before any byte, not a 200 stream"
    );
    let h = second.headers().clone();
    assert_eq!(
        h.get("x-should-retry").map(|v| v.to_str().unwrap()),
        Some("false"),
        "{h:?}"
    );
    assert!(h.get("retry-after").is_some(), "{h:?}");
    assert!(
        h.get("ratelimit").is_some() && h.get("ratelimit-policy").is_some(),
        "quota headers: {h:?}"
    );
    assert!(!h
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .contains("event-stream"));
    let err: Value = second.json().await.unwrap();
    assert_eq!(err["error"]["code"], "insufficient_quota", "{err}");
    assert_eq!(
        mock.state.request_count(),
        requests_before,
        "never forwarded"
    );
}

// ---------------------------------------------------------------------------
// Upstream and client failures
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_dropping_the_connection_mid_stream_makes_the_sdk_raise_and_charges_delivered() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(100);
    mock.state.set_fault(Some(Fault::DropMidStream));
    let messages = msgs("Tell me something.");
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages}));
    let gw = stream_config(&mock.base_url(), 20, 10, limits().tokens_per_day(100000))
        .start()
        .await;
    let r = sdk_stream(&gw, &json!({"model": "gpt-4o-mini", "messages": messages})).await;
    assert_eq!(
        r["error"]["type"], "APIError",
        "a truncated stream is an error, not a success: {r}"
    );
    assert_eq!(deltas(&r, "0"), 3, "the mock drops after three tokens: {r}");
    assert!(r["finish"]["0"].is_null(), "{r}");
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input + 3,
        "charged prompt + delivered output"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnects_while_upstream_is_idle_free_their_slots_at_once() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(300);
    // The first chunk (role) comes at once, then the upstream is idle for 30 s:
    // only the closed client connection can end these streams.
    mock.state.set_token_delay(Duration::from_secs(30));
    let gw = stream_config(
        &mock.base_url(),
        20,
        10,
        limits().max_concurrent(2).tokens_per_day(1000000),
    )
    .start()
    .await;
    let started = Instant::now();
    let r = run_python("stream_abort.py", &gw.base_url(), &["10"])
        .await
        .json();
    assert_eq!(r["admitted"], 10, "every stream was admitted: {r}");
    assert_eq!(r["refused"], json!([]), "{r}");
    assert_eq!(
        r["final"]["ok"], true,
        "the following request is admitted at once: {r}"
    );
    // Every stream settled (slots freed) without waiting for the upstream.
    gw.all_settled().await;
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "disconnects were noticed while the upstream was idle"
    );
    let used = gw.t1_used(BudgetName::TokensPerDay).await;
    let input = chat_input_tokens(
        &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Tell me a long story."}]}),
    );
    assert_eq!(
        used,
        11 * input,
        "each aborted stream is charged its prompt and no output"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_eof_without_done_after_every_choice_finished_gets_done_appended() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    mock.state.set_fault(Some(Fault::NoDone));
    let gw = stream_config(&mock.base_url(), 100, 10, limits().tokens_per_day(100000))
        .start()
        .await;
    let messages = msgs("Short one.");
    let r = sdk_stream(&gw, &json!({"model": "gpt-4o-mini", "messages": messages})).await;
    assert!(r["error"].is_null(), "{r}");
    assert_eq!(deltas(&r, "0"), 12);
    assert_eq!(r["finish"]["0"], "stop");
    let resp = post_chat(
        &gw,
        KEY,
        &json!({"model": "gpt-4o-mini", "messages": messages, "stream": true}),
    )
    .await;
    let body = resp.bytes().await.unwrap();
    assert!(body.ends_with(b"data: [DONE]\n\n"), "[DONE] appended");
    assert_eq!(sse_data(&body).iter().filter(|p| *p == "[DONE]").count(), 1);
    gw.all_settled().await;
    // Usage arrived before the EOF: both settle from it (the mock's prompt count, 12 output).
    let prompt = mock_upstream::chat_prompt_tokens(
        mock_upstream::bpe_for("gpt-4o-mini"),
        &json!({"model": "gpt-4o-mini", "messages": messages}),
    );
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        2 * (prompt + 12)
    );
}

/// An upstream that answers every request with `body` as an SSE stream,
/// written `piece` bytes at a time, then closes the connection (no length,
/// no chunking: the close ends the body).
async fn fixture_upstream(body: Vec<u8>, piece: usize) -> String {
    gated_fixture_upstream(body, piece, None).await
}

/// A gateway in front of a fixture upstream: tenant t1 with a daily token
/// quota that every fixture fits in, default output cap 100.
async fn fixture_gateway(upstream: &str) -> Gateway {
    stream_config(upstream, 100, 1000, limits().tokens_per_day(100000))
        .start()
        .await
}

/// [`fixture_upstream`] that, with `gate = Some((n, notify))`, writes the
/// first `n` bytes of `body` and waits for `notify` before the rest.
async fn gated_fixture_upstream(
    body: Vec<u8>,
    piece: usize,
    gate: Option<(usize, Arc<tokio::sync::Notify>)>,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Arc::new(body);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                let head_end = loop {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                    if let Some(p) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                };
                let head = String::from_utf8_lossy(&req[..head_end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while req.len() < head_end + len {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                let _ = sock
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
                    .await;
                let (first, rest) = match &gate {
                    Some((n, _)) => body.split_at(*n),
                    None => (&body[..], &[][..]),
                };
                for (part, bytes) in [first, rest].into_iter().enumerate() {
                    if part == 1 {
                        if let Some((_, notify)) = &gate {
                            notify.notified().await;
                        }
                    }
                    for p in bytes.chunks(piece) {
                        if sock.write_all(p).await.is_err() {
                            return;
                        }
                        let _ = sock.flush().await;
                        tokio::task::yield_now().await;
                    }
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}/v1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_streams_through_the_real_relay_reach_the_client_byte_for_byte() {
    for f in FIXTURES {
        for piece in [7, 1024] {
            let upstream = fixture_upstream(fixture_bytes(&format!("{}.sse", f.name)), piece).await;
            let gw = fixture_gateway(&upstream).await;
            let resp = post_chat(&gw, KEY,
                &json!({"model": "gpt-4o-mini", "messages": msgs("Hi."), "stream": true, "n": f.choices}),
            )
            .await;
            assert_eq!(resp.status(), 200);
            let body = resp.bytes().await.unwrap();
            let expected = fixture_bytes(&format!("{}.client.sse", f.name));
            assert!(
                body[..] == expected[..],
                "{} in {piece}-byte writes:\n got: {}\nwant: {}",
                f.name,
                String::from_utf8_lossy(&body),
                String::from_utf8_lossy(&expected)
            );
            gw.all_settled().await;
        }
    }
}

/// Frames are relayed as they arrive. The upstream sends two
/// frames and then waits until the client has them; a relay that buffered
/// anything past a complete frame would never deliver them and time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_frame_reaches_the_client_before_the_upstream_sends_the_next() {
    let upstream_bytes = fixture_bytes("openai_chat_usage.sse");
    let expected = fixture_bytes("openai_chat_usage.client.sse");
    let two_frames = upstream_bytes
        .windows(2)
        .enumerate()
        .filter(|(_, w)| *w == b"\n\n")
        .nth(1)
        .map(|(i, _)| i + 2)
        .expect("the fixture has two frames");
    let gate = Arc::new(tokio::sync::Notify::new());
    let upstream =
        gated_fixture_upstream(upstream_bytes, 1024, Some((two_frames, gate.clone()))).await;
    let gw = fixture_gateway(&upstream).await;
    let mut resp = post_chat(
        &gw,
        KEY,
        &json!({"model": "gpt-4o-mini", "messages": msgs("Hi."), "stream": true}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while got.len() < two_frames {
            let chunk = resp.chunk().await.expect("read").expect("not the end yet");
            got.extend_from_slice(&chunk);
        }
    })
    .await
    .expect("the first two frames arrived while the upstream waited");
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expected[..two_frames]),
        "relayed unchanged"
    );
    gate.notify_one();
    while let Some(chunk) = resp.chunk().await.expect("read") {
        got.extend_from_slice(&chunk);
    }
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expected)
    );
    gw.all_settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_eof_before_every_choice_finished_makes_the_sdk_raise() {
    // A clean close (no transport error) after four content chunks, no finish_reason, no [DONE].
    let full = fixture_bytes("openai_chat_usage.sse");
    let text = String::from_utf8(full).unwrap();
    let truncated: String = text.split_inclusive("\n\n").take(5).collect();
    let upstream = fixture_upstream(truncated.into_bytes(), 64).await;
    let gw = fixture_gateway(&upstream).await;
    let messages = msgs("Hi.");
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages}));
    let r = sdk_stream(&gw, &json!({"model": "gpt-4o-mini", "messages": messages})).await;
    assert_eq!(
        r["error"]["type"], "APIError",
        "a truncated answer must not look complete: {r}"
    );
    assert_eq!(r["content"]["0"], "Hello! Here is", "{r}");
    gw.all_settled().await;
    let delivered: u64 = ["Hello", "!", " Here", " is"]
        .iter()
        .map(|w| Encoding::O200kBase.count(w))
        .sum();
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input + delivered
    );
}

// ---------------------------------------------------------------------------
// Metering
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_filter_chunks_and_keepalives_reach_the_sdk_without_a_crash() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(15);
    mock.state.set_fault(Some(Fault::ContentFilterChunks));
    let gw = stream_config(&mock.base_url(), 100, 10, limits().tokens_per_day(100000))
        .start()
        .await;
    let messages = msgs("Filter me.");
    let r = sdk_stream(&gw, &json!({"model": "gpt-4o-mini", "messages": messages, "stream_options": {"include_usage": true}})).await;
    assert!(r["error"].is_null(), "{r}");
    assert_eq!(deltas(&r, "0"), 15);
    assert_eq!(r["finish"]["0"], "stop");
    assert_eq!(r["usage"]["completion_tokens"], 15, "{r}");
    gw.all_settled().await;
    let prompt = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        prompt + 15,
        "the filter chunks and keep-alives cost nothing"
    );
}

/// Streams and then sends the same request without streaming; returns the
/// quota each used.
async fn stream_vs_plain(fault: Option<Fault>, extra: Value) -> (u64, u64) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(37);
    mock.state.set_fault(fault);
    let gw = stream_config(&mock.base_url(), 100, 10, limits().tokens_per_day(1000000))
        .start()
        .await;
    let mut body = json!({"model": "gpt-4o-mini", "messages": msgs("Same request twice.")});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let plain = post_chat(&gw, KEY, &body).await;
    assert_eq!(plain.status(), 200);
    let _ = plain.bytes().await.unwrap();
    gw.all_settled().await;
    let after_plain = gw.t1_used(BudgetName::TokensPerDay).await;
    body["stream"] = json!(true);
    let streamed = post_chat(&gw, KEY, &body).await;
    assert_eq!(streamed.status(), 200);
    let _ = streamed.bytes().await.unwrap();
    gw.all_settled().await;
    (
        after_plain,
        gw.t1_used(BudgetName::TokensPerDay).await - after_plain,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_and_non_streaming_of_the_same_request_settle_the_same_amount() {
    for (fault, extra) in [
        (None, json!({})),
        (None, json!({"max_tokens": 50})),
        (Some(Fault::MissingUsage), json!({})),
        (None, json!({"n": 3})),
        (Some(Fault::MissingUsage), json!({"n": 2})),
    ] {
        let (plain, streamed) = stream_vs_plain(fault, extra.clone()).await;
        assert_eq!(plain, streamed, "fault {fault:?}, extra {extra}");
        assert!(plain > 37);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n3_streams_count_output_across_choices_and_charge_the_prompt_once() {
    for missing_usage in [false, true] {
        let mock = start_mock().await;
        mock.state.set_output_tokens(25);
        if missing_usage {
            mock.state.set_fault(Some(Fault::MissingUsage));
        }
        // Reserved 3 × 20 = 60 < 75 produced: the stream extends across choices.
        let gw = stream_config(&mock.base_url(), 20, 10, limits().tokens_per_day(1000000))
            .start()
            .await;
        let messages = msgs("Three answers please.");
        let input =
            chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages, "n": 3}));
        let r = sdk_stream(
            &gw,
            &json!({"model": "gpt-4o-mini", "messages": messages, "n": 3, "stream_options": {"include_usage": true}}),
        )
        .await;
        assert!(r["error"].is_null(), "{r}");
        for i in ["0", "1", "2"] {
            assert_eq!(deltas(&r, i), 25, "choice {i}: {r}");
            assert_eq!(r["finish"][i], "stop", "choice {i}: {r}");
        }
        gw.all_settled().await;
        let prompt = if missing_usage {
            // The client asked for usage, the upstream sent none:
            // the gateway sends its own count.
            assert_eq!(r["usage_chunks"], 1, "{r}");
            assert_eq!(r["usage"]["completion_tokens"], 75, "{r}");
            assert_eq!(r["usage"]["prompt_tokens"], input, "{r}");
            input
        } else {
            assert_eq!(r["usage"]["completion_tokens"], 75);
            r["usage"]["prompt_tokens"].as_u64().unwrap()
        };
        assert_eq!(
            gw.t1_used(BudgetName::TokensPerDay).await,
            prompt + 75,
            "prompt once, output of all three (missing usage {missing_usage})"
        );
    }
}

// ---------------------------------------------------------------------------
// Headers and leases
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_responses_carry_the_rate_limit_headers() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let gw = stream_config(
        &mock.base_url(),
        100,
        10,
        limits().rpm(60).tpm(10000).tokens_per_day(100000),
    )
    .start()
    .await;
    let r = sdk_stream(
        &gw,
        &json!({"model": "gpt-4o-mini", "messages": msgs("Headers?")}),
    )
    .await;
    assert!(r["error"].is_null(), "{r}");
    let h = &r["headers"];
    for name in [
        "x-ratelimit-limit-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
        "x-request-id",
        "ratelimit",
        "ratelimit-policy",
    ] {
        assert!(
            h[name].is_string(),
            "{name} missing on a streamed response: {h}"
        );
    }
    assert_eq!(h["x-ratelimit-limit-tokens"], "10000");
    assert_eq!(h["x-ratelimit-remaining-requests"], "59");
}

/// A store that records the clock time of the latest lease renewal, so the
/// lease test can wait for one that saw the advanced clock instead of
/// sleeping.
struct RenewalClock {
    clock: ManualClock,
    /// Clock time read just before the latest renewal (the store reads it
    /// again, later, so its own time is at least this).
    renewed_at: AtomicU64,
}

#[async_trait]
impl Hooks for RenewalClock {
    async fn before(&self, _call: Call) -> Result<u64, StoreError> {
        Ok(self.clock.now_micros())
    }
    fn after(&self, call: Call, at: u64) {
        if call == Call::Renew {
            self.renewed_at.fetch_max(at, Ordering::SeqCst);
        }
    }
}

/// `server.max_request_secs` bounds a request upstream, body included: a
/// stream that would run 5 s ends after ~1 s, is settled for what was
/// delivered (its hold lives `max_request + settle_retry`, so the
/// settlement always finds it), and frees the tenant's only slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_max_request_ends_there_and_is_settled() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(100);
    mock.state.set_token_delay(Duration::from_millis(50));
    let gw = {
        let mut config = stream_config(
            &mock.base_url(),
            100,
            1000,
            limits().max_concurrent(1).tokens_per_day(100000),
        );
        config.server.max_request_secs = Some(1);
        config
    }
    .start()
    .await;
    let body = json!({"model": "gpt-4o-mini", "messages": msgs("Go on."), "stream": true, "max_tokens": 100});
    let input = chat_input_tokens(&body);
    let started = Instant::now();
    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 200);
    let text = String::from_utf8_lossy(&r.bytes().await.expect("stream body")).into_owned();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "ran {took:?} of a 5 s stream"
    );
    assert!(text.contains("data: "), "{text}");
    gw.all_settled().await;
    let used = gw.t1_used(BudgetName::TokensPerDay).await;
    assert!(
        used > input && used < input + 100,
        "charged {used}: the prompt and what was delivered, not the reservation"
    );
    mock.state.set_token_delay(Duration::ZERO);
    let next = post_chat(
        &gw,
        KEY,
        &json!({"model": "gpt-4o-mini", "messages": msgs("Hi."), "max_tokens": 5}),
    )
    .await;
    assert_eq!(next.status(), 200, "the slot is free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_stream_outliving_its_lease_keeps_its_concurrency_slot() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(3000);
    mock.state.set_token_delay(Duration::from_millis(20));
    let config = {
        let mut config = stream_config(&mock.base_url(), 20, 100, limits().max_concurrent(1));
        config.server.slot_lease_secs = Some(1);
        config
    };
    let clock = ManualClock::new(NOON);
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let memory = Arc::new(MemoryStore::new(dyn_clock.clone()));
    let store = Arc::new(Spy {
        inner: memory.clone(),
        hooks: RenewalClock {
            clock: clock.clone(),
            renewed_at: AtomicU64::new(0),
        },
    });
    let gw = config.start_with(clock.clone(), store.clone()).await;
    let addr = gw.addr;
    let url = format!("http://{addr}/v1/chat/completions");
    let client = reqwest::Client::new();
    let body = json!({"model": "gpt-4o-mini", "messages": msgs("Go on forever."), "stream": true});
    let mut long = client
        .post(&url)
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(long.status(), 200);
    assert!(
        long.chunk().await.unwrap().is_some(),
        "the stream is running"
    );
    // 2.4 lease lengths pass on the store's clock in 0.6 s steps; after each
    // step wait for a renewal (every lease/3 of real time) at the new time.
    for _ in 0..4 {
        clock.advance(600_000);
        let now = clock.now_micros();
        let deadline = Instant::now() + Duration::from_secs(5);
        while store.renewed_at.load(Ordering::SeqCst) < now {
            assert!(Instant::now() < deadline, "no lease renewal within 5 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            long.chunk().await.unwrap().is_some(),
            "the stream is still running"
        );
    }
    let second = client
        .post(&url)
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        second.status(),
        429,
        "the long stream still holds its slot after 2.4 s on a 1 s lease"
    );
    let err: Value = second.json().await.unwrap();
    assert_eq!(err["error"]["type"], "concurrency", "{err}");
    drop(long);
    let deadline = Instant::now() + Duration::from_secs(10);
    while memory.live_holds() > 0 {
        assert!(
            Instant::now() < deadline,
            "the aborted stream never settled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let third = client
        .post(&url)
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(third.status(), 200, "the slot is free once the client left");
    drop(third);
}
