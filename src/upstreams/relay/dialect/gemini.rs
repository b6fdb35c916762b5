//! Gemini streams (`:streamGenerateContent?alt=sse`: the gateway asks
//! every Gemini upstream for SSE, and re-frames it as a JSON array on the
//! way out for a client that asked for one): every event is one
//! `GenerateContentResponse` chunk, relayed as it came. A chunk's
//! candidates carry the output in `content.parts` (text, thought text,
//! function calls), a candidate's `finishReason` ends it; `usageMetadata`
//! is cumulative (the last one wins), the last chunk's whole. Gemini
//! streams have no terminal event: the stream is complete when every
//! candidate finished. Text is counted in tiktoken tokens and scaled to
//! the model's (`token_ratio`) where decisions read the count. A cutoff
//! ends every unfinished candidate as Gemini ends a stream at its output
//! limit: one last chunk with `finishReason: "MAX_TOKENS"` and the usage.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{StreamDialect, Verdict};
use crate::dialects::gemini;
use crate::estimate::messages::scale;
use crate::upstreams::relay::delta_counts;
use crate::upstreams::relay::processor::Tally;

/// The state of one Gemini stream: what the cutoff chunk repeats.
#[derive(Debug)]
pub struct GeminiStream {
    ratio: u64,
    model_version: Option<String>,
    response_id: Option<String>,
}

impl Default for GeminiStream {
    fn default() -> Self {
        Self {
            ratio: 1000,
            model_version: None,
            response_id: None,
        }
    }
}

/// The output strings of one candidate: its text parts and its function
/// calls as their JSON.
fn outputs(candidate: &Value) -> Vec<std::borrow::Cow<'_, str>> {
    candidate
        .get("content")
        .and_then(|c| c.get("parts"))
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| match p.get("text").and_then(Value::as_str) {
                    Some(t) => Some(std::borrow::Cow::Borrowed(t)),
                    None => p
                        .get("functionCall")
                        .map(|c| std::borrow::Cow::Owned(c.to_string())),
                })
                .collect()
        })
        .unwrap_or_default()
}

impl StreamDialect for GeminiStream {
    fn on_data(&mut self, t: &mut Tally, data: &str) -> Verdict {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            tracing::debug!("relaying a Gemini chunk that is not JSON");
            return Verdict::Forward;
        };
        if v.get("error").is_some_and(|e| !e.is_null()) {
            t.errored = true;
            return Verdict::Forward;
        }
        if self.model_version.is_none() {
            self.model_version = v
                .get("modelVersion")
                .and_then(Value::as_str)
                .map(String::from);
        }
        if self.response_id.is_none() {
            self.response_id = v
                .get("responseId")
                .and_then(Value::as_str)
                .map(String::from);
        }
        if let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) {
            let read = gemini::usage_from_value(u);
            // An early chunk's prompt-only usage keeps no output count.
            t.usage = Some(match (read.output, t.usage) {
                (None, Some(before)) if before.output.is_some() => before,
                _ => read,
            });
        }
        let Some(candidates) = v.get("candidates").and_then(Value::as_array) else {
            return Verdict::Forward;
        };
        if t.exact || t.cap.is_some() {
            // Counted as it passes: the cap is checked on exact counts.
            t.count_pending();
            let counted: Vec<(u64, u64, bool)> = candidates
                .iter()
                .map(|c| {
                    let tokens = outputs(c)
                        .iter()
                        .map(|s| delta_counts::count(t.encoding, s))
                        .sum();
                    let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                    (
                        idx,
                        tokens,
                        c.get("finishReason").is_some_and(|f| !f.is_null()),
                    )
                })
                .collect();
            if t.passes_cap(&counted) {
                t.over_cap = true;
                return Verdict::Drop;
            }
            for (idx, tokens, finishes) in counted {
                t.commit(idx, tokens);
                if finishes && t.requested(idx) {
                    t.finished.insert(idx);
                }
            }
            return Verdict::Forward;
        }
        for c in candidates {
            let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            let strings = outputs(c);
            t.pending
                .push_delta(idx, strings.iter().map(|s| s.as_ref()));
            if c.get("finishReason").is_some_and(|f| !f.is_null()) && t.requested(idx) {
                t.finished.insert(idx);
            }
        }
        Verdict::Forward
    }

    fn counted(&self, t: &Tally) -> u64 {
        scale(t.output_tokens, self.ratio)
    }

    fn counted_at_most(&self, t: &Tally, pending_at_most: u64) -> u64 {
        scale(t.output_tokens.saturating_add(pending_at_most), self.ratio)
    }

    fn set_token_ratio(&mut self, ratio: u64) {
        self.ratio = ratio;
    }

    fn error_frame(&self, message: &str, _code: &str) -> Bytes {
        gemini::error::error_event(axum::http::StatusCode::BAD_GATEWAY, message)
    }

    fn closing_frames(&mut self, _t: &mut Tally) -> Bytes {
        // Gemini's streams end with their last chunk: nothing to add.
        Bytes::new()
    }

    fn cutoff_frames(&mut self, t: &mut Tally, prompt_tokens: u64) -> Vec<Bytes> {
        let open: Vec<u64> = (0..t.choices).filter(|i| !t.finished.contains(i)).collect();
        if open.is_empty() {
            return Vec::new();
        }
        let candidates: Vec<Value> = open
            .iter()
            .map(|&i| {
                json!({
                    "content": {"role": "model", "parts": [{"text": ""}]},
                    "finishReason": "MAX_TOKENS",
                    "index": i,
                })
            })
            .collect();
        t.finished.extend(open);
        let reported = t.usage.unwrap_or_default();
        let prompt = reported.input().unwrap_or(prompt_tokens);
        let output = self.counted(t);
        let mut usage = json!({
            "promptTokenCount": prompt,
            "candidatesTokenCount": output,
            "totalTokenCount": prompt + output,
        });
        if reported.cached_input > 0 {
            usage["cachedContentTokenCount"] = json!(reported.cached_input);
        }
        let mut chunk = json!({"candidates": candidates, "usageMetadata": usage});
        if let Some(m) = &self.model_version {
            chunk["modelVersion"] = json!(m);
        }
        if let Some(id) = &self.response_id {
            chunk["responseId"] = json!(id);
        }
        vec![Bytes::from(format!("data: {chunk}\r\n\r\n"))]
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::{json, Value};

    use crate::config::estimate::Encoding;
    use crate::dialects::Dialect;
    use crate::upstreams::relay::{FrameAction, StreamProcessor};

    fn event(v: Value) -> Bytes {
        Bytes::from(format!("data: {v}\r\n\r\n"))
    }

    fn chunk(text: &str, finish: Option<&str>, usage: Value) -> Bytes {
        let mut c = json!({"content": {"role": "model", "parts": [{"text": text}]}, "index": 0});
        if let Some(f) = finish {
            c["finishReason"] = json!(f);
        }
        event(
            json!({"candidates": [c], "usageMetadata": usage, "modelVersion": "gemini-x", "responseId": "r1"}),
        )
    }

    #[test]
    fn a_stream_ends_with_its_last_candidate_and_settles_its_usage() {
        for exact in [false, true] {
            let mut p = StreamProcessor::new(Dialect::Gemini, Encoding::O200kBase, false, 1);
            if exact {
                p = p.with_exact_counting();
            }
            let frames = [
                chunk(
                    " the",
                    None,
                    json!({"promptTokenCount": 9, "totalTokenCount": 9}),
                ),
                chunk(
                    " of",
                    None,
                    json!({"promptTokenCount": 9, "totalTokenCount": 9}),
                ),
                chunk(
                    " and",
                    Some("STOP"),
                    json!({"promptTokenCount": 9, "candidatesTokenCount": 3, "thoughtsTokenCount": 4, "totalTokenCount": 16}),
                ),
            ];
            for f in frames {
                assert!(matches!(p.on_frame(f), FrameAction::Forward(_)));
            }
            assert!(
                p.all_finished(),
                "no terminal event: the candidate finished"
            );
            assert_eq!(p.output_tokens(), 3);
            let used = p.used(20);
            assert_eq!(
                (used.input(), used.output, used.reasoning),
                (Some(9), Some(7), 4)
            );
        }
    }

    #[test]
    fn a_cutoff_ends_like_geminis_own_limit_with_the_usage() {
        let mut p = StreamProcessor::new(Dialect::Gemini, Encoding::O200kBase, false, 1);
        p.on_frame(chunk(
            " the of",
            None,
            json!({"promptTokenCount": 9, "totalTokenCount": 9}),
        ));
        let frames = p.cutoff_frames(12);
        assert_eq!(frames.len(), 1);
        let text = String::from_utf8_lossy(&frames[0]).into_owned();
        assert!(
            text.starts_with("data: ") && text.ends_with("\r\n\r\n"),
            "{text}"
        );
        let v: Value = serde_json::from_str(text["data: ".len()..].trim()).unwrap_or(Value::Null);
        assert_eq!(v["candidates"][0]["finishReason"], "MAX_TOKENS");
        assert_eq!(v["usageMetadata"]["promptTokenCount"], 9);
        assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 2);
        assert_eq!(v["usageMetadata"]["totalTokenCount"], 11);
        assert_eq!(v["responseId"], "r1");
        assert!(p.all_finished());
    }

    #[test]
    fn an_error_chunk_is_relayed_and_marks_the_stream() {
        let mut p = StreamProcessor::new(Dialect::Gemini, Encoding::O200kBase, false, 1);
        let f = event(
            json!({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}),
        );
        assert!(matches!(p.on_frame(f), FrameAction::Forward(_)));
        assert!(p.is_errored());
        let e = String::from_utf8_lossy(&p.error_frame("cut", "x")).into_owned();
        assert!(e.contains("\"status\":\"UNAVAILABLE\""), "{e}");
    }
}
