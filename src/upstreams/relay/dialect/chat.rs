//! OpenAI chat completions streams (and legacy completions, whose chunks
//! have the same shape with `text` choices): chunks of choices, each
//! choice's `delta` the output, `finish_reason` ending the choice, a usage
//! chunk (no choices) when `stream_options.include_usage` asked for one,
//! `data: [DONE]` ending the stream. Chat chunks are read without a tree
//! ([`Chunk`]) for the bound; legacy completions are read as trees. A
//! cutoff ends every unfinished choice with `finish_reason: "length"`,
//! the usage chunk when the client asked for usage, then `[DONE]`.

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::{json, Value};

use super::{StreamDialect, Verdict};
use crate::dialects::chat_stream::Chunk;
use crate::dialects::{openai, Dialect, Part};
use crate::upstreams::relay::processor::Tally;
use crate::upstreams::relay::{delta_counts, error_frame};

const DONE: &[u8] = b"data: [DONE]\n\n";

/// The state of one stream of chunks: what the cutoff chunk repeats.
#[derive(Debug)]
pub struct ChatStream {
    /// Chat completions or legacy completions.
    dialect: Dialect,
    id: Option<String>,
    model: Option<String>,
    created: Option<i64>,
}

impl ChatStream {
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            id: None,
            model: None,
            created: None,
        }
    }

    /// Azure's content-filter chunks carry `"id":""`, `"model":""`,
    /// `"created":0`: the first real values are kept for the cutoff chunk.
    fn remember(
        &mut self,
        id: Option<Cow<'_, str>>,
        model: Option<Cow<'_, str>>,
        created: Option<i64>,
    ) {
        let text = |s: Option<Cow<'_, str>>| s.filter(|s| !s.is_empty()).map(String::from);
        if self.id.is_none() {
            self.id = text(id);
        }
        if self.model.is_none() {
            self.model = text(model);
        }
        if self.created.is_none() {
            self.created = created.filter(|c| *c > 0);
        }
    }

    /// A chunk read without its tree ([`Chunk`]): what the tree path
    /// ([`on_tree`](Self::on_tree)) does with it, its deltas kept pending
    /// unless the cap needs them counted.
    fn on_chunk(&mut self, t: &mut Tally, chunk: Chunk<'_>) -> Verdict {
        if chunk.error.is_some() {
            t.errored = true;
            return Verdict::Forward;
        }
        self.remember(chunk.id, chunk.model, chunk.created);
        let mut usage_only = false;
        let usage = chunk
            .usage
            .and_then(|u| serde_json::from_str::<Value>(u.get()).ok())
            .filter(Value::is_object);
        if let Some(u) = usage {
            t.usage = Some(openai::usage_from_value(&u));
            usage_only = chunk.choices.as_ref().is_none_or(|c| c.is_empty());
        }
        if let Some(choices) = &chunk.choices {
            let deltas = choices.iter().map(|c| {
                let c = &c.0;
                let strings = c.delta.as_ref().map(|d| &d.0);
                (c.index.unwrap_or(0), strings, c.finish_reason.is_some())
            });
            let safe = deltas.clone().all(|(idx, d, finishes)| {
                let bytes = d.map_or(0, |d| d.output_strings().map(|s| s.len() as u64).sum());
                finishes
                    || !t.requested(idx)
                    || t.within_cap(
                        t.per_choice[idx as usize],
                        t.pending.choice_bytes(idx),
                        bytes,
                    )
            });
            if safe {
                for (idx, d, finishes) in deltas {
                    if let Some(d) = d {
                        t.pending.push_delta(idx, d.output_strings());
                    }
                    if finishes && t.requested(idx) {
                        t.finished.insert(idx);
                    }
                }
            } else {
                // Near the cap: counted exactly, as the tree path counts.
                t.count_pending();
                let counted: Vec<(u64, u64, bool)> = deltas
                    .map(|(idx, d, finishes)| {
                        let tokens = d.map_or(0, |d| {
                            d.output_strings()
                                .map(|s| delta_counts::count(t.encoding, s))
                                .sum()
                        });
                        (idx, tokens, finishes)
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
            }
        }
        if usage_only && !t.client_wants_usage {
            return Verdict::Drop;
        }
        Verdict::Forward
    }

    /// A chunk read as a tree, every delta counted as it passes.
    fn on_tree(&mut self, t: &mut Tally, v: &Value) -> Verdict {
        if v.get("error").is_some_and(|e| !e.is_null()) {
            t.errored = true;
            return Verdict::Forward;
        }
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(Cow::Borrowed);
        let created = v.get("created").and_then(Value::as_i64);
        self.remember(text("id"), text("model"), created);
        let mut usage_only = false;
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            t.usage = Some(openai::usage_from_value(u));
            usage_only = v
                .get("choices")
                .and_then(Value::as_array)
                .is_none_or(|c| c.is_empty());
        }
        if let Some(choices) = v.get("choices").and_then(Value::as_array) {
            if t.cap.is_some() {
                // The cap is checked on exact counts.
                t.count_pending();
            }
            // Counted first, committed only if no choice passes the cap.
            let mut counted = Vec::with_capacity(choices.len());
            for c in choices {
                let tokens = self.dialect.count_output(c, Part::Delta, t.encoding);
                let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                let finishes = c.get("finish_reason").is_some_and(|f| !f.is_null());
                counted.push((idx, tokens, finishes));
            }
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
        }
        if usage_only && !t.client_wants_usage {
            return Verdict::Drop;
        }
        Verdict::Forward
    }

    fn chunk_frame(v: &Value) -> Bytes {
        Bytes::from(format!("data: {v}\n\n"))
    }

    /// The usage chunk with the gateway's own count: the prompt estimate
    /// and the output counted from the deltas.
    fn usage_chunk(&self, t: &Tally, prompt_tokens: u64) -> Bytes {
        let id = self.id.as_deref().unwrap_or("chatcmpl-budgetgate");
        Self::chunk_frame(&json!({
            "id": id,
            "object": self.dialect.chunk_object(),
            "created": self.created.unwrap_or(0),
            "model": self.model.as_deref().unwrap_or_default(),
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": t.output_tokens,
                "total_tokens": prompt_tokens + t.output_tokens
            }
        }))
    }

    /// The usage chunk a client that asked for usage gets before `[DONE]`
    /// when the upstream sent none (some self-hosted servers ignore
    /// `stream_options.include_usage`): the gateway's count.
    fn gateway_usage_frame(&self, t: &mut Tally) -> Option<Bytes> {
        if !(t.client_wants_usage && t.usage.is_none()) {
            return None;
        }
        t.count_pending();
        Some(self.usage_chunk(t, t.prompt_tokens))
    }
}

impl StreamDialect for ChatStream {
    fn on_data(&mut self, t: &mut Tally, data: &str) -> Verdict {
        if data == "[DONE]" {
            t.done = true;
            return match self.gateway_usage_frame(t) {
                Some(usage) => Verdict::ForwardAfter(usage),
                None => Verdict::Forward,
            };
        }
        if !t.exact && self.dialect == Dialect::ChatCompletions {
            if let Some(chunk) = Chunk::parse(data) {
                return self.on_chunk(t, chunk);
            }
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            tracing::debug!("dropping an SSE frame whose data is not JSON");
            return Verdict::Drop;
        };
        self.on_tree(t, &v)
    }

    fn error_frame(&self, message: &str, code: &str) -> Bytes {
        error_frame(message, code)
    }

    fn closing_frames(&mut self, t: &mut Tally) -> Bytes {
        let done = Bytes::from_static(DONE);
        match self.gateway_usage_frame(t) {
            Some(usage) => [usage, done].concat().into(),
            None => done,
        }
    }

    fn cutoff_frames(&mut self, t: &mut Tally, prompt_tokens: u64) -> Vec<Bytes> {
        let id = self.id.as_deref().unwrap_or("chatcmpl-budgetgate");
        let model = self.model.as_deref().unwrap_or_default();
        let created = self.created.unwrap_or(0);
        let object = self.dialect.chunk_object();
        let mut out = Vec::new();
        for i in 0..t.choices {
            if t.finished.contains(&i) {
                continue;
            }
            let choice = self.dialect.cutoff_choice(i);
            out.push(Self::chunk_frame(&json!({
                "id": id, "object": object, "created": created, "model": model,
                "choices": [choice]
            })));
        }
        if t.client_wants_usage {
            out.push(self.usage_chunk(t, prompt_tokens));
        }
        out.push(Bytes::from_static(DONE));
        out
    }
}
