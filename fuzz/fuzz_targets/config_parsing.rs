//! Config parsing and validation: any text is a policy or a list of
//! errors, never a panic; an accepted policy reloads to the same version.
#![no_main]

use budgetgate::config::Policy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Policy::from_toml(text) {
        Ok(p) => {
            let again = Policy::from_toml(text).expect("accepted once, accepted again");
            assert_eq!(p.version, again.version);
        }
        Err(e) => assert!(!e.0.is_empty(), "a refusal names its errors"),
    }
});
