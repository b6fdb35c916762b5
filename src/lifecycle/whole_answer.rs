//! The part of a non-streamed answer the gateway reads: its usage (and
//! Gemini's `usageMetadata`), a stored response's id and its output
//! items, each a span of the answer's text passed on untouched.

use std::borrow::Cow;

use serde_json::value::RawValue;

use crate::dialects::json_scan::{Fields, Scan};

/// The part of a non-streamed answer the gateway reads (OpenAI API
/// reference: `usage` of chat completions, completions and embeddings),
/// each a span of the answer's text.
#[derive(Debug, PartialEq)]
pub struct Whole<'a> {
    pub usage: Option<&'a str>,
    /// Gemini's usage (`usageMetadata`).
    pub usage_metadata: Option<&'a str>,
    /// The id of a stored response (Responses), for its owner record.
    pub id: Option<Cow<'a, str>>,
    /// The output items (Responses): read for the uses of priced hosted
    /// tools, only when the request may use one.
    pub output: Option<&'a str>,
}

impl<'a> Whole<'a> {
    /// Reads an answer: `None` unless it is one JSON object whose read
    /// members have the right types. The forward-only reader reads it
    /// (a serde tree, even one of borrowed spans, cost more than the
    /// rest of the answer's handling); where the reader declines (see
    /// [`json_scan`](crate::dialects::json_scan)), serde_json decides.
    pub fn read(body: &'a [u8]) -> Option<Self> {
        std::str::from_utf8(body)
            .ok()
            .and_then(Self::scan)
            .or_else(|| Self::by_serde(body))
    }

    /// [`Whole::read`] by serde's rules: what the reader declines, and
    /// the reference its tests compare it with.
    fn by_serde(body: &'a [u8]) -> Option<Self> {
        if !body.trim_ascii_start().starts_with(b"{") {
            return None;
        }
        let w = serde_json::from_slice::<WholeSerde>(body).ok()?;
        Some(Self {
            usage: w.usage.map(RawValue::get),
            usage_metadata: w.usage_metadata.map(RawValue::get),
            id: w.id,
            output: w.output.map(RawValue::get),
        })
    }

    fn scan(src: &'a str) -> Option<Self> {
        let mut s = Scan::new(src);
        let mut seen = Fields::default();
        let mut w = Self {
            usage: None,
            usage_metadata: None,
            id: None,
            output: None,
        };
        s.object(|s, key| {
            match &*key {
                "usage" => w.usage = seen.once(0, s, Scan::raw)?,
                "usageMetadata" => w.usage_metadata = seen.once(1, s, Scan::raw)?,
                "id" => w.id = seen.once(2, s, Scan::string)?,
                "output" => w.output = seen.once(3, s, Scan::raw)?,
                _ => s.skip()?,
            }
            Some(())
        })?;
        s.end()?;
        Some(w)
    }
}

/// [`Whole`] by serde's rules, for answers the reader declines.
#[derive(serde::Deserialize)]
struct WholeSerde<'a> {
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "usageMetadata")]
    usage_metadata: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialects::json_scan::generate::{object, or_other, string, value};
    use proptest::prelude::*;

    fn answer() -> BoxedStrategy<String> {
        let usage = r#"\{"prompt_tokens":[0-9]{1,4},"completion_tokens":[0-9]{1,4},"total_tokens":[0-9]{1,5}\}"#;
        let answer = object(vec![
            ("id", or_other(string().boxed())),
            ("object", string().boxed()),
            ("choices", value().boxed()),
            ("usage", or_other(usage.boxed())),
            ("usageMetadata", or_other(value().boxed())),
            ("output", or_other(value().boxed())),
        ]);
        prop_oneof![
            10 => answer,
            1 => value(),
            1 => (object(vec![("usage", usage.boxed())]), "[ }a1]{0,2}").prop_map(|(a, t)| a + &t),
        ]
        .boxed()
    }

    #[test]
    fn the_reader_reads_a_chat_answer() {
        let text = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"there\""},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;
        let w = Whole::scan(text).expect("read by the reader");
        assert_eq!(
            w.usage,
            Some(r#"{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}"#)
        );
        assert_eq!(w.id.as_deref(), Some("chatcmpl-1"));
        assert_eq!((w.usage_metadata, w.output), (None, None));
    }

    #[test]
    fn what_is_not_one_object_is_refused() {
        for text in [
            "",
            "[]",
            "null",
            r#"{"usage":{}} {}"#,
            r#"{"usage":{},"usage":{}}"#,
            r#"{"id":7}"#,
            r#"{"usage":{"a":1}"#,
        ] {
            assert_eq!(Whole::read(text.as_bytes()), None, "{text}");
        }
        assert_eq!(Whole::read(b"{\"id\":\"\xff\"}"), None);
    }

    #[test]
    fn what_the_reader_declines_serde_reads() {
        let text = r#"{"usage":{"prompt_tokens":1e2},"id":"r"}"#;
        assert_eq!(Whole::scan(text), None);
        let w = Whole::read(text.as_bytes()).expect("read by serde");
        assert_eq!(w.usage, Some(r#"{"prompt_tokens":1e2}"#));
        assert_eq!(w.id.as_deref(), Some("r"));
    }

    /// The generated answers are mostly read by the reader itself: a
    /// test of agreement that compared refusals only would pass whatever
    /// the reader read.
    #[test]
    fn the_generated_answers_are_mostly_read() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut read, mut usage) = (0, 0);
        for _ in 0..1000 {
            let text = answer().new_tree(&mut runner).expect("an answer").current();
            if let Some(w) = Whole::scan(&text) {
                read += 1;
                usage += usize::from(w.usage.is_some());
            }
        }
        assert!(read > 400 && usage > 200, "read {read}, with usage {usage}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// On every generated answer the gateway reads what serde_json
        /// alone reads (both refuse, or both read the same spans).
        #[test]
        fn the_answer_reads_as_serde_reads_it(text in answer()) {
            prop_assert_eq!(Whole::read(text.as_bytes()), Whole::by_serde(text.as_bytes()), "{}", text);
        }
    }
}
