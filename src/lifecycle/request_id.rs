//! The request id: named once, when the request arrives (before
//! authentication, so a refusal has one too), and the same on the
//! response's request-id header, upstream and in the final log line.
//!
//! It is the client's own id when it sent a usable one, else a
//! gateway-generated UUIDv7 that the request's first reservation reuses
//! (one id to generate, and the id a user sees is the reservation's). A
//! client-chosen id never names a reservation: it could replay another
//! admission. Kept as a header value: the response, the upstream request
//! and the log all read the one copy.
//!
//! A generated id says the key layout its reservations are made in
//! ([`placement::layout_of_reservation`]): a UUIDv7 in the `single`
//! layout, the same bits as version 8 in the `tenant` layout, so a hold
//! settles in the layout it was made in whichever gateway handles it.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::authenticate;
use crate::budget::placement::{self, Layout};
use crate::dialects::KeyHeader;

/// The id of one request.
#[derive(Clone)]
pub struct RequestId {
    value: HeaderValue,
    /// Generated here (not the client's): a reservation may take it.
    generated: bool,
    /// The key layout this gateway reserves in (`store.layout`), which
    /// every id it generates says.
    layout: Layout,
}

tokio::task_local! {
    /// The id of the request a task serves, with its header name, for the
    /// one answer given outside the handler: the 503 of a request still
    /// running when the shutdown grace period ends
    /// (`server::end_at_shutdown_cutoff`), whose dropped handler logs the
    /// same id.
    static ARRIVED: Published;
}

/// Where a task's request publishes its id header.
pub type Published = std::cell::Cell<Option<(HeaderName, HeaderValue)>>;

/// A handler run with a place for its request's id ([`published`] reads it).
pub type Scoped<F> = tokio::task::futures::TaskLocalFuture<Published, F>;

/// `handler` with a place for its request's id.
pub fn scope<F: std::future::Future>(handler: F) -> Scoped<F> {
    ARRIVED.scope(Published::new(None), handler)
}

/// What the request a [`scope`] served published: its id header.
pub fn published<F: std::future::Future>(
    scope: std::pin::Pin<&mut Scoped<F>>,
) -> Option<(HeaderName, HeaderValue)> {
    scope.take_value().and_then(Published::into_inner)
}

/// Longest client id kept; a longer one is replaced.
const MAX_CLIENT_ID: usize = 128;

impl RequestId {
    /// The id of a request that arrived with `headers`: the client's in
    /// `name` if it is short printable ASCII and holds no key presented in
    /// `key_headers`, else a new one.
    pub fn arrived(headers: &HeaderMap, name: HeaderName, key_headers: &[KeyHeader]) -> Self {
        Self::arrived_in(headers, name, key_headers, Layout::Single)
    }

    /// [`Self::arrived`] at a gateway reserving in `layout`: the ids it
    /// generates say that layout.
    pub fn arrived_in(
        headers: &HeaderMap,
        name: HeaderName,
        key_headers: &[KeyHeader],
        layout: Layout,
    ) -> Self {
        let id = Self::of_arrival(headers, &name, key_headers, layout);
        // Outside a `scope` (tests calling the lifecycle directly) there is
        // nowhere to publish, and nothing answers outside the handler.
        let _ = ARRIVED.try_with(|c| c.set(Some((name, id.value.clone()))));
        id
    }

    fn of_arrival(
        headers: &HeaderMap,
        name: &HeaderName,
        key_headers: &[KeyHeader],
        layout: Layout,
    ) -> Self {
        let Some(value) = headers.get(name).and_then(client_id) else {
            return Self::generated_in(layout);
        };
        // A client that sent its key as its request id: the id goes
        // upstream, back to the client and into the log; the key never does.
        let holds = key_headers.iter().any(|h| {
            authenticate::presented(h, headers).is_some_and(|k| holds_key(value.as_bytes(), k))
        });
        if holds {
            tracing::warn!("a client request id holding a gateway key was replaced");
            return Self::generated_in(layout);
        }
        Self {
            value,
            generated: false,
            layout,
        }
    }

    /// A new gateway-generated id (`single` layout).
    pub fn generated() -> Self {
        Self::generated_in(Layout::Single)
    }

    /// A new gateway-generated id of a gateway reserving in `layout`.
    pub fn generated_in(layout: Layout) -> Self {
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let text = encode_new_id(&mut buf, layout);
        Self {
            value: HeaderValue::from_str(text).unwrap_or(HeaderValue::from_static("")),
            generated: true,
            layout,
        }
    }

    /// The id as text (for the log line).
    pub fn as_str(&self) -> &str {
        // Only visible ASCII is ever stored, so this never fails.
        self.value.to_str().unwrap_or("")
    }

    /// The id as a header value (a reference-counted copy).
    pub fn header(&self) -> HeaderValue {
        self.value.clone()
    }

    /// The id of a reservation of this request: the request's own for its
    /// first reservation when the gateway generated it, else a new one.
    pub fn reservation_id(&self, first: bool) -> String {
        if first && self.generated {
            self.as_str().to_owned()
        } else {
            new_id(self.layout)
        }
    }
}

/// True if `value` contains `key` (a non-empty key), e.g. `Bearer <key>`.
pub fn holds_key(value: &[u8], key: &str) -> bool {
    let key = key.as_bytes();
    !key.is_empty() && value.windows(key.len()).any(|w| w == key)
}

/// A client's id `v`, if it is short printable ASCII (surrounding blanks dropped).
fn client_id(v: &HeaderValue) -> Option<HeaderValue> {
    let text = v.to_str().ok()?;
    let trimmed = text.trim();
    let usable = !trimmed.is_empty()
        && trimmed.len() <= MAX_CLIENT_ID
        && trimmed.bytes().all(|b| b.is_ascii_graphic());
    if !usable {
        None
    } else if trimmed.len() == text.len() {
        // The value as received: a reference-counted copy, no allocation.
        Some(v.clone())
    } else {
        HeaderValue::from_str(trimmed).ok()
    }
}

/// A new id of `layout` (a UUIDv7, or its version-8 form).
fn new_id(layout: Layout) -> String {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    encode_new_id(&mut buf, layout).to_owned()
}

/// A new id of `layout`, hyphenated into `buf` (no formatting machinery,
/// no allocation; the mark is one byte changed).
fn encode_new_id(buf: &mut [u8; uuid::fmt::Hyphenated::LENGTH], layout: Layout) -> &str {
    let bytes = placement::mark_reservation(*uuid::Uuid::now_v7().as_bytes(), layout);
    uuid::Uuid::from_bytes(bytes).hyphenated().encode_lower(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialects::Dialect;

    fn with(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    fn arrived(h: &HeaderMap) -> RequestId {
        let d = Dialect::ChatCompletions;
        RequestId::arrived(h, d.request_id_header(), d.key_headers())
    }

    #[test]
    fn a_usable_client_id_is_kept_and_never_names_a_reservation() {
        let h = with("x-request-id", " trace-1 ");
        let id = arrived(&h);
        assert_eq!(id.as_str(), "trace-1");
        assert_ne!(id.reservation_id(true), "trace-1");
    }

    #[test]
    fn without_a_usable_client_id_one_is_generated_and_the_first_reservation_reuses_it() {
        for h in [
            HeaderMap::new(),
            with("x-request-id", "has space"),
            with("x-request-id", &"a".repeat(129)),
        ] {
            let id = arrived(&h);
            assert_eq!(id.as_str().len(), 36, "{:?}", id.as_str());
            assert_eq!(id.reservation_id(true), id.as_str());
            assert_ne!(id.reservation_id(false), id.as_str(), "a retry has its own");
        }
    }

    #[test]
    fn generated_ids_say_the_layout_they_reserve_in() {
        let d = Dialect::ChatCompletions;
        for layout in [Layout::Single, Layout::Tenant] {
            for h in [HeaderMap::new(), with("x-request-id", "trace-3")] {
                let id = RequestId::arrived_in(&h, d.request_id_header(), d.key_headers(), layout);
                for first in [true, false] {
                    let r = id.reservation_id(first);
                    assert_eq!(placement::layout_of_reservation(&r), layout, "{r}");
                    let v = uuid::Uuid::parse_str(&r).expect("a UUID");
                    let want = if layout == Layout::Tenant { 8 } else { 7 };
                    assert_eq!(v.get_version_num(), want, "{r}");
                }
            }
        }
    }

    #[test]
    fn a_client_id_holding_the_key_is_replaced() {
        for sent in ["sk-secret", "Bearer sk-secret", "x-sk-secret-y"] {
            let mut h = with("x-request-id", sent);
            h.insert(
                "authorization",
                HeaderValue::from_static("Bearer sk-secret"),
            );
            let id = arrived(&h);
            assert!(!id.as_str().contains("sk-secret"), "{sent}");
            assert_eq!(id.as_str().len(), 36);
        }
        let mut h = with("x-request-id", "trace-2");
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer sk-secret"),
        );
        let id = arrived(&h);
        assert_eq!(id.as_str(), "trace-2");
    }
}
