//! The body's endings when the client goes away, and its batching.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::oneshot;

use super::*;
use crate::admission::stream_cutoffs::{StreamCutoffs, SLACK};
use crate::config::estimate::Encoding;
use crate::dialects::{Dialect, UsageBreakdown};

/// A meter whose first extension waits for the test's answer; what it
/// did, in order, is logged.
struct GatedMeter {
    gate: Option<oneshot::Receiver<Extension>>,
    log: Arc<Mutex<Vec<String>>>,
    cutoffs: Option<StreamCutoffs>,
}

impl Meter for GatedMeter {
    fn id(&self) -> &str {
        "gated"
    }

    async fn extend(&mut self, tokens: u64) -> Extension {
        self.log.lock().unwrap().push(format!("extend {tokens}"));
        let answer = match self.gate.take() {
            Some(gate) => gate
                .await
                .unwrap_or(Extension::Failed("gate dropped".into())),
            None => Extension::Exhausted("no second extension".into()),
        };
        self.log
            .lock()
            .unwrap()
            .push(format!("answered {answer:?}"));
        answer
    }

    fn shutdown(&self) -> impl Future<Output = ()> + Send + 'static {
        std::future::pending()
    }

    fn stream_cutoffs(&self) -> Option<&StreamCutoffs> {
        self.cutoffs.as_ref()
    }

    fn settle(self, used: UsageBreakdown, ending: Ending) -> u64 {
        let output = used.output.unwrap_or(0);
        self.log
            .lock()
            .unwrap()
            .push(format!("settled {output} {ending}"));
        used.total()
    }
}

/// Ten one-word chat deltas, then an upstream that never ends.
fn upstream() -> crate::upstreams::UpstreamResponse {
    let frames = (0..10).map(|_| {
        Ok::<Bytes, std::io::Error>(Bytes::from_static(
            b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"}}]}\n\n",
        ))
    });
    let stream = futures_util::stream::iter(frames).chain(futures_util::stream::pending());
    axum::http::Response::new(reqwest::Body::wrap_stream(stream))
}

/// A reservation of 3 output tokens, extended by `step` (`None`: the
/// client's own cap, never extended).
fn relayed(
    gate: oneshot::Receiver<Extension>,
    log: Arc<Mutex<Vec<String>>>,
    step: Option<u64>,
) -> (
    RelayBody<GatedMeter, impl FnOnce(RelaySummary) + Send + Unpin + 'static>,
    oneshot::Receiver<RelaySummary>,
) {
    let proc = StreamProcessor::new(Dialect::ChatCompletions, Encoding::O200kBase, false, 1);
    let plan = ExtendPlan {
        reserved_output: 3,
        step,
        max_output: 100,
        input_tokens: 5,
        deadline: None,
    };
    let meter = GatedMeter {
        gate: Some(gate),
        log,
        cutoffs: None,
    };
    let (ended, summary) = oneshot::channel();
    let body = relay_body(upstream(), proc, meter, plan, move |s| {
        let _ = ended.send(s);
    });
    (body, summary)
}

/// Reads until the body waits (on the extension or the upstream);
/// returns the events delivered.
async fn read_until_waiting(body: &mut (impl http_body::Body<Data = Bytes> + Unpin)) -> usize {
    read_writes(body).await.1
}

/// Reads until the body waits: the frames (writes) and the events.
async fn read_writes(body: &mut (impl http_body::Body<Data = Bytes> + Unpin)) -> (usize, usize) {
    let (mut writes, mut events) = (0, 0);
    while let Ok(Some(frame)) = tokio::time::timeout(
        Duration::from_millis(100),
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)),
    )
    .await
    {
        let Ok(data) = frame
            .map_err(drop)
            .and_then(|f| f.into_data().map_err(drop))
        else {
            continue;
        };
        writes += 1;
        events += data.windows(6).filter(|w| w == b"data: ").count();
    }
    (writes, events)
}

// Time is paused: the timeouts below fire only when nothing else can
// run, so "the body waits" does not depend on the machine's speed.
#[tokio::test(start_paused = true)]
async fn a_client_gone_during_an_extension_settles_after_its_answer() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (grant, gate) = oneshot::channel();
    let (mut body, summary) = relayed(gate, log.clone(), Some(4));
    // Three one-token deltas reach the reservation of 3; the body waits
    // for the extension with the third delivered.
    assert_eq!(read_until_waiting(&mut body).await, 3);
    assert_eq!(*log.lock().unwrap(), ["extend 4"]);
    drop(body);
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "not settled before the extension answered"
    );
    grant.send(Extension::Granted(4)).unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(5), summary)
        .await
        .expect("settled")
        .expect("on_end called");
    assert_eq!(summary.ending, Ending::ClientGone);
    assert_eq!(
        *log.lock().unwrap(),
        ["extend 4", "answered Granted(4)", "settled 3 client_gone"]
    );
}

// Time is paused: the timeouts below fire only when nothing else can
// run, so "the body waits" does not depend on the machine's speed.
#[tokio::test(start_paused = true)]
async fn a_client_gone_between_frames_settles_at_once() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (grant, gate) = oneshot::channel();
    let (mut body, mut summary) = relayed(gate, log.clone(), Some(4));
    assert_eq!(read_until_waiting(&mut body).await, 3);
    grant.send(Extension::Granted(4)).unwrap();
    // Four more deltas fit the 7 reserved; the fifth asks again and is
    // refused: cut off with the finish chunk and [DONE].
    let rest = read_until_waiting(&mut body).await;
    assert_eq!(rest, 4 + 2);
    let ended = summary
        .try_recv()
        .expect("settled when the cutoff was decided");
    assert_eq!(ended.ending, Ending::CutOff);
    drop(body);
    assert_eq!(
        log.lock().unwrap().last().map(String::as_str),
        Some("settled 7 cut_off")
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    let (_grant, gate) = oneshot::channel();
    let (mut body, mut summary) = relayed(gate, log.clone(), None);
    // The ten events were read together: one write.
    assert_eq!(read_writes(&mut body).await, (1, 10));
    drop(body);
    assert_eq!(
        summary.try_recv().expect("settled in drop").ending,
        Ending::ClientGone
    );
    assert_eq!(*log.lock().unwrap(), ["settled 10 client_gone"]);
}

// A client that stops reading: the connection no longer polls the body,
// and the keeper of stream cutoffs ends it at its time limit all the same.
#[tokio::test(start_paused = true)]
async fn a_body_not_polled_is_cut_off_and_settled_at_its_time_limit() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (shutdown, cut) = tokio::sync::watch::channel(false);
    let cutoffs = StreamCutoffs::new(cut);
    let proc = StreamProcessor::new(Dialect::ChatCompletions, Encoding::O200kBase, false, 1);
    let start = tokio::time::Instant::now();
    let plan = ExtendPlan {
        reserved_output: 100,
        step: None,
        max_output: 100,
        input_tokens: 5,
        deadline: Some(start + Duration::from_secs(5)),
    };
    let meter = GatedMeter {
        gate: None,
        log: log.clone(),
        cutoffs: Some(cutoffs.clone()),
    };
    let (ended, summary) = oneshot::channel();
    let mut body = relay_body(upstream(), proc, meter, plan, move |s| {
        let _ = ended.send(s);
    });
    assert_eq!(cutoffs.live(), 1);
    assert_eq!(read_until_waiting(&mut body).await, 10);
    // Not polled from here on.
    let summary = tokio::time::timeout(Duration::from_secs(60), summary)
        .await
        .expect("cut off while not polled")
        .expect("on_end called");
    assert_eq!(summary.ending, Ending::TimeLimit);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(5) + SLACK,
        "cut at the time limit"
    );
    assert_eq!(*log.lock().unwrap(), ["settled 10 time_limit"]);
    // A client that reads again gets the clean ending.
    let (_, events) = read_writes(&mut body).await;
    assert_eq!(events, 2, "the finish chunk and [DONE]");
    assert!(http_body::Body::is_end_stream(&body));
    drop(body);
    assert_eq!(cutoffs.live(), 0);
    assert_eq!(log.lock().unwrap().len(), 1, "settled once");
    drop(shutdown);
}

// An upstream that sends one event without end: past the frame cap the
// stream ends with the truncation error, not a buffer growing without bound.
#[tokio::test(start_paused = true)]
async fn an_event_past_the_frame_cap_ends_the_stream_with_the_truncation_error() {
    let piece = Bytes::from(vec![b'x'; 16 * 1024]);
    let reads = std::iter::once(Bytes::from_static(b"data: "))
        .chain(std::iter::repeat_n(piece, 10_000_000 / (16 * 1024) + 1))
        .map(Ok::<Bytes, std::io::Error>);
    let stream = futures_util::stream::iter(reads).chain(futures_util::stream::pending());
    let upstream = axum::http::Response::new(reqwest::Body::wrap_stream(stream));
    let log = Arc::new(Mutex::new(Vec::new()));
    let meter = GatedMeter {
        gate: None,
        log: log.clone(),
        cutoffs: None,
    };
    let proc = StreamProcessor::new(Dialect::ChatCompletions, Encoding::O200kBase, false, 1);
    let plan = ExtendPlan {
        reserved_output: 100,
        step: None,
        max_output: 100,
        input_tokens: 5,
        deadline: None,
    };
    let (ended, mut summary) = oneshot::channel();
    let mut body = relay_body(upstream, proc, meter, plan, move |s| {
        let _ = ended.send(s);
    });
    let mut delivered = Vec::new();
    while let Ok(Some(Ok(frame))) = tokio::time::timeout(
        Duration::from_millis(100),
        std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx)),
    )
    .await
    {
        if let Ok(data) = frame.into_data() {
            delivered.extend_from_slice(&data);
        }
    }
    let text = String::from_utf8_lossy(&delivered);
    assert!(text.contains("upstream_stream_truncated"), "{text}");
    assert!(
        delivered.len() < 1024,
        "the oversized event is not forwarded"
    );
    assert_eq!(
        summary.try_recv().expect("settled").ending,
        Ending::UpstreamError
    );
    assert!(http_body::Body::is_end_stream(&body));
    assert_eq!(*log.lock().unwrap(), ["settled 0 upstream_error"]);
}
