//! The burst client: opens every connection first, then writes every
//! request (one task, back to back), then reads each answer to its end
//! (HTTP/1.1, `connection: close`). A burst's *spread* is the time from
//! the first byte written to the last request written; its *window* from
//! the first byte written to the last answer read: every admission of the
//! burst was decided inside the window.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// One request of a burst.
#[derive(Clone, Debug)]
pub struct Req {
    /// `host:port` of the gateway.
    pub addr: String,
    pub path: String,
    /// Extra headers (the key, the mock's tenant, …).
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Req {
    fn bytes(&self) -> Vec<u8> {
        let mut s = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            self.path,
            self.addr,
            self.body.len()
        );
        for (k, v) in &self.headers {
            s.push_str(&format!("{k}: {v}\r\n"));
        }
        s.push_str("\r\n");
        s.push_str(&self.body);
        s.into_bytes()
    }
}

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An HTTP status; `cut` when a streamed answer ended with the
    /// gateway's cutoff (`finish_reason: "length"` / `max_tokens`).
    Status { code: u16, cut: bool },
    /// No connection, or no answer (a killed gateway).
    Failed,
}

/// What a burst did.
#[derive(Clone, Debug, Default)]
pub struct Burst {
    pub outcomes: Vec<Outcome>,
    pub spread_ms: f64,
    pub window_ms: f64,
    /// Each burst's spread (several when merged).
    pub spreads: Vec<f64>,
    /// When the first byte was written.
    pub started: Option<Instant>,
}

impl Burst {
    pub fn count(&self, code: u16) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Status { code: c, .. } if *c == code))
            .count()
    }

    pub fn cut(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Status { cut: true, .. }))
            .count()
    }

    pub fn failed(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| **o == Outcome::Failed)
            .count()
    }

    /// Statuses other than 200 and 429.
    pub fn other(&self) -> usize {
        self.outcomes.len() - self.count(200) - self.count(429) - self.failed()
    }
}

/// Runs one burst (answers are awaited at most `limit`).
pub async fn burst(reqs: &[Req], limit: Duration) -> Burst {
    let conns = futures_util::future::join_all(
        reqs.iter()
            .map(|r| async move { TcpStream::connect(&r.addr).await.ok() }),
    )
    .await;
    let bytes: Vec<Vec<u8>> = reqs.iter().map(Req::bytes).collect();
    let started = Instant::now();
    let mut readers = Vec::with_capacity(reqs.len());
    for (conn, b) in conns.into_iter().zip(&bytes) {
        let Some(mut s) = conn else {
            readers.push(None);
            continue;
        };
        if s.write_all(b).await.is_err() {
            readers.push(None);
            continue;
        }
        readers.push(Some(tokio::spawn(async move {
            let mut buf = Vec::new();
            let read = tokio::time::timeout(limit, s.read_to_end(&mut buf)).await;
            (read.is_ok_and(|r| r.is_ok()), buf, Instant::now())
        })));
    }
    let spread_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut outcomes = Vec::with_capacity(reqs.len());
    let mut last = started;
    for r in readers {
        let Some(task) = r else {
            outcomes.push(Outcome::Failed);
            continue;
        };
        let Ok((complete, buf, at)) = task.await else {
            outcomes.push(Outcome::Failed);
            continue;
        };
        last = last.max(at);
        outcomes.push(parse(&buf, complete));
    }
    Burst {
        outcomes,
        spreads: vec![spread_ms],
        spread_ms,
        window_ms: (last - started).as_secs_f64() * 1e3,
        started: Some(started),
    }
}

/// One request on a connection of its own, and when it was written and
/// answered: an open-loop load sends each request as its own task, so a
/// request that waits on a failing store delays no other.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    pub outcome: Outcome,
    pub sent: Instant,
    pub answered: Instant,
}

pub async fn one(req: &Req, limit: Duration) -> Timed {
    let sent = Instant::now();
    let failed = |answered| Timed {
        outcome: Outcome::Failed,
        sent,
        answered,
    };
    let Ok(mut s) = TcpStream::connect(&req.addr).await else {
        return failed(Instant::now());
    };
    if s.write_all(&req.bytes()).await.is_err() {
        return failed(Instant::now());
    }
    let mut buf = Vec::new();
    let read = tokio::time::timeout(limit, s.read_to_end(&mut buf)).await;
    Timed {
        outcome: parse(&buf, read.is_ok_and(|r| r.is_ok())),
        sent,
        answered: Instant::now(),
    }
}

fn parse(buf: &[u8], complete: bool) -> Outcome {
    let head = String::from_utf8_lossy(&buf[..buf.len().min(32)]);
    let Some(code) = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse::<u16>().ok())
    else {
        return Outcome::Failed;
    };
    if !complete && code == 200 {
        return Outcome::Failed;
    }
    let text = String::from_utf8_lossy(buf);
    let cut = code == 200
        && (text.contains("\"finish_reason\":\"length\"")
            || text.contains("\"stop_reason\":\"max_tokens\""));
    Outcome::Status { code, cut }
}

/// Bursts of `reqs(i)` back to back until `run` has passed since the first;
/// `between` waits between two.
pub async fn waves(
    run: Duration,
    between: Duration,
    mut reqs: impl FnMut(usize) -> Vec<Req>,
    limit: Duration,
) -> Vec<Burst> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut i = 0;
    while t0.elapsed() < run {
        out.push(burst(&reqs(i), limit).await);
        i += 1;
        tokio::time::sleep(between).await;
    }
    out
}

/// The first byte of the first burst to the last answer of the last.
pub fn window_ms(bursts: &[Burst]) -> f64 {
    let Some(t0) = bursts.iter().filter_map(|b| b.started).min() else {
        return 0.0;
    };
    bursts
        .iter()
        .filter_map(|b| {
            b.started
                .map(|s| (s - t0).as_secs_f64() * 1e3 + b.window_ms)
        })
        .fold(0.0, f64::max)
}

/// Adds up the outcomes of several bursts.
pub fn merged(bursts: &[Burst]) -> Burst {
    Burst {
        outcomes: bursts.iter().flat_map(|b| b.outcomes.clone()).collect(),
        spread_ms: bursts.iter().map(|b| b.spread_ms).fold(0.0, f64::max),
        spreads: bursts.iter().flat_map(|b| b.spreads.clone()).collect(),
        window_ms: window_ms(bursts),
        started: bursts.iter().filter_map(|b| b.started).min(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_read_by_its_status_and_a_cutoff_by_its_finish_reason() {
        let ok = b"HTTP/1.1 200 OK\r\n\r\ndata: {\"choices\":[{\"finish_reason\":\"length\"}]}\n\n";
        assert_eq!(
            parse(ok, true),
            Outcome::Status {
                code: 200,
                cut: true
            }
        );
        assert_eq!(
            parse(b"HTTP/1.1 429 Too Many Requests\r\n\r\n{}", true),
            Outcome::Status {
                code: 429,
                cut: false
            }
        );
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\n\r\n{", false), Outcome::Failed);
        assert_eq!(parse(b"", true), Outcome::Failed);
    }
}
