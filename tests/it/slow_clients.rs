//! Clients that hold what they should not: a stream whose client stopped
//! reading, connections that never finish a request, more connections
//! than the process has file descriptors for.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;
use budgetgate::budget::BudgetName;
use serde_json::json;

/// A streamed chat request of `max_tokens` as `KEY`, as raw HTTP/1.1.
fn streamed_request(max_tokens: u64) -> Vec<u8> {
    let body = json!({"model": "gpt-4o-mini", "stream": true, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Tell a very long story."}]})
    .to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends a streamed request on a connection with a small receive window,
/// reads the response's first bytes, and returns the connection, never
/// read again: the gateway's writes stall once the socket buffers are full.
async fn stalled_stream(addr: std::net::SocketAddr, max_tokens: u64) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(addr).await.unwrap();
    conn.write_all(&streamed_request(max_tokens)).await.unwrap();
    let mut first = [0u8; 512];
    let n = conn.read(&mut first).await.unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off_at_the_time_limit_with_its_slot_free() {
    let mock = start_mock().await;
    // Far more than the socket buffers between the gateway and the client hold.
    mock.state.set_output_tokens(100_000);
    let mut config = TestConfig::standard(
        &mock.base_url(),
        32,
        limits().max_concurrent(1).tokens_per_day(100_000_000),
    );
    config.model("gpt-4o-mini").max_output_tokens = Some(100_000);
    config.server.max_request_secs = Some(5);
    let gw = config.start().await;
    let started = Instant::now();
    let _stalled = stalled_stream(gw.addr, 100_000).await;
    assert_eq!(
        post_hi(&gw, KEY).await,
        429,
        "the stream holds the tenant's one slot while it runs"
    );
    loop {
        let status = post_hi(&gw, KEY).await;
        if status == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "the slot is still taken {:?} after the request arrived (limit 5 s), status {status}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "freed at the time limit, not before: {:?}",
        started.elapsed()
    );
    gw.all_settled().await;
    let used = gw.t1_used(BudgetName::TokensPerDay).await;
    assert!(
        used < 100_000,
        "the stream settled what it delivered, not its reservation: {used}"
    );
}

/// The start of a request head, never finished.
const HALF_A_HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n";

/// Opens `n` connections to `addr` that send [`HALF_A_HEAD`] and nothing more.
async fn half_open(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = TcpStream::connect(addr).await.expect("connect");
        // The gateway may have closed it already (to make room).
        let _ = c.write_all(HALF_A_HEAD).await;
        conns.push(c);
    }
    conns
}

/// How many of `conns` the gateway has neither closed nor answered.
fn still_open(conns: &[TcpStream]) -> usize {
    conns
        .iter()
        .filter(|c| {
            let mut byte = [0u8; 1];
            matches!(c.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count()
}

/// Sends a keyed request every 50 ms until `stop`; panics on any answer
/// but 200 or one slower than 5 s; returns how many were answered.
fn keyed_requests(
    root: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut answered = 0;
        while !*stop.borrow() {
            let started = Instant::now();
            let status = post_hi(root.as_str(), KEY).await;
            assert_eq!(status, 200, "a keyed request during the attack");
            assert!(started.elapsed() < Duration::from_secs(5));
            answered += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        answered
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_are_bounded_and_timed_out_and_never_keep_a_keyed_request_out() {
    let mock = start_mock().await;
    let mut config = TestConfig::standard(&mock.base_url(), 32, limits());
    config.server.max_connections = Some(500);
    config.server.header_read_timeout_secs = Some(3);
    let dir = tempfile::tempdir().unwrap();
    // A process of its own: its connection gauge counts only these.
    let gw = GatewayProcess::start(&config.write(dir.path()), &[]).await;
    let addr: std::net::SocketAddr = gw.root.trim_start_matches("http://").parse().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let keyed = keyed_requests(gw.root.clone(), stop.clone());
    let most_open = {
        let root = gw.root.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut most = 0.0f64;
            while !*stop.borrow() {
                let open = sample_sum(
                    &scrape(root.as_str()).await,
                    "budgetgate_connections_open",
                    &[],
                );
                most = most.max(open);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            most
        })
    };
    let conns = half_open(addr, 2000).await;
    let opened = Instant::now();
    // Every one is closed within header_read_timeout_secs of its accept
    // (the last ones waited in the kernel's backlog).
    while still_open(&conns) > 0 {
        assert!(
            opened.elapsed() < Duration::from_secs(10),
            "{} of 2000 half-open connections still open",
            still_open(&conns)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send_replace(true);
    let answered = keyed.await.expect("every keyed request answered");
    assert!(answered > 0);
    let most = most_open.await.unwrap();
    assert!(
        most <= 500.0,
        "{most} connections open at once (max_connections = 500)"
    );
    let evicted = gw
        .metric(
            "budgetgate_connections_closed_total",
            &[("reason", "evicted")],
        )
        .await;
    let timed_out = gw
        .metric(
            "budgetgate_connections_closed_total",
            &[("reason", "header_timeout")],
        )
        .await;
    assert!(
        evicted + timed_out >= 2000.0,
        "{evicted} evicted, {timed_out} timed out"
    );
    assert!(
        evicted >= 1.0 && timed_out >= 1.0,
        "{evicted} evicted, {timed_out} timed out"
    );
}

/// The status of a keyed request to `gw` (5 s at most); on a failure,
/// the gateway's last log lines.
async fn keyed_status(gw: &GatewayProcess) -> u16 {
    match chat_request(gw, KEY, &hi(5))
        .timeout(Duration::from_secs(5))
        .send()
        .await
    {
        Ok(r) => r.status().as_u16(),
        Err(e) => {
            let logs = gw.dump_logs();
            let tail = &logs[logs.len().saturating_sub(4000)..];
            panic!("a keyed request failed: {e}; the gateway's last log lines:\n{tail}")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_recovers_after_running_out_of_file_descriptors() {
    let mock = start_mock().await;
    let mut config = TestConfig::standard(&mock.base_url(), 32, limits());
    // Above what 256 descriptors allow: accepting fails before the bound.
    config.server.max_connections = Some(1000);
    config.server.header_read_timeout_secs = Some(2);
    let dir = tempfile::tempdir().unwrap();
    let path = config.write(dir.path());
    let gw = GatewayProcess::start_with_file_limit(&path, &[], 256).await;
    let addr: std::net::SocketAddr = gw.root.trim_start_matches("http://").parse().unwrap();
    let started = Instant::now();
    let conns = half_open(addr, 400).await;
    gw.wait_log("accept error; retrying (logged at most once a second)", 1)
        .await;
    // Out of descriptors, the oldest connection without a request makes
    // room: a keyed client is answered all the same (502 when no
    // descriptor was left for the upstream connection or its client).
    let during = keyed_status(&gw).await;
    assert!(during == 200 || during == 502, "{during}");
    // The half-open ones time out; the listener serves after them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(keyed_status(&gw).await, 200);
    drop(conns);
    let elapsed = started.elapsed().as_secs();
    let logged = gw
        .logs_with("accept error; retrying (logged at most once a second)")
        .len() as u64;
    assert!(
        logged <= elapsed + 1,
        "{logged} accept errors logged in {elapsed} s"
    );
    let limit = gw.logs_with("client connections bounded");
    assert_eq!(
        limit[0]
            .pointer("/fields/file_limit")
            .and_then(serde_json::Value::as_str),
        Some("256"),
        "{limit:?}"
    );
}
