//! The `anthropic-beta` header's refusal: which betas
//! pass is the model's [`BetaPolicy`](crate::config::betas::BetaPolicy),
//! a setting; this is what the client is told when one does not.

use crate::config::betas::BetaRefusal;

/// The message of a refused `beta` on model `model`.
pub fn refusal_message(beta: &str, model: &str, why: &BetaRefusal) -> String {
    match why {
        BetaRefusal::NotAllowed => format!(
            "anthropic-beta: `{beta}` is not enabled for model `{model}` on this gateway (the model allows only the betas its `anthropic_betas` lists)."
        ),
        BetaRefusal::Denied(rule) => format!(
            "anthropic-beta: `{beta}` is not enabled for model `{model}` on this gateway: betas matching `{rule}` reach provider objects or work billed beside the tokens, which the gateway cannot meter or keep to one tenant."
        ),
    }
}
