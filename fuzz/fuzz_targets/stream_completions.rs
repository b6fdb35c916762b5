//! The completions dialect's stream processing on hostile upstream bytes.
#![no_main]

#[path = "common/stream.rs"]
mod stream;

use budgetgate::dialects::Dialect;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| stream::run(Dialect::Completions, data));
