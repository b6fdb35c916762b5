//! The request body's top-level object, read in one pass into its map of
//! members. A member the gateway reads (its model, cap, stream flag,
//! choices, what it estimates) that appears twice is refused: the gateway
//! would reserve by the last while the body goes upstream byte for byte
//! and the upstream may read the first. Other members may repeat (the
//! gateway takes no decision on them); the check costs nothing unless a
//! name repeats.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Value};

/// The top-level members the gateway reads, in some dialect.
const READ_MEMBERS: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "n",
    "best_of",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "max_tool_calls",
    "messages",
    "input",
    "prompt",
    "suffix",
    "system",
    "instructions",
    "tools",
    "functions",
    "tool_choice",
    "thinking",
    "reasoning",
    "response_format",
    "text",
    "modalities",
    "service_tier",
    "previous_response_id",
    "conversation",
    "background",
    "store",
    "cache_control",
    "container",
    "mcp_servers",
    "user",
    "safety_identifier",
    "metadata",
];

/// What the body's JSON is.
#[derive(Debug)]
pub enum BodyObject {
    /// An object, every member once (an unread member repeated: its last value).
    Object(Map<String, Value>),
    /// An object in which this read member appears more than once.
    Repeated(&'static str),
    /// Valid JSON that is not an object.
    NotObject,
}

impl<'de> Deserialize<'de> for BodyObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TopLevel)
    }
}

struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = BodyObject;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BodyObject, A::Error> {
        let mut members = Map::new();
        let mut repeated = None;
        while let Some(name) = map.next_key::<String>()? {
            let value: Value = map.next_value()?;
            match members.entry(name) {
                Entry::Vacant(e) => {
                    e.insert(value);
                }
                Entry::Occupied(mut e) => {
                    if repeated.is_none() {
                        repeated = READ_MEMBERS.iter().copied().find(|m| *m == e.key());
                    }
                    e.insert(value);
                }
            }
        }
        Ok(match repeated {
            Some(name) => BodyObject::Repeated(name),
            None => BodyObject::Object(members),
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<BodyObject, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(BodyObject::NotObject)
    }

    fn visit_bool<E>(self, _: bool) -> Result<BodyObject, E> {
        Ok(BodyObject::NotObject)
    }

    fn visit_i64<E>(self, _: i64) -> Result<BodyObject, E> {
        Ok(BodyObject::NotObject)
    }

    fn visit_u64<E>(self, _: u64) -> Result<BodyObject, E> {
        Ok(BodyObject::NotObject)
    }

    fn visit_f64<E>(self, _: f64) -> Result<BodyObject, E> {
        Ok(BodyObject::NotObject)
    }

    fn visit_str<E>(self, _: &str) -> Result<BodyObject, E> {
        Ok(BodyObject::NotObject)
    }

    fn visit_unit<E>(self) -> Result<BodyObject, E> {
        Ok(BodyObject::NotObject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &str) -> BodyObject {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn a_read_member_repeated_is_named() {
        for (body, name) in [
            (
                r#"{"model":"m","max_tokens":5,"max_tokens":50000}"#,
                "max_tokens",
            ),
            (r#"{"n":1,"model":"m","n":8}"#, "n"),
            (r#"{"stream":false,"stream":true}"#, "stream"),
            (r#"{"model":"a","model":"b"}"#, "model"),
        ] {
            assert!(
                matches!(read(body), BodyObject::Repeated(n) if n == name),
                "{body}"
            );
        }
    }

    #[test]
    fn other_members_may_repeat_and_the_last_is_kept() {
        let BodyObject::Object(m) = read(r#"{"model":"m","x":1,"x":2,"n":2}"#) else {
            panic!("an object");
        };
        assert_eq!(m["x"], 2);
        assert_eq!(m.len(), 3);
        // Nested objects are values: their members are not checked here.
        assert!(matches!(
            read(r#"{"metadata":{"a":1,"a":2}}"#),
            BodyObject::Object(_)
        ));
    }

    #[test]
    fn json_that_is_no_object_is_told_apart_from_bad_json() {
        for body in ["[1,{\"a\":2}]", "3", "-1", "1.5", "\"s\"", "true", "null"] {
            assert!(matches!(read(body), BodyObject::NotObject), "{body}");
        }
        assert!(serde_json::from_str::<BodyObject>(r#"{"model":}"#).is_err());
        assert!(serde_json::from_str::<BodyObject>(r#"{"a":1} x"#).is_err());
    }
}
