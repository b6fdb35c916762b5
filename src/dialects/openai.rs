//! What the OpenAI dialects share: the `usage` object (OpenAI API
//! reference: `prompt_tokens` includes `prompt_tokens_details.cached_tokens`;
//! `completion_tokens` includes `completion_tokens_details.reasoning_tokens`).
//!
//! `total_tokens` checks the sum. OpenAI's is always `prompt_tokens +
//! completion_tokens`; Gemini's OpenAI-compatible endpoint has been seen
//! reporting `completion_tokens` without the model's thoughts while its
//! `total_tokens` holds them (docs/GEMINI.md). When the total reports more
//! than the two, the excess is output the fields did not name, charged as
//! output and counted as reasoning (never less than what the fields say).

use axum::http::{header, HeaderName};
use serde_json::Value;

use super::json_scan::{Fields, Scan};
use super::usage::{read_count, Rejected, UsageBreakdown};
use super::KeyHeader;

/// `Authorization: Bearer <key>`, and `api-key: <key>` as Azure clients send it.
pub static KEY_HEADERS: [KeyHeader; 2] = [
    KeyHeader::Bearer(header::AUTHORIZATION),
    KeyHeader::Plain(HeaderName::from_static("api-key")),
];

/// The request id header (OpenAI API reference, "Debugging requests").
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The breakdown of an OpenAI `usage` object given as raw JSON.
///
/// Read into the four counts it needs, without building a `Value` tree of
/// the whole object: a tree and its JSON-pointer lookups cost about three
/// times as much on the path of every non-streamed answer.
pub fn usage_from_raw(raw: &str) -> Option<UsageBreakdown> {
    if !raw.starts_with('{') {
        return None;
    }
    scanned_usage(raw).or_else(|| serde_usage(raw))
}

/// [`usage_from_raw`] by serde's rules ([`RawUsage`]): what the reader
/// declines, and the reference its tests compare it with.
fn serde_usage(raw: &str) -> Option<UsageBreakdown> {
    let u: RawUsage = serde_json::from_str(raw).ok()?;
    Some(breakdown(
        u.prompt_tokens.as_ref(),
        u.completion_tokens.as_ref(),
        u.prompt_tokens_details.count.as_ref(),
        u.completion_tokens_details.count.as_ref(),
        u.total_tokens.as_ref(),
    ))
}

/// [`usage_from_raw`] by the forward-only reader, for the usual `usage`:
/// counts that are integers or `null`, details that are objects or
/// `null`. Anything else (a count written `12.0`, a string, details of
/// another shape) is declined and read by serde as [`RawUsage`], whose
/// rules this follows: a repeated count refuses the object, the last of
/// a repeated detail counts.
fn scanned_usage(raw: &str) -> Option<UsageBreakdown> {
    fn count(s: &mut Scan<'_>) -> Option<Value> {
        s.u64().map(Value::from)
    }
    fn detail(s: &mut Scan<'_>, name: &str) -> Option<Option<Value>> {
        let mut found = None;
        s.object(|s, k| {
            if k == name {
                found = if s.null() { None } else { Some(count(s)?) };
            } else {
                s.skip()?;
            }
            Some(())
        })?;
        Some(found)
    }
    let mut s = Scan::new(raw);
    let mut seen = Fields::default();
    let [mut prompt, mut completion, mut total, mut cached, mut reasoning] =
        [None, None, None, None, None];
    s.object(|s, k| {
        match &*k {
            "prompt_tokens" => prompt = seen.once(0, s, count)?,
            "completion_tokens" => completion = seen.once(1, s, count)?,
            "total_tokens" => total = seen.once(2, s, count)?,
            "prompt_tokens_details" => {
                cached = seen.once(3, s, |s| detail(s, "cached_tokens"))?.flatten()
            }
            "completion_tokens_details" => {
                reasoning = seen
                    .once(4, s, |s| detail(s, "reasoning_tokens"))?
                    .flatten()
            }
            _ => s.skip()?,
        }
        Some(())
    })?;
    s.end()?;
    Some(breakdown(
        prompt.as_ref(),
        completion.as_ref(),
        cached.as_ref(),
        reasoning.as_ref(),
        total.as_ref(),
    ))
}

/// The counts of a `usage` object; other members are skipped unread.
#[derive(serde::Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<Value>,
    #[serde(default)]
    completion_tokens: Option<Value>,
    #[serde(default)]
    total_tokens: Option<Value>,
    #[serde(default)]
    prompt_tokens_details: Details<Cached>,
    #[serde(default)]
    completion_tokens_details: Details<Reasoning>,
}

/// The one member of a `*_tokens_details` object the breakdown reads. Any
/// other shape (null, a number, a string) reads as absent, as
/// [`Value::pointer`] would.
struct Details<M> {
    count: Option<Value>,
    member: std::marker::PhantomData<M>,
}

impl<M> Default for Details<M> {
    fn default() -> Self {
        Details {
            count: None,
            member: std::marker::PhantomData,
        }
    }
}

trait Member {
    const NAME: &'static str;
}
struct Cached;
impl Member for Cached {
    const NAME: &'static str = "cached_tokens";
}
struct Reasoning;
impl Member for Reasoning {
    const NAME: &'static str = "reasoning_tokens";
}

/// Whether a key is `M::NAME`, read without allocating (escaped keys too).
struct IsMember<M>(bool, std::marker::PhantomData<M>);

impl<'de, M: Member> serde::Deserialize<'de> for IsMember<M> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<M>(std::marker::PhantomData<M>);
        impl<M: Member> serde::de::Visitor<'_> for V<M> {
            type Value = IsMember<M>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E>(self, k: &str) -> Result<IsMember<M>, E> {
                Ok(IsMember(k == M::NAME, std::marker::PhantomData))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

impl<'de, M: Member> serde::Deserialize<'de> for Details<M> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
        struct V<M>(std::marker::PhantomData<M>);
        impl<'de, M: Member> Visitor<'de> for V<M> {
            type Value = Details<M>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Details<M>, A::Error> {
                let mut out = Details::default();
                while let Some(IsMember(hit, _)) = map.next_key::<IsMember<M>>()? {
                    if hit {
                        out.count = map.next_value::<Option<Value>>()?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(out)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Details<M>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Details::default())
            }
            fn visit_unit<E>(self) -> Result<Details<M>, E> {
                Ok(Details::default())
            }
            fn visit_none<E>(self) -> Result<Details<M>, E> {
                Ok(Details::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Details<M>, E> {
                Ok(Details::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Details<M>, E> {
                Ok(Details::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Details<M>, E> {
                Ok(Details::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Details<M>, E> {
                Ok(Details::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Details<M>, E> {
                Ok(Details::default())
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// The breakdown of an OpenAI `usage` object. Subsets are taken out of
/// the counts they belong to, never added twice.
pub fn usage_from_value(u: &Value) -> UsageBreakdown {
    breakdown(
        u.get("prompt_tokens"),
        u.get("completion_tokens"),
        u.get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens")),
        u.get("completion_tokens_details")
            .and_then(|d| d.get("reasoning_tokens")),
        u.get("total_tokens"),
    )
}

fn breakdown(
    prompt: Option<&Value>,
    completion: Option<&Value>,
    cached: Option<&Value>,
    reasoning: Option<&Value>,
    total: Option<&Value>,
) -> UsageBreakdown {
    let mut rejected = Rejected::default();
    let prompt = read_count(prompt, "prompt_tokens", &mut rejected.input);
    let cached = read_count(cached, "cached_tokens", &mut rejected.input).unwrap_or(0);
    let completion = read_count(completion, "completion_tokens", &mut rejected.output);
    let mut reasoning =
        read_count(reasoning, "reasoning_tokens", &mut rejected.output).unwrap_or(0);
    // A total that is no count checks nothing (it rejects no side).
    let total = read_count(total, "total_tokens", &mut None);
    let completion = match (prompt, completion, total) {
        (Some(p), Some(c), Some(t)) if t > p.saturating_add(c) => {
            // Thoughts left out of `completion_tokens` (see the module doc).
            let unnamed = t - p - c;
            reasoning = reasoning.max(unnamed);
            Some(c + unnamed)
        }
        (_, c, _) => c,
    };
    // A subset larger than its whole is the upstream's mistake: bounded by the whole.
    let cached_input = prompt.map_or(0, |p| cached.min(p));
    UsageBreakdown {
        uncached_input: prompt.map(|p| p - cached_input),
        cached_input,
        cache_writes: 0,
        cache_writes_1h: 0,
        output: completion,
        reasoning: completion.map_or(0, |c| reasoning.min(c)),
        hosted: Default::default(),
        rejected_input: None,
        rejected_output: None,
    }
    .rejecting(rejected)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed read of a raw `usage` and the read of its `Value` agree,
    /// on well-formed and on hostile shapes alike.
    #[test]
    fn raw_and_value_reads_agree() {
        let cases = [
            r#"{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}"#,
            r#"{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":2,"accepted_prediction_tokens":0}}"#,
            r#"{"completion_tokens":7}"#,
            r#"{"prompt_tokens":null,"completion_tokens":-3}"#,
            r#"{"prompt_tokens":2.5,"completion_tokens":"9"}"#,
            r#"{"prompt_tokens":5,"prompt_tokens_details":null,"completion_tokens_details":[1,2]}"#,
            r#"{"prompt_tokens":5,"prompt_tokens_details":"x","completion_tokens_details":7}"#,
            r#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":99},"completion_tokens":1,"completion_tokens_details":{"reasoning_tokens":50}}"#,
            r#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":2,"nested":{"a":[1,{"b":2}]}}}"#,
            r#"{"prompt_tokens":18446744073709551615,"completion_tokens":1e300}"#,
            r#"{"extra":{"prompt_tokens":1},"prompt_tokens":3}"#,
            r#"{"prompt_tokens":11,"completion_tokens":9,"total_tokens":88}"#,
            r#"{"prompt_tokens":11,"completion_tokens":9,"total_tokens":"88"}"#,
            r#"{"prompt_tokens":11,"completion_tokens":9,"total_tokens":3}"#,
            r#"{}"#,
        ];
        for raw in cases {
            let v: Value = serde_json::from_str(raw).unwrap();
            assert_eq!(usage_from_raw(raw), Some(usage_from_value(&v)), "{raw}");
        }
        assert_eq!(usage_from_raw("[1]"), None);
        assert_eq!(usage_from_raw("{\"prompt_tokens\":"), None);
    }

    /// A total above prompt + completion is output the completion left
    /// out (Gemini's thoughts on its OpenAI-compatible endpoint): charged
    /// as output and as reasoning. A total that agrees, is smaller or is
    /// no count changes nothing.
    #[test]
    fn a_larger_total_is_charged_as_reasoning_output() {
        let read = |raw: &str| usage_from_raw(raw).expect("an object");
        let u = read(r#"{"prompt_tokens":11,"completion_tokens":9,"total_tokens":88}"#);
        assert_eq!((u.output, u.reasoning), (Some(77), 68));
        assert_eq!(u.input(), Some(11));
        let u = read(
            r#"{"prompt_tokens":11,"completion_tokens":9,"total_tokens":97,"completion_tokens_details":{"reasoning_tokens":77}}"#,
        );
        assert_eq!((u.output, u.reasoning), (Some(86), 77));
        let u = read(
            r#"{"prompt_tokens":10,"completion_tokens":30,"total_tokens":40,"completion_tokens_details":{"reasoning_tokens":20}}"#,
        );
        assert_eq!((u.output, u.reasoning), (Some(30), 20));
        let u = read(r#"{"prompt_tokens":10,"completion_tokens":30,"total_tokens":5}"#);
        assert_eq!((u.output, u.reasoning), (Some(30), 0));
        let u = read(r#"{"prompt_tokens":10,"completion_tokens":30,"total_tokens":-1}"#);
        assert_eq!((u.output, u.rejected_output), (Some(30), None));
    }

    mod reader {
        use super::*;
        use crate::dialects::json_scan::generate::{object, or_other, value};
        use proptest::prelude::*;

        /// What serde alone reads of `raw`.
        fn by_serde(raw: &str) -> Option<UsageBreakdown> {
            raw.starts_with('{').then(|| serde_usage(raw)).flatten()
        }

        fn count() -> BoxedStrategy<String> {
            prop_oneof![
                6 => (0u64..100_000).prop_map(|n| n.to_string()),
                1 => any::<u64>().prop_map(|n| n.to_string()),
                1 => Just("12.0".to_string()),
                1 => Just("-3".to_string()),
            ]
            .boxed()
        }

        fn usage() -> BoxedStrategy<String> {
            let details = |name: &'static str| {
                or_other(object(vec![
                    (name, or_other(count())),
                    ("audio_tokens", count()),
                ]))
            };
            object(vec![
                ("prompt_tokens", or_other(count())),
                ("completion_tokens", or_other(count())),
                ("total_tokens", or_other(count())),
                ("prompt_tokens_details", details("cached_tokens")),
                ("completion_tokens_details", details("reasoning_tokens")),
                ("other", value().boxed()),
            ])
        }

        /// The generated objects are mostly read by the reader itself.
        #[test]
        fn the_generated_usage_is_mostly_read() {
            use proptest::strategy::ValueTree;
            let mut runner = proptest::test_runner::TestRunner::deterministic();
            let (mut read, mut detailed) = (0, 0);
            for _ in 0..1000 {
                let raw = usage().new_tree(&mut runner).expect("a usage").current();
                if let Some(u) = scanned_usage(&raw) {
                    read += 1;
                    detailed += usize::from(u.cached_input > 0 || u.reasoning > 0);
                }
            }
            assert!(
                read > 300 && detailed > 50,
                "read {read}, detailed {detailed}"
            );
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(3000))]
            /// The reader reads what serde reads: whenever it reads at
            /// all, and so `usage_from_raw` whatever it is given.
            #[test]
            fn usage_reads_as_serde_reads_it(raw in usage()) {
                prop_assert_eq!(usage_from_raw(&raw), by_serde(&raw), "{}", raw);
            }
        }
    }
}
