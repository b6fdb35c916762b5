//! Generated JSON text for the tests that check readers built on
//! [`Scan`](super::Scan) against serde's derive of the same structs.

use proptest::prelude::*;

/// A JSON string for `text`: each character raw or escaped (the short
/// escapes, else `\u` with surrogate pairs above the BMP) as `escapes` says.
pub fn json_string(text: &str, escapes: &[bool]) -> String {
    let mut out = String::from('"');
    for (i, c) in text.chars().enumerate() {
        let escape = escapes
            .get(i % escapes.len().max(1))
            .copied()
            .unwrap_or(false);
        let short = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '/' if escape => Some("\\/"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        match short {
            Some(s) if !escape || c == '"' || c == '\\' || c == '/' => out.push_str(s),
            _ if (c as u32) < 0x20 || escape => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn string() -> impl Strategy<Value = String> {
    (
        "\\PC{0,12}|[\"\\\\/\u{0}-\u{1f}a\u{e9}\u{1F600}]{0,6}",
        proptest::collection::vec(any::<bool>(), 0..4),
    )
        .prop_map(|(t, e)| json_string(&t, &e))
}

pub fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        (any::<i32>(), 0u32..1000).prop_map(|(a, b)| format!("{a}.{b}")),
        string(),
    ]
}

pub fn value() -> impl Strategy<Value = String> {
    scalar().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| format!("[{}]", v.join(","))),
            proptest::collection::vec((string(), inner), 0..4).prop_map(|m| {
                let m: Vec<String> = m.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", m.join(" , "))
            }),
        ]
    })
}

/// An object of `known` members (each maybe left out) and a few
/// unknown ones, in a random order, sometimes a known one twice.
pub fn object(known: Vec<(&'static str, BoxedStrategy<String>)>) -> BoxedStrategy<String> {
    let members: Vec<BoxedStrategy<Option<String>>> = known
        .into_iter()
        .map(|(k, v)| {
            proptest::option::weighted(0.7, v.prop_map(move |v| format!("\"{k}\":{v}"))).boxed()
        })
        .collect();
    (
        members,
        proptest::collection::vec((string(), value()), 0..3),
        any::<u64>(),
        proptest::sample::select(vec!["", " ", "\n "]),
    )
        .prop_map(|(known, unknown, order, ws)| {
            let mut m: Vec<String> = known.into_iter().flatten().collect();
            if order % 17 == 0 && !m.is_empty() {
                m.push(m[0].clone());
            }
            m.extend(unknown.into_iter().map(|(k, v)| format!("{k}{ws}:{ws}{v}")));
            let n = m.len().max(1);
            m.rotate_left((order as usize) % n);
            format!("{{{ws}{}{ws}}}", m.join(&format!("{ws},")))
        })
        .boxed()
}

pub fn or_other(s: BoxedStrategy<String>) -> BoxedStrategy<String> {
    prop_oneof![8 => s, 1 => Just("null".to_string()), 1 => value()].boxed()
}
