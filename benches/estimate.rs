//! Estimation micro-benchmarks: chat bodies of 1 KB, 32 KB and
//! 400 KB, cold (every string new) and warm (the large system prompt seen
//! before, a new user message), next to raw `encode_ordinary` of the same
//! text measured in the same run.
//!
//! `cargo bench --bench estimate` runs criterion (µs per request, bytes/s)
//! and then prints a summary measured with interleaved runs (less
//! sensitive to a noisy, shared machine): the cold / raw throughput ratio
//! (target ≥ 0.8) and the warm cost beyond counting the uncached bytes at
//! raw speed (target ≤ 20 µs). Under `cargo test --all-targets` each
//! benchmark runs once and the summary is skipped.

use std::hint::black_box;
use std::time::{Duration, Instant};

use budgetgate::config::estimate::{Encoding, EstimateSettings};
use budgetgate::dialects::Dialect;
use budgetgate::estimate::{estimate, ModelEstimation};
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use serde_json::{json, Value};

const SIZES: [(&str, usize); 3] = [("1KB", 1024), ("32KB", 32 * 1024), ("400KB", 400 * 1024)];
const ENC: Encoding = Encoding::O200kBase;

fn model() -> ModelEstimation {
    ModelEstimation {
        encoding: ENC,
        default_max_output_tokens: 1024,
        max_output_tokens: Some(16384),
        min_output_tokens: 16,
        token_ratio: 1000,
        image: budgetgate::config::estimate::ImageCost::flat(1536),
    }
}

/// Deterministic mixed prose, code and JSON, about `len` bytes.
fn text(len: usize, seed: u64) -> String {
    const PROSE: &[&str] = &[
        "The",
        "gateway",
        "reserves",
        "tokens",
        "before",
        "forwarding",
        "each",
        "request,",
        "and",
        "settles",
        "the",
        "real",
        "usage",
        "afterwards.",
        "Budgets",
        "are",
        "shared",
        "by",
        "tenants;",
        "a",
        "refusal",
        "names",
        "the",
        "limit",
        "that",
        "refused.",
        "Ünïcödé",
        "naïve",
        "café",
        "—",
        "über",
        "日本語の",
        "テキスト",
        "🚀",
    ];
    const CODE: &[&str] = &[
        "fn reserve(&self, req: &ReserveRequest) -> Result<Outcome, Error> {\n",
        "    let level = bucket.level.saturating_sub(cost);\n",
        "    if level < 0 { return Err(Denied { retry_after_ms: 250 }); }\n",
        "}\n",
        "for (i, msg) in enumerate(messages):\n    total += count(msg['content'])\n",
    ];
    const JSON: &[&str] = &[
        r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}"#,
        r#"[{"id": 17, "score": 0.93, "tags": ["a", "b"]}, {"id": 18, "score": 0.12, "tags": []}]"#,
    ];
    let mut s = String::with_capacity(len + 256);
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    while s.len() < len {
        match next() % 10 {
            0 => s.push_str(CODE[next() % CODE.len()]),
            1 => {
                s.push_str(JSON[next() % JSON.len()]);
                s.push('\n');
            }
            _ => {
                for _ in 0..(5 + next() % 15) {
                    s.push_str(PROSE[next() % PROSE.len()]);
                    s.push(' ');
                }
                s.push_str(if next() % 4 == 0 { ".\n\n" } else { ". " });
            }
        }
    }
    while s.len() > len {
        s.pop();
    }
    s
}

struct Case {
    system: String,
    user: String,
}

impl Case {
    fn new(size: usize) -> Case {
        let user_len = 240.min(size / 4);
        Case {
            // JSON framing adds about 120 bytes.
            system: text(size - user_len - 120, 1),
            user: text(user_len, 2),
        }
    }

    fn body(&self, system_nonce: Option<u64>, user_nonce: Option<u64>) -> Value {
        let system = match system_nonce {
            Some(n) => format!("Request {n}. {}", self.system),
            None => self.system.clone(),
        };
        let user = match user_nonce {
            Some(n) => format!("Question {n}: {}", self.user),
            None => self.user.clone(),
        };
        json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "max_tokens": 256,
        })
    }

    fn body_len(&self) -> u64 {
        serde_json::to_vec(&self.body(None, None)).unwrap().len() as u64
    }

    fn all_text(&self) -> String {
        format!("{}{}", self.system, self.user)
    }
}

fn est(body: &Value) -> u64 {
    estimate(
        Dialect::ChatCompletions,
        body,
        &model(),
        &EstimateSettings::default(),
        budgetgate::estimate::TokenRoom::default(),
    )
    .unwrap()
    .input_tokens
}

fn raw(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

fn benches(c: &mut Criterion) {
    budgetgate::estimate::warm_up();
    let mut nonce = 0u64;
    for (name, size) in SIZES {
        let case = Case::new(size);
        let body_len = case.body_len();
        let all = case.all_text();
        let mut g = c.benchmark_group(format!("estimate/{name}"));
        if size > 100_000 {
            g.sample_size(10);
            g.measurement_time(Duration::from_secs(4));
        }
        g.throughput(Throughput::Bytes(all.len() as u64));
        g.bench_function("raw_encode_ordinary", |b| b.iter(|| raw(black_box(&all))));
        g.throughput(Throughput::Bytes(body_len));
        g.bench_function("cold", |b| {
            b.iter_batched_ref(
                || {
                    nonce += 1;
                    case.body(Some(nonce), Some(nonce))
                },
                |body| est(body),
                BatchSize::LargeInput,
            )
        });
        // The system prompt is in the cache from here on.
        est(&case.body(None, None));
        g.bench_function("warm_system_prompt", |b| {
            b.iter_batched_ref(
                || {
                    nonce += 1;
                    case.body(None, Some(nonce))
                },
                |body| est(body),
                BatchSize::LargeInput,
            )
        });
        g.bench_function("parse_and_estimate_warm", |b| {
            b.iter_batched_ref(
                || {
                    nonce += 1;
                    serde_json::to_vec(&case.body(None, Some(nonce))).unwrap()
                },
                |bytes| est(&serde_json::from_slice::<Value>(bytes).unwrap()),
                BatchSize::LargeInput,
            )
        });
        g.finish();
    }
}

/// Median of `f`'s durations over interleaved rounds.
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Interleaved measurement printed after criterion: ratios that hold on a
/// noisy machine (both sides of a ratio see the same interference).
fn summary() {
    println!();
    println!("summary (interleaved medians, o200k_base):");
    println!(
        "{:>6} {:>9} {:>12} {:>12} {:>12} {:>8} {:>12} {:>12} {:>12}",
        "body",
        "bytes",
        "raw µs",
        "cold µs",
        "raw MB/s",
        "cold/raw",
        "warm µs",
        "uncached µs",
        "warm extra µs"
    );
    let mut nonce = 1u64 << 40;
    for (name, size) in SIZES {
        let case = Case::new(size);
        let all = case.all_text();
        let rounds = if size > 100_000 { 15 } else { 200 };
        let (mut t_raw, mut t_cold, mut t_warm, mut t_user) = (vec![], vec![], vec![], vec![]);
        est(&case.body(None, None));
        for _ in 0..rounds {
            nonce += 1;
            // Distinct nonces: the cold body's user message must not warm
            // the warm body's.
            let cold = case.body(Some(nonce), Some(nonce));
            let warm_nonce = nonce + (1 << 50);
            let warm = case.body(None, Some(warm_nonce));
            let user = format!("Question {warm_nonce}: {}", case.user);
            let t = Instant::now();
            black_box(raw(black_box(&all)));
            t_raw.push(t.elapsed());
            let t = Instant::now();
            black_box(est(black_box(&cold)));
            t_cold.push(t.elapsed());
            let t = Instant::now();
            black_box(est(black_box(&warm)));
            t_warm.push(t.elapsed());
            let t = Instant::now();
            black_box(raw(black_box(&user)));
            t_user.push(t.elapsed());
        }
        let (r, c, w, u) = (
            median(t_raw),
            median(t_cold),
            median(t_warm),
            median(t_user),
        );
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "{:>6} {:>9} {:>12.1} {:>12.1} {:>12.1} {:>8.2} {:>12.2} {:>12.2} {:>12.2}",
            name,
            case.body_len(),
            us(r),
            us(c),
            all.len() as f64 / r.as_secs_f64() / 1e6,
            r.as_secs_f64() / c.as_secs_f64(),
            us(w),
            us(u),
            us(w) - us(u),
        );
    }
    println!("targets: cold/raw ≥ 0.8 (400KB); warm extra ≤ 20 µs");
}

criterion_group!(estimation, benches);

fn main() {
    estimation();
    Criterion::default().configure_from_args().final_summary();
    if std::env::args().any(|a| a == "--bench") {
        summary();
    }
}
