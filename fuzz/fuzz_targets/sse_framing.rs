//! SSE framing: any bytes, split anywhere, give the same frames as in one
//! read; frames are the input's own bytes, in order; parsing never panics.
#![no_main]

use budgetgate::upstreams::sse::{parse_frame, FrameSplitter};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fn frames(pieces: &[&[u8]]) -> Vec<Bytes> {
    let mut s = FrameSplitter::new();
    let mut out = Vec::new();
    for p in pieces {
        out.extend(s.push(p));
    }
    out.extend(s.finish());
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&step, input)) = data.split_first() else {
        return;
    };
    let whole = frames(&[input]);
    let step = usize::from(step % 13) + 1;
    let pieces: Vec<&[u8]> = input.chunks(step).collect();
    assert_eq!(frames(&pieces), whole, "the split changed the frames");
    // Every frame but the last is a slice of the input, in order; the last
    // (completed at end of stream) starts with what was left.
    let mut at = 0;
    for (i, f) in whole.iter().enumerate() {
        let rest = &input[at..];
        if i + 1 < whole.len() || rest.starts_with(f) {
            assert!(rest.starts_with(f), "frame {i} is not the input's bytes");
            at += f.len();
        } else {
            assert!(f.starts_with(rest), "the last frame lost bytes");
            at = input.len();
        }
        let _ = parse_frame(f);
    }
    assert_eq!(at, input.len(), "bytes were lost");
});
