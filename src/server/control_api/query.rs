//! The control API's query parameters, read as text and each converted
//! on its own: a bad value, a name the route does not know or a name
//! given twice is answered 400 in the error shape of every other refusal,
//! naming the parameter (`param`), never the extractor's plain text nor
//! silently ignored.

use std::ops::RangeInclusive;

use axum::extract::{OriginalUri, Query};
use axum::response::Response;

use super::bad_request;

/// A request's query: its parameters by name, as written.
pub struct Params(Vec<(String, String)>);

impl Params {
    /// The query of `uri`, whose every name must be one of `known`.
    pub fn of(uri: &OriginalUri, known: &[&str]) -> Result<Params, Response> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(&uri.0)
            .map_err(|e| bad_request(None, &format!("The query string does not parse: {e}")))?;
        for (i, (name, _)) in pairs.iter().enumerate() {
            if !known.contains(&name.as_str()) {
                let names = known.join("`, `");
                return Err(bad_request(
                    Some(name),
                    &format!("`{name}` is not a parameter of this route (it takes `{names}`)."),
                ));
            }
            if pairs[..i].iter().any(|(n, _)| n == name) {
                return Err(bad_request(
                    Some(name),
                    &format!("`{name}` is given twice."),
                ));
            }
        }
        Ok(Params(pairs))
    }

    /// Parameter `name`, as written.
    pub fn text(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    /// Parameter `name`, a whole number within `range`.
    pub fn number(&self, name: &str, range: RangeInclusive<u64>) -> Result<Option<u64>, Response> {
        let Some(v) = self.text(name) else {
            return Ok(None);
        };
        match v.parse::<u64>() {
            Ok(n) if range.contains(&n) => Ok(Some(n)),
            _ => Err(bad_request(
                Some(name),
                &format!(
                    "`{name}` must be a whole number within {}..={}, not {v:?}.",
                    range.start(),
                    range.end()
                ),
            )),
        }
    }

    /// Parameter `name`, `true` or `false`.
    pub fn boolean(&self, name: &str) -> Result<Option<bool>, Response> {
        match self.text(name).as_deref() {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(v) => Err(bad_request(
                Some(name),
                &format!("`{name}` must be true or false, not {v:?}."),
            )),
        }
    }

    /// Parameter `name`, one of `values`.
    pub fn one_of(&self, name: &str, values: &[&str]) -> Result<Option<String>, Response> {
        match self.text(name) {
            Some(v) if !values.contains(&v.as_str()) => Err(bad_request(
                Some(name),
                &format!(
                    "`{name}` must be one of \"{}\", not {v:?}.",
                    values.join("\", \"")
                ),
            )),
            v => Ok(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(q: &str, known: &[&str]) -> Result<Params, Response> {
        let uri: axum::http::Uri = format!("/x?{q}").parse().unwrap();
        Params::of(&OriginalUri(uri), known)
    }

    async fn refusal(r: Response) -> (u16, serde_json::Value) {
        let status = r.status().as_u16();
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn each_bad_parameter_is_named() {
        let p = params(
            "limit=abc&revoked=maybe&source=xyz&after=a%2Fb",
            &["limit", "revoked", "source", "after"],
        )
        .ok()
        .unwrap();
        for r in [
            p.number("limit", 1..=1000).err().unwrap(),
            p.boolean("revoked").err().unwrap(),
            p.one_of("source", &["file", "api"]).err().unwrap(),
            params("limt=5", &["limit"]).err().unwrap(),
            params("limit=5&limit=6", &["limit"]).err().unwrap(),
        ] {
            let (s, v) = refusal(r).await;
            assert_eq!(s, 400, "{v}");
            assert!(v["error"]["param"].is_string(), "{v}");
        }
        assert_eq!(p.text("after").as_deref(), Some("a/b"));
        let p = params(
            "limit=1000&revoked=false&source=api",
            &["limit", "revoked", "source"],
        )
        .ok()
        .unwrap();
        assert_eq!(p.number("limit", 1..=1000).ok().unwrap(), Some(1000));
        assert_eq!(p.boolean("revoked").ok().unwrap(), Some(false));
        assert_eq!(
            p.one_of("source", &["file", "api"])
                .ok()
                .unwrap()
                .as_deref(),
            Some("api")
        );
        assert!(p.number("limit", 1..=999).is_err());
    }
}
