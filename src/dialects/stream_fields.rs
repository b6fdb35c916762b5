//! The serde side of the stream events' field structs (bound-first metering): the
//! relay reads them with [`super::json_scan`], and their serde derives are
//! the reference its tests compare with. [`Object`] makes a struct read
//! only from a JSON object, as a tree's `get` would: serde reads a struct
//! from an array too, by position, which a tree never does. [`Raw`] is a
//! value's text, unparsed.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// A `T` read only from a JSON object.
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Only<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Only<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        d.deserialize_map(Only(std::marker::PhantomData))
    }
}

/// A value's JSON text, unparsed: serde_json's `RawValue`, borrowed as
/// the `str` it is (so a reader other than serde can make one too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(pub &'a str);

impl<'a> Raw<'a> {
    /// The value's text.
    pub fn get(&self) -> &'a str {
        self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Raw<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'de serde_json::value::RawValue>::deserialize(d).map(|r| Raw(r.get()))
    }
}

/// Parses `data` as a `T` read from a JSON object; `None` otherwise.
pub fn parse<'a, T: Deserialize<'a>>(data: &'a str) -> Option<T> {
    serde_json::from_str::<Object<T>>(data).ok().map(|o| o.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Two {
        #[serde(default)]
        a: Option<u64>,
        #[serde(default)]
        b: Option<Object<Inner>>,
    }
    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Inner {
        #[serde(default)]
        c: Option<String>,
    }
    impl PartialEq for Object<Inner> {
        fn eq(&self, o: &Self) -> bool {
            self.0 == o.0
        }
    }

    #[test]
    fn objects_only() {
        assert_eq!(
            parse::<Two>(r#"{"a":1,"b":{"c":"x"},"z":[1]}"#).unwrap().a,
            Some(1)
        );
        assert!(parse::<Two>("[1]").is_none());
        assert!(parse::<Two>(r#"{"b":["x"]}"#).is_none());
        assert!(parse::<Two>(r#"{"a":1} x"#).is_none());
        assert_eq!(parse::<Two>(r#"{"b":null}"#).unwrap().b, None);
    }
}
