//! The exact range at config load (issue 16, finding 5): limits, bursts and
//! single costs up to 10^10 tokens (providers' top tiers publish 1.5·10^8
//! TPM; organisation-wide budgets need more), quotas up to 10^12 whole
//! tokens; one more is refused with the field named.

mod common;

use budgetgate::config::Policy;
use common::config;

fn load(limits: &str) -> Result<Policy, String> {
    Policy::from_toml(&config("http://127.0.0.1:9", 50, limits, "")).map_err(|e| e.to_string())
}

#[test]
fn limits_up_to_ten_billion_and_quotas_up_to_a_trillion_load() {
    load("tpm = 10000000000, tpm_burst = 10000000000, rpm = 10000000000")
        .expect("10^10 per minute");
    load("tokens_per_month = 1000000000000, tokens_per_day = 1000000000000")
        .expect("10^12 per window");
    let e = load("tpm = 10000000001").expect_err("above 10^10");
    assert!(e.contains("tpm"), "{e}");
    let e = load("tokens_per_month = 1000000000001").expect_err("above 10^12");
    assert!(e.contains("tokens_per_month"), "{e}");
}
