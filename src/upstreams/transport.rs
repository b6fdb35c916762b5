//! The HTTP connections to upstream deployments: hyper's pooled client
//! (HTTP/1.1, HTTP/2 where TLS offers it by ALPN), TLS verified by the
//! system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` honoured), the
//! proxies the environment names (`HTTP_PROXY`, `HTTPS_PROXY`,
//! `ALL_PROXY`, `NO_PROXY`, as curl reads them), no redirect ever
//! followed, and one deadline over the whole call, body included. A
//! proxy URL may be `http://` or `https://` (TLS to the proxy itself).
//!
//! The direct providers' calls (OpenAI-compatible servers, Azure,
//! Anthropic) go through [`Transport`]: a request there is the gateway's
//! hot path, and a general client's layers (its URL type parsed back
//! from the request's `Uri`, its redirect layer even with redirects off)
//! cost more than the rest of the call. The clouds' calls (signing,
//! token refresh) and the rare stored-response calls keep reqwest.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long an unused kept-alive connection stays in the pool.
const POOL_IDLE: Duration = Duration::from_secs(90);

/// Where a call goes: the request's URI and its `Host` header, made once
/// per endpoint (hyper's client would otherwise format the header from
/// the URI on every call), and the basic auth of a URL's user info.
#[derive(Clone, Debug)]
pub struct Endpoint {
    uri: http::Uri,
    host: http::HeaderValue,
    basic_auth: Option<http::HeaderValue>,
}

impl Endpoint {
    /// `text` parsed as a URL first (as reqwest did: IDNA,
    /// percent-encoding, the default port dropped); `None` if it is not
    /// an absolute http(s) URL with a host.
    pub fn parse(text: &str) -> Option<Self> {
        let mut url = reqwest::Url::parse(text).ok()?;
        let basic_auth = match user_info(&url) {
            Some((user, password)) => Some(basic(&user, password.as_deref())?),
            None => None,
        };
        if basic_auth.is_some() {
            url.set_username("").ok()?;
            url.set_password(None).ok()?;
        }
        let uri = http::Uri::try_from(url.as_str()).ok()?;
        // The host and any port but the scheme's own; never user info.
        let host = match url.port() {
            Some(port) => format!("{}:{port}", uri.host()?),
            None => uri.host()?.to_string(),
        };
        let host = http::HeaderValue::try_from(host).ok()?;
        Some(Self {
            uri,
            host,
            basic_auth,
        })
    }

    /// A `POST` of `body` here, its `Host` set, with room for `headers`
    /// more headers (a header map that grows reallocates its tables).
    pub fn post(&self, body: Bytes, headers: usize) -> http::Request<Full<Bytes>> {
        let mut request = http::Request::new(Full::new(body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = http::HeaderMap::with_capacity(headers + 2);
        let headers = request.headers_mut();
        headers.insert(http::header::HOST, self.host.clone());
        if let Some(auth) = &self.basic_auth {
            headers.insert(http::header::AUTHORIZATION, auth.clone());
        }
        request
    }
}

/// `Authorization: Basic` of `user` and `password`, sensitive (kept out
/// of debug output and of HTTP/2's header table).
fn basic(user: &str, password: Option<&str>) -> Option<http::HeaderValue> {
    use base64::Engine;
    let pair = format!("{user}:{}", password.unwrap_or_default());
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    let mut value = http::HeaderValue::try_from(format!("Basic {encoded}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// A URL's user name and password, percent-decoded; `None` when it has
/// neither (or they are not UTF-8).
fn user_info(url: &reqwest::Url) -> Option<(String, Option<String>)> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(String::from)
    };
    let user = decode(url.username())?;
    let password = url.password().and_then(decode);
    (!user.is_empty() || password.is_some()).then_some((user, password))
}

/// One pool of connections to every upstream, for one connect timeout.
#[derive(Clone)]
pub struct Transport {
    client: Client<hyper_rustls::HttpsConnector<Connector>, Full<Bytes>>,
    /// The environment's proxies; `None` when it names none.
    proxies: Option<Arc<Matcher>>,
}

/// Why a call failed before its answer's headers arrived.
#[derive(Debug)]
pub enum CallError {
    /// No connection (TCP, TLS or the proxy's tunnel): nothing was sent.
    Connect,
    /// The deadline passed first.
    Timeout,
    /// Any other failure (the connection closed without an answer).
    Other,
}

impl Transport {
    /// A pool whose connections must open within `connect_timeout`.
    /// Fails only when the system's roots cannot be read.
    pub fn new(connect_timeout: Duration) -> Result<Self, BoxError> {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let verifier = rustls_platform_verifier::Verifier::new(provider.clone())?;
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        // To an `https://` proxy: TLS without ALPN (the proxy speaks
        // HTTP/1.1; an `h2` there would be read as the upstream's).
        let mut to_proxy_tls = tls.clone();
        to_proxy_tls.alpn_protocols.clear();
        let to_proxy = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(to_proxy_tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http.clone());
        let proxies = Arc::new(Matcher::from_env());
        let named = [
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(Connector {
                http,
                to_proxy,
                proxies: proxies.clone(),
            });
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        Ok(Self {
            client,
            proxies: named.then_some(proxies),
        })
    }

    /// Sends `request`; its answer's headers, and then its body, must all
    /// arrive within `timeout` of now. The body comes back as reqwest's,
    /// the type the gateway's answer handling reads (wrapped, not
    /// converted: a reqwest `Response` would parse a URL per answer).
    pub async fn send(
        &self,
        mut request: http::Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<super::UpstreamResponse, CallError> {
        self.proxy_authorization(&mut request);
        let mut deadline = Box::pin(tokio::time::sleep_until(Instant::now() + timeout));
        let call = self.client.request(request);
        let answer = tokio::select! {
            biased;
            answer = call => answer,
            () = deadline.as_mut() => return Err(CallError::Timeout),
        };
        let answer = answer.map_err(|e| {
            if e.is_connect() {
                CallError::Connect
            } else {
                CallError::Other
            }
        })?;
        let (parts, body) = answer.into_parts();
        let body = reqwest::Body::wrap(Deadline {
            body,
            deadline,
            unchecked: 0,
        });
        Ok(http::Response::from_parts(parts, body))
    }

    /// A forward proxy of plain HTTP sees the request itself, so its
    /// credentials go in a header (a tunnel's go in its `CONNECT`).
    fn proxy_authorization(&self, request: &mut http::Request<Full<Bytes>>) {
        if request.uri().scheme() != Some(&http::uri::Scheme::HTTP) {
            return;
        }
        let Some(proxies) = &self.proxies else {
            return;
        };
        if let Some(auth) = proxies
            .intercept(request.uri())
            .and_then(|i| i.basic_auth().cloned())
        {
            request
                .headers_mut()
                .insert(http::header::PROXY_AUTHORIZATION, auth);
        }
    }
}

/// Opens a connection to an upstream: directly, through the proxy's
/// `CONNECT` tunnel (TLS upstreams), or to the proxy itself (plain HTTP
/// upstreams, marked so that hyper sends the absolute URI).
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    /// To a proxy: plain for an `http://` proxy URL, TLS for `https://`.
    to_proxy: hyper_rustls::HttpsConnector<HttpConnector>,
    proxies: Arc<Matcher>,
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: http::Uri) -> Self::Future {
        let (mut http, mut to_proxy) = (self.http.clone(), self.to_proxy.clone());
        let proxy = self.proxies.intercept(&dst);
        Box::pin(async move {
            let Some(proxy) = proxy else {
                let io = tower_service::Service::call(&mut http, dst).await?;
                return Ok(Conn {
                    io: MaybeHttpsStream::Http(io),
                    proxied: false,
                });
            };
            if !matches!(proxy.uri().scheme_str(), Some("http" | "https")) {
                // SOCKS URLs match too; this client speaks HTTP to proxies.
                return Err("the proxy's scheme is not http or https".into());
            }
            if dst.scheme() == Some(&http::uri::Scheme::HTTPS) {
                let mut tunnel = Tunnel::new(proxy.uri().clone(), to_proxy);
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                let io = tower_service::Service::call(&mut tunnel, dst).await?;
                return Ok(Conn { io, proxied: false });
            }
            let io = tower_service::Service::call(&mut to_proxy, proxy.uri().clone()).await?;
            Ok(Conn { io, proxied: true })
        })
    }
}

/// A TCP connection to the upstream, to a forward proxy or through a
/// proxy's tunnel; TLS when the proxy's URL is `https://` (the
/// upstream's own TLS goes on top, in [`Transport`]'s connector).
pub struct Conn {
    io: MaybeHttpsStream<TokioIo<TcpStream>>,
    proxied: bool,
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.proxied)
    }
}

impl Read for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

/// An answer's body under the call's deadline: past it, a read fails
/// with [`io::ErrorKind::TimedOut`] (which reqwest's `is_timeout` finds,
/// and the stream relay reads as the request's time limit).
struct Deadline {
    body: hyper::body::Incoming,
    deadline: Pin<Box<Sleep>>,
    /// Frames read since the timer was last looked at.
    unchecked: u8,
}

/// Most frames read in a row without looking at the timer.
const CHECK_EVERY_FRAMES: u8 = 8;

fn timed_out() -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    Poll::Ready(Some(Err(Box::new(io::Error::new(
        io::ErrorKind::TimedOut,
        "the upstream call reached its timeout",
    )))))
}

impl Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // The timer is looked at when the body must wait, and every few
        // frames of one that never does: a stream's events then cost no
        // timer poll each (the relay keeps the request's own time limit).
        self.unchecked += 1;
        if self.unchecked >= CHECK_EVERY_FRAMES {
            self.unchecked = 0;
            if self.deadline.as_mut().poll(cx).is_ready() {
                return timed_out();
            }
        }
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending if self.deadline.as_mut().poll(cx).is_ready() => timed_out(),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `Host` a call sends is what hyper's client would have
    /// written: the host and a port that is not the scheme's own, never
    /// user info.
    #[test]
    fn an_endpoint_s_host_header_is_host_and_non_default_port() {
        let host = |text: &str| {
            let e = Endpoint::parse(text).expect("an endpoint");
            let request = e.post(Bytes::new(), 0);
            assert_eq!(request.uri(), &e.uri);
            assert_eq!(request.method(), http::Method::POST);
            request.headers()[http::header::HOST]
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            host("http://127.0.0.1:8080/v1/chat/completions"),
            "127.0.0.1:8080"
        );
        assert_eq!(
            host("https://api.openai.com:443/v1/responses"),
            "api.openai.com"
        );
        assert_eq!(host("http://example.com:80/v1"), "example.com");
        assert_eq!(
            host("https://user:secret@example.com:8443/v1"),
            "example.com:8443"
        );
        assert_eq!(host("http://[::1]:9000/v1"), "[::1]:9000");
        // User info goes as basic auth, never in the URI.
        let e = Endpoint::parse("https://us%40er:pa%3Ass@example.com/v1").unwrap();
        let request = e.post(Bytes::new(), 0);
        assert_eq!(request.uri().to_string(), "https://example.com/v1");
        // base64("us@er:pa:ss")
        assert_eq!(
            request.headers()[http::header::AUTHORIZATION],
            "Basic dXNAZXI6cGE6c3M="
        );
        let plain = Endpoint::parse("http://example.com/v1")
            .unwrap()
            .post(Bytes::new(), 0);
        assert!(plain.headers().get(http::header::AUTHORIZATION).is_none());
        assert_eq!(host("https://EXAMPLE.com/v1"), "example.com");
        assert!(Endpoint::parse("not a url").is_none());
    }
}
