//! The model and method of a Gemini model route, read from the raw path
//! (`/v1beta/models/{model}:{method}`). The model name becomes a segment
//! of the upstream's URL, so a name that could point anywhere else is
//! refused before any lookup: one holding `/`, `\`, `..`, a percent
//! escape (`%2F` and every other: no name the config maps needs one) or
//! a control character. Such a request is a 404 that reaches no upstream.

/// A Gemini model method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `:generateContent`: one answer.
    Generate,
    /// `:streamGenerateContent`: chunks, as SSE with `alt=sse`, else one
    /// JSON array.
    Stream,
    /// `:countTokens`: the gateway's estimate of the input.
    CountTokens,
}

impl Method {
    fn parse(s: &str) -> Option<Method> {
        Some(match s {
            "generateContent" => Method::Generate,
            "streamGenerateContent" => Method::Stream,
            "countTokens" => Method::CountTokens,
            _ => return None,
        })
    }

    /// The method's name in a URL.
    pub fn name(self) -> &'static str {
        match self {
            Method::Generate => "generateContent",
            Method::Stream => "streamGenerateContent",
            Method::CountTokens => "countTokens",
        }
    }
}

/// The model and method `raw` (the part of the raw path after
/// `/models/`) names; `None` when the model name is not a plain name or
/// the method is not one the gateway serves.
pub fn model_and_method(raw: &str) -> Option<(&str, Method)> {
    let (model, method) = raw.rsplit_once(':')?;
    let method = Method::parse(method)?;
    // Google's clients may send the resource name `models/{model}` only
    // as the path, never inside the segment.
    let plain = !model.is_empty()
        && model.len() <= 256
        && !model.contains("..")
        && model
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'\\' | b'%' | b'?' | b'#'));
    plain.then_some((model, method))
}

/// Whether the query asks for SSE framing (`alt=sse`).
pub fn wants_sse(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|p| p == "alt=sse"))
}

/// The `key` parameter of the query, if any (Google's clients may send
/// the API key there). Percent escapes are decoded: a key is compared
/// by its digest, byte for byte.
pub fn query_key(query: Option<&str>) -> Option<String> {
    let v = query?.split('&').find_map(|p| p.strip_prefix("key="))?;
    let decoded = percent_encoding::percent_decode_str(v).decode_utf8().ok()?;
    let k = decoded.trim();
    (!k.is_empty()).then(|| k.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_model_and_a_known_method_are_read() {
        assert_eq!(
            model_and_method("gemini-2.5-flash:generateContent"),
            Some(("gemini-2.5-flash", Method::Generate))
        );
        assert_eq!(
            model_and_method("gemini-2.0-flash-001:streamGenerateContent"),
            Some(("gemini-2.0-flash-001", Method::Stream))
        );
        assert_eq!(
            model_and_method("gemini-2.5-pro:countTokens"),
            Some(("gemini-2.5-pro", Method::CountTokens))
        );
    }

    #[test]
    fn a_name_that_could_reach_another_resource_is_refused() {
        for raw in [
            "a%2Fb:generateContent",
            "a%2fb:generateContent",
            "../x:generateContent",
            "x/..:generateContent",
            "a/b:generateContent",
            "a\\b:generateContent",
            "..:generateContent",
            ":generateContent",
            "gemini:embedContent",
            "gemini",
            "gem ini:generateContent",
        ] {
            assert_eq!(model_and_method(raw), None, "{raw}");
        }
    }

    #[test]
    fn the_query_key_and_the_framing_are_read() {
        assert_eq!(query_key(Some("alt=sse&key=abc%2B1")), Some("abc+1".into()));
        assert_eq!(query_key(Some("alt=sse")), None);
        assert!(wants_sse(Some("key=x&alt=sse")));
        assert!(!wants_sse(Some("alt=json")));
        assert!(!wants_sse(None));
    }
}
