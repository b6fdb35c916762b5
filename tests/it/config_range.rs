//! The exact range at config load (issue 16, finding 5): limits, bursts and
//! single costs up to 10^10 tokens (providers' top tiers publish 1.5·10^8
//! TPM; organisation-wide budgets need more), quotas up to 10^12 whole
//! tokens; one more is refused with the field named.

use budgetgate::config::Policy;

use crate::support::*;

fn load(l: Limits) -> Result<Policy, String> {
    Policy::from_toml(&TestConfig::standard("http://127.0.0.1:9", 50, l).render())
        .map_err(|e| e.to_string())
}

#[test]
fn limits_up_to_ten_billion_and_quotas_up_to_a_trillion_load() {
    load(
        limits()
            .tpm(10_000_000_000)
            .tpm_burst(10_000_000_000)
            .rpm(10_000_000_000),
    )
    .expect("10^10 per minute");
    load(
        limits()
            .tokens_per_month(1_000_000_000_000)
            .tokens_per_day(1_000_000_000_000),
    )
    .expect("10^12 per window");
    let e = load(limits().tpm(10_000_000_001)).expect_err("above 10^10");
    assert!(e.contains("tpm"), "{e}");
    let e = load(limits().tokens_per_month(1_000_000_000_001)).expect_err("above 10^12");
    assert!(e.contains("tokens_per_month"), "{e}");
}
