//! The bound-first relay against the exact one (DESIGN section 19): streams of
//! random Unicode text (every script, emoji, text that falls back to byte
//! tokens, JSON escapes), cut into random network chunks, in every
//! streamed dialect, through [`super::relay_body`] with a meter whose budget runs
//! out at a random point. Both relays must deliver the same bytes, ask for
//! the same extensions, end the same way and settle the same usage.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::json;

use super::{relay_body, Ending, ExtendPlan, Extension, Meter, StreamProcessor};
use crate::config::estimate::Encoding;
use crate::dialects::{Dialect, UsageBreakdown};

/// What a meter saw: the extensions asked for and the settlement.
#[derive(Debug, Default, Clone, PartialEq)]
struct Seen {
    asked: Vec<u64>,
    settled: Option<(UsageBreakdown, Ending)>,
}

/// A budget of `left` tokens beyond the reservation; an extension store
/// that fails after `fails_after` calls.
struct ScriptedMeter {
    left: u64,
    fails_after: Option<usize>,
    seen: Arc<Mutex<Seen>>,
}

impl Meter for ScriptedMeter {
    fn id(&self) -> &str {
        "differential"
    }

    async fn extend(&mut self, tokens: u64) -> Extension {
        let mut seen = self.seen.lock().unwrap();
        seen.asked.push(tokens);
        if self.fails_after.is_some_and(|n| seen.asked.len() > n) {
            return Extension::Failed("scripted".into());
        }
        if self.left == 0 {
            return Extension::Exhausted("scripted".into());
        }
        let granted = tokens.min(self.left);
        self.left -= granted;
        Extension::Granted(granted)
    }

    fn shutdown(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        std::future::pending()
    }

    fn settle(self, used: UsageBreakdown, ending: Ending) -> u64 {
        self.seen.lock().unwrap().settled = Some((used, ending));
        used.total()
    }
}

/// One generated stream and the budget it meets.
#[derive(Debug, Clone)]
struct Case {
    dialect: Dialect,
    encoding: Encoding,
    ratio: u64,
    choices: u64,
    /// (choice, text, as a tool call's arguments)
    deltas: Vec<(u64, String, bool)>,
    usage: Option<u64>,
    wants_usage: bool,
    cap: Option<u64>,
    chunk_sizes: Vec<usize>,
    reserved: u64,
    step: Option<u64>,
    left: u64,
    fails_after: Option<usize>,
}

fn data(event: Option<&str>, v: serde_json::Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {v}\n\n"),
        None => format!("data: {v}\n\n"),
    }
}

/// The upstream's bytes for a case.
fn upstream_bytes(c: &Case) -> Vec<u8> {
    let mut out = String::new();
    match c.dialect {
        Dialect::ChatCompletions => {
            let chunk = |choices: serde_json::Value| {
                json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7,
                       "model": "m", "choices": choices})
            };
            for (choice, text, tool) in &c.deltas {
                let delta = if *tool {
                    json!({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": text}}]})
                } else {
                    json!({"content": text})
                };
                out += &data(
                    None,
                    chunk(json!([{"index": choice, "delta": delta, "finish_reason": null}])),
                );
            }
            for i in 0..c.choices {
                out += &data(
                    None,
                    chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}])),
                );
            }
            if let Some(n) = c.usage {
                let mut u = chunk(json!([]));
                u["usage"] =
                    json!({"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n});
                out += &data(None, u);
            }
            out += "data: [DONE]\n\n";
        }
        Dialect::Responses => {
            let response = json!({"id": "resp_1", "object": "response", "created_at": 7,
                                  "model": "m", "status": "in_progress", "output": [], "tools": []});
            out += &data(
                Some("response.created"),
                json!({"type": "response.created", "sequence_number": 0, "response": response}),
            );
            out += &data(
                Some("response.output_item.added"),
                json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                       "item": {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
            );
            out += &data(
                Some("response.content_part.added"),
                json!({"type": "response.content_part.added", "sequence_number": 2, "output_index": 0,
                       "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            let mut seq = 3;
            for (_, text, tool) in &c.deltas {
                let kind = if *tool {
                    "response.function_call_arguments.delta"
                } else {
                    "response.output_text.delta"
                };
                out += &data(
                    Some(kind),
                    json!({"type": kind, "sequence_number": seq, "output_index": 0,
                           "content_index": 0, "delta": text}),
                );
                seq += 1;
            }
            let mut done =
                json!({"id": "resp_1", "object": "response", "status": "completed", "output": []});
            if let Some(n) = c.usage {
                done["usage"] =
                    json!({"input_tokens": 5, "output_tokens": n, "total_tokens": 5 + n});
            }
            out += &data(
                Some("response.completed"),
                json!({"type": "response.completed", "sequence_number": seq, "response": done}),
            );
        }
        Dialect::Messages => {
            out += &data(
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 1}}}),
            );
            out += &data(
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            );
            for (_, text, tool) in &c.deltas {
                let delta = if *tool {
                    json!({"type": "input_json_delta", "partial_json": text})
                } else {
                    json!({"type": "text_delta", "text": text})
                };
                out += &data(
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": delta}),
                );
            }
            out += &data(
                Some("content_block_stop"),
                json!({"type": "content_block_stop", "index": 0}),
            );
            let mut md = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}});
            if let Some(n) = c.usage {
                md["usage"] = json!({"output_tokens": n});
            }
            out += &data(Some("message_delta"), md);
            out += &data(Some("message_stop"), json!({"type": "message_stop"}));
        }
        _ => unreachable!("only streamed dialects are generated"),
    }
    out.into_bytes()
}

/// Runs the relay over a case: the client's bytes, the ending, what the meter saw.
async fn relay(c: &Case, exact: bool) -> (Vec<u8>, Ending, u64, Seen) {
    let bytes = upstream_bytes(c);
    let mut chunks = Vec::new();
    let mut rest = &bytes[..];
    for &n in c.chunk_sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (a, b) = rest.split_at(n.clamp(1, rest.len()));
        chunks.push(Ok::<Bytes, std::io::Error>(Bytes::copy_from_slice(a)));
        rest = b;
    }
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let upstream = axum::http::Response::new(body);
    let mut proc = StreamProcessor::new(c.dialect, c.encoding, c.wants_usage, c.choices)
        .with_limits(5, c.cap)
        .with_token_ratio(c.ratio);
    if exact {
        proc = proc.with_exact_counting();
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let meter = ScriptedMeter {
        left: c.left,
        fails_after: c.fails_after,
        seen: seen.clone(),
    };
    let plan = ExtendPlan {
        reserved_output: c.reserved,
        step: c.step,
        max_output: 100_000,
        input_tokens: 5,
        deadline: None,
    };
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let body = relay_body(upstream, proc, meter, plan, move |summary| {
        let _ = done_tx.send(summary);
    });
    let got = collect(body).await;
    let summary = done_rx.await.expect("the relay settled");
    let seen = seen.lock().unwrap().clone();
    (got, summary.ending, summary.settled_tokens, seen)
}

/// Everything a body delivers, read as hyper reads it.
async fn collect(
    body: impl http_body::Body<Data = Bytes, Error = std::convert::Infallible>,
) -> Vec<u8> {
    let mut body = std::pin::pin!(body);
    let mut got = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let Ok(frame) = frame;
        if let Ok(data) = frame.into_data() {
            got.extend_from_slice(&data);
        }
    }
    got
}

/// Text that stresses the tokenizers: every script, emoji sequences,
/// combining marks, private-use and rare characters (byte-fallback
/// tokens), whitespace runs, JSON escapes.
fn text() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        " the",
        " of",
        "\n\n",
        "  ",
        "\t",
        "日本語",
        "中文",
        "한국어",
        "ไทย",
        "עברית",
        "العربية",
        "हिन्दी",
        "ελληνικά",
        "кириллица",
        "🙂",
        "👩‍👩‍👧",
        "🏳️‍🌈",
        "e\u{301}",
        "\u{e000}",
        "\u{10fffd}",
        "\u{1f9ff}",
        "\"",
        "\\",
        "\u{1}",
        "</s>",
        "<|endoftext|>",
        "123456",
        "ﷺ",
        "𝕏",
    ]);
    prop_oneof![
        2 => "\\PC{1,5}",
        2 => prop::collection::vec(pieces, 1..4).prop_map(|v| v.concat()),
        1 => "[a-z ]{1,8}",
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec![
            Dialect::ChatCompletions,
            Dialect::Responses,
            Dialect::Messages,
        ]),
        prop::sample::select(vec![Encoding::O200kBase, Encoding::Cl100kBase]),
        prop::sample::select(vec![1000u64, 1500]),
        1u64..=2,
        prop::collection::vec((0u64..2, text(), prop::bool::weighted(0.15)), 0..48),
        prop::option::weighted(0.6, 0u64..200),
        any::<bool>(),
        prop::option::weighted(0.4, 1u64..80),
        prop::collection::vec(1usize..200, 1..6),
        (0u64..60, prop::option::weighted(0.8, 1u64..24), 0u64..120),
        prop::option::weighted(0.1, 0usize..4),
    )
        .prop_map(
            |(
                dialect,
                encoding,
                ratio,
                choices,
                deltas,
                usage,
                wants_usage,
                cap,
                chunk_sizes,
                (reserved, step, left),
                fails_after,
            )| {
                let choices = if dialect == Dialect::ChatCompletions {
                    choices
                } else {
                    1
                };
                let deltas = deltas
                    .into_iter()
                    .map(|(ch, t, tool)| (ch % choices, t, tool))
                    .collect();
                Case {
                    dialect,
                    encoding,
                    ratio: if dialect == Dialect::Messages {
                        ratio
                    } else {
                        1000
                    },
                    choices,
                    deltas,
                    usage,
                    wants_usage,
                    cap: cap.filter(|_| dialect != Dialect::Messages),
                    chunk_sizes,
                    reserved,
                    step,
                    left,
                    fails_after,
                }
            },
        )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn bound_first_relay_matches_the_exact_one(c in case()) {
        let rt = runtime();
        let (exact, bound) = rt.block_on(async { (relay(&c, true).await, relay(&c, false).await) });
        prop_assert_eq!(String::from_utf8_lossy(&bound.0), String::from_utf8_lossy(&exact.0), "client bytes");
        prop_assert_eq!(bound.1, exact.1, "ending");
        prop_assert_eq!(&bound.3, &exact.3, "extensions and settlement");
        prop_assert_eq!(bound.2, exact.2, "settled tokens");
    }
}

/// The generator reaches what the property is about: cutoffs at the
/// reservation, cutoffs at the cap, and settlement without usage, in every
/// dialect.
#[test]
fn the_cases_reach_cutoffs_and_counted_settlements() {
    use proptest::strategy::ValueTree;
    let rt = runtime();
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut endings = std::collections::BTreeSet::new();
    for _ in 0..300 {
        let c = case().new_tree(&mut runner).unwrap().current();
        let (_, ending, _, _) = rt.block_on(relay(&c, false));
        endings.insert((format!("{:?}", c.dialect), ending.name(), c.usage.is_some()));
    }
    for d in ["ChatCompletions", "Responses", "Messages"] {
        for e in ["cut_off", "completed"] {
            assert!(
                endings.iter().any(|(x, y, _)| x == d && *y == e),
                "{d} {e}: {endings:?}"
            );
        }
        assert!(
            endings.iter().any(|(x, _, u)| x == d && !u),
            "{d} without usage"
        );
    }
    assert!(
        endings.iter().any(|(_, e, _)| *e == "over_cap"),
        "{endings:?}"
    );
}
