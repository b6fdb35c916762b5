use super::*;

fn string(s: &str) -> Option<Cow<'_, str>> {
    let mut sc = Scan::new(s);
    let v = sc.string()?;
    sc.end()?;
    Some(v)
}

#[test]
fn strings_unescape_as_serde_json_does() {
    for s in [
        r#""plain""#,
        r#""a\"b\\c\/d\b\f\n\r\t""#,
        r#""\u00e9\u4e2d\ud83d\ude00 x""#,
        r#""\u0000""#,
        "\"caf\u{e9} \u{1F600}\"",
    ] {
        let ours = string(s).expect(s);
        let theirs: String = serde_json::from_str(s).unwrap();
        assert_eq!(ours, theirs, "{s}");
    }
    assert!(matches!(string(r#""plain""#), Some(Cow::Borrowed(_))));
    for bad in [
        r#""\ud83d""#,
        r#""\ude00""#,
        r#""\ud83d\u0041""#,
        r#""\x""#,
        r#""\u12""#,
        "\"a\u{1}\"",
        r#""open"#,
    ] {
        assert!(string(bad).is_none(), "{bad}");
    }
}

proptest::proptest! {
    /// The eight-byte scan finds what a byte-by-byte scan finds.
    #[test]
    fn special_bytes_are_found_as_one_by_one(
        b in proptest::collection::vec(proptest::prop_oneof![
            proptest::prelude::any::<u8>(),
            proptest::prelude::Just(b'a'),
            proptest::prelude::Just(0xe9u8),
        ], 0..40),
        from in 0usize..40,
    ) {
        let naive = b.get(from..).and_then(|r| {
            r.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20).map(|n| from + n)
        });
        proptest::prop_assert_eq!(special(&b, from), naive);
    }
}

#[test]
fn numbers_are_integers_or_left_to_serde() {
    let u = |s: &str| Scan::new(s).u64();
    assert_eq!(u("0"), Some(0));
    assert_eq!(u(" 18446744073709551615"), Some(u64::MAX));
    for bad in ["18446744073709551616", "-1", "01", "1.0", "1e2", "", "x"] {
        assert_eq!(u(bad), None, "{bad}");
    }
    let i = |s: &str| Scan::new(s).i64();
    assert_eq!(i("-0"), Some(0));
    assert_eq!(i("-9223372036854775808"), Some(i64::MIN));
    assert_eq!(i("9223372036854775808"), None);
    assert_eq!(i("-9223372036854775809"), None);
    assert_eq!(u("9999999999999999999"), Some(9_999_999_999_999_999_999));
}

proptest::proptest! {
    /// Integers of every size read as the standard parse reads them.
    #[test]
    fn integers_read_as_the_standard_parse(n in proptest::prelude::any::<i128>(), shift in 0u32..128) {
        let text = (n >> shift).to_string();
        proptest::prop_assert_eq!(Scan::new(&text).u64(), text.parse::<u64>().ok(), "{}", text);
        proptest::prop_assert_eq!(Scan::new(&text).i64(), text.parse::<i64>().ok(), "{}", text);
    }
}

#[test]
fn raw_values_are_the_spans_serde_json_borrows() {
    let doc = r#"{"a": {"x":[1,-2.5,true,false,null,"s"]} , "b":null,"c" : "q\"" }"#;
    let mut sc = Scan::new(doc);
    let mut seen = Vec::new();
    sc.object(|s, k| {
        seen.push((k.into_owned(), s.raw()?.to_string()));
        Some(())
    })
    .unwrap();
    sc.end().unwrap();
    #[derive(serde::Deserialize)]
    struct Raws<'a> {
        #[serde(borrow)]
        a: &'a serde_json::value::RawValue,
        #[serde(borrow)]
        b: &'a serde_json::value::RawValue,
        #[serde(borrow)]
        c: &'a serde_json::value::RawValue,
    }
    let r: Raws = serde_json::from_str(doc).unwrap();
    assert_eq!(
        seen,
        [
            ("a".to_string(), r.a.get().to_string()),
            ("b".to_string(), r.b.get().to_string()),
            ("c".to_string(), r.c.get().to_string()),
        ]
    );
    for bad in [
        "[1,]",
        "{\"a\":1,}",
        "[1 2]",
        "{\"a\" 1}",
        "[1e5]",
        "tru",
        "[-]",
    ] {
        assert!(Scan::new(bad).skip().is_none(), "{bad}");
    }
    let deep = "[".repeat(MAX_DEPTH as usize + 1) + &"]".repeat(MAX_DEPTH as usize + 1);
    assert!(Scan::new(&deep).skip().is_none());
    let ok = "[".repeat(MAX_DEPTH as usize) + &"]".repeat(MAX_DEPTH as usize);
    assert!(Scan::new(&ok).skip().is_some());
}
