//! The exact range at config load: limits, bursts and
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

#[test]
fn a_limit_beyond_64_bits_gets_the_range_message_not_a_parser_error() {
    let text = TestConfig::standard("http://127.0.0.1:9", 50, limits().tpm(123_454_321)).render();
    assert!(text.contains("123454321"));
    for written in ["100000000000000000000", "9223372036854775808"] {
        let e = Policy::from_toml(&text.replace("123454321", written))
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("limits.tpm: must be ≤ 10000000000"),
            "{written}: {e}"
        );
        assert!(
            !e.contains("i128") && !e.contains("parse"),
            "{written}: {e}"
        );
    }
    let e = Policy::from_toml(&text.replace("123454321", "-100000000000000000000"))
        .expect_err("refused")
        .to_string();
    assert!(e.contains("limits.tpm: must be > 0"), "{e}");
}
