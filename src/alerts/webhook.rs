//! Webhook delivery: each firing is one JSON POST, signed with
//! HMAC-SHA-256 over the exact body bytes
//! (`x-budgetgate-signature: sha256=<hex>`), carrying its idempotency id
//! (`x-budgetgate-idempotency-id`, also the body's `id`). A delivery that
//! fails (no connection, a non-2xx answer) is retried with a doubling
//! pause (1 s up to 60 s) for up to `alerts.retry_for_secs`; firings wait
//! in a bounded queue meanwhile, one delivery at a time, oldest first.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use tokio::sync::mpsc;

use super::thresholds::Firing;
use crate::ledger::query::rfc3339;

/// The signature header.
pub const SIGNATURE: &str = "x-budgetgate-signature";
/// The idempotency header.
pub const IDEMPOTENCY_ID: &str = "x-budgetgate-idempotency-id";

/// Firings waiting for delivery at most; past it a firing is dropped (counted).
pub const QUEUE: usize = 1_000;

const RETRY_START: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// `sha256=<hex>` of HMAC-SHA-256 of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC takes a key of any length: this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The JSON body of `f`, fired at `now` (UTC µs).
pub fn body(f: &Firing, now: u64) -> Vec<u8> {
    let unit = if f.budget.starts_with("usd_") {
        "usd_micros"
    } else if f.budget.starts_with("requests_") {
        "requests"
    } else {
        "tokens"
    };
    json!({
        "id": f.id,
        "type": "budget.threshold_reached",
        "threshold_percent": f.threshold_percent,
        "scope": f.scope,
        "tenant": f.tenant,
        "budget": f.budget,
        "unit": unit,
        "limit": f.limit,
        "used": f.used,
        "window": f.window,
        "window_start": rfc3339(f.window_start_micros),
        "window_end": rfc3339(f.window_end_micros),
        "fired_at": rfc3339(now),
    })
    .to_string()
    .into_bytes()
}

/// The sender's end of the delivery queue.
#[derive(Clone)]
pub struct Deliveries {
    tx: mpsc::Sender<(String, Vec<u8>)>,
}

impl Deliveries {
    /// Starts the delivery task to `url`, signing with `secret`, retrying
    /// each firing for `retry_for`.
    pub fn spawn(
        url: String,
        secret: Vec<u8>,
        retry_for: Duration,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<(String, Vec<u8>)>(QUEUE);
        // A connection per delivery: alerts are rare, and a kept-alive
        // connection would outlive the receiver restart it should notice.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(0)
            .build()
            .unwrap_or_default();
        let task = tokio::spawn(async move {
            while let Some((id, body)) = rx.recv().await {
                deliver(&client, &url, &secret, &id, body, retry_for).await;
            }
        });
        (Self { tx }, task)
    }

    /// Queues a firing; false (and counted) when the queue is full.
    pub fn send(&self, id: String, body: Vec<u8>) -> bool {
        match self.tx.try_send((id, body)) {
            Ok(()) => true,
            Err(_) => {
                crate::metrics::alert_delivery("dropped");
                false
            }
        }
    }
}

async fn deliver(
    client: &reqwest::Client,
    url: &str,
    secret: &[u8],
    id: &str,
    body: Vec<u8>,
    retry_for: Duration,
) {
    let sig = signature(secret, &body);
    let deadline = tokio::time::Instant::now() + retry_for;
    let mut pause = RETRY_START;
    loop {
        let sent = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE, &sig)
            .header(IDEMPOTENCY_ID, id)
            .body(body.clone())
            .send()
            .await;
        let why = match sent {
            Ok(r) if r.status().is_success() => {
                crate::metrics::alert_delivery("delivered");
                tracing::info!(alert_id = id, "budget alert delivered");
                return;
            }
            Ok(r) => format!("status {}", r.status().as_u16()),
            // Never the error's own text: it holds the URL, which is a
            // Slack-style hook's secret.
            Err(e) => crate::upstreams::redact::send_error(&e),
        };
        let webhook = crate::upstreams::redact::endpoint(url);
        if tokio::time::Instant::now() + pause > deadline {
            crate::metrics::alert_delivery("given_up");
            tracing::error!(alert_id = id, %webhook, error = %why, "budget alert not delivered; given up");
            return;
        }
        crate::metrics::alert_delivery("retried");
        tracing::warn!(alert_id = id, %webhook, error = %why, retry_in_ms = pause.as_millis() as u64, "budget alert not delivered; retrying");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RETRY_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_rfc_4231_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
