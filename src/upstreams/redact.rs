//! What a log line may say of an endpoint the gateway calls besides its
//! upstreams (the alert webhook, the OTLP receiver) and of a failed call to
//! it: as an upstream failure names its deployment and the failure's kind,
//! never its URL. A Slack-style webhook's path is its secret; an OTLP
//! endpoint may carry a password (`https://user:pass@host`); reqwest's
//! error text holds the whole URL.

/// `url` with only its scheme, host and port: `https://hooks.example.com/…`
/// (the `/…` says a path or query was left out).
pub fn endpoint(url: &str) -> String {
    let Ok(u) = reqwest::Url::parse(url) else {
        return "(an unparsable URL)".into();
    };
    let mut out = format!("{}://{}", u.scheme(), u.host_str().unwrap_or(""));
    if let Some(port) = u.port() {
        out.push(':');
        out.push_str(&port.to_string());
    }
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
        out.push_str("/…");
    }
    out
}

/// The kind of a failed request (`connection failed`, `timed out`,
/// `request failed`) and, when the innermost cause is the operating
/// system's (connection refused, no route…), its words: never the URL.
pub fn send_error(e: &reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "connection failed"
    } else if e.is_timeout() {
        "timed out"
    } else {
        "request failed"
    };
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    match cause.downcast_ref::<std::io::Error>() {
        Some(io) => format!("{kind}: {io}"),
        None => kind.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_keeps_scheme_host_and_port_only() {
        assert_eq!(
            endpoint("https://hooks.slack.com/services/T000/B000/XXXXSECRET"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            endpoint("http://user:hunter2@127.0.0.1:4318"),
            "http://127.0.0.1:4318"
        );
        assert_eq!(
            endpoint("https://otel.example.com/v1/traces?token=abc"),
            "https://otel.example.com/…"
        );
        assert_eq!(endpoint("not a url"), "(an unparsable URL)");
    }

    #[tokio::test]
    async fn a_failed_request_is_described_without_its_url() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let url = format!("http://user:hunter2@127.0.0.1:{port}/services/T0/B0/SECRET");
        let e = reqwest::Client::new()
            .post(&url)
            .send()
            .await
            .expect_err("nothing listens there");
        assert!(e.to_string().contains("SECRET"), "reqwest's own text: {e}");
        let said = send_error(&e);
        assert!(said.starts_with("connection failed"), "{said}");
        assert!(
            !said.contains("SECRET") && !said.contains("hunter2"),
            "{said}"
        );
    }
}
