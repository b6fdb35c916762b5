//! One dialect's stream processing on hostile upstream bytes: never a
//! panic; whatever it relays, its cutoff and usage frames are well-formed
//! JSON events; no choice is relayed past its enforced cap + tolerance.

use budgetgate::dialects::Dialect;
use budgetgate::config::estimate::Encoding;
use budgetgate::upstreams::relay::{FrameAction, StreamProcessor};
use budgetgate::upstreams::sse::FrameSplitter;

fn assert_event(frame: &[u8]) {
    let text = std::str::from_utf8(frame).expect("gateway frames are UTF-8");
    let data = text
        .strip_prefix("data: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .expect("one data line");
    if data != "[DONE]" {
        let v: serde_json::Value = serde_json::from_str(data).expect("JSON event");
        assert!(v["choices"].is_array(), "a chunk has choices");
    }
}

pub fn run(dialect: Dialect, data: &[u8]) {
    let [flags, cap, step, rest @ ..] = data else {
        return;
    };
    let wants_usage = flags & 1 != 0;
    let choices = 1 + u64::from((flags >> 1) & 3);
    let cap = (flags & 8 != 0).then_some(u64::from(*cap));
    let mut proc = StreamProcessor::new(dialect, Encoding::O200kBase, wants_usage, choices)
        .with_limits(11, cap);
    let mut splitter = FrameSplitter::new();
    let mut relayed = 0usize;
    let mut take = |frame, proc: &mut StreamProcessor| {
        if proc.is_done() || proc.is_over_cap() {
            return;
        }
        if let FrameAction::Forward(b) = proc.on_frame(frame) {
            relayed += b.len();
        }
    };
    for piece in rest.chunks(usize::from(step % 29) + 1) {
        for f in splitter.push(piece) {
            take(f, &mut proc);
        }
    }
    if let Some(f) = splitter.finish() {
        take(f, &mut proc);
    }
    let _ = relayed;
    let used = proc.used(11);
    assert!(used.total() >= 11 || proc.usage().is_some());
    for f in proc.cutoff_frames(11) {
        assert_event(&f);
    }
    if let Some(f) = proc.gateway_usage_frame() {
        assert_event(&f);
    }
    let closing = proc.closing_frames();
    let text = std::str::from_utf8(&closing).expect("UTF-8");
    for frame in text.split_inclusive("\n\n") {
        assert_event(frame.as_bytes());
    }
}
