//! The default output cap lowered to fit the tightest token budgets
//! (DESIGN section 1.4): a request without a cap must still fit the
//! budgets that count its output.

use super::{EstimateError, ModelEstimation};

/// The tightest token capacities a request's default output is lowered to
/// fit, in tokens: among budgets that count input + output (`tpm`, the
/// token quotas) and among budgets that count output alone
/// (`output_tpm`). `None` where no such budget applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenRoom {
    /// Tightest capacity of input + output.
    pub total: Option<u64>,
    /// Tightest capacity of output alone.
    pub output: Option<u64>,
}

impl TokenRoom {
    /// The room both `self` and `other` leave (the smaller of each bound).
    pub fn tighter(self, other: TokenRoom) -> Self {
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Self {
            total: min(self.total, other.total),
            output: min(self.output, other.output),
        }
    }

    /// Room bounded by one input + output capacity (`None`: unbounded).
    pub const fn total(capacity: Option<u64>) -> Self {
        Self {
            total: capacity,
            output: None,
        }
    }
}

/// The per-choice output cap when the client gave none, and whether it was
/// lowered to fit `room`.
pub(super) fn default_output(
    input: u64,
    choices: u64,
    model: &ModelEstimation,
    room: TokenRoom,
) -> Result<(u64, bool), EstimateError> {
    let default = model
        .max_output_tokens
        .map_or(model.default_max_output_tokens, |max| {
            model.default_max_output_tokens.min(max)
        });
    fit_output(input, choices, default, model.min_output_tokens, room)
}

/// The per-choice output cap `wanted` lowered to fit `room` (never below
/// `min`), and whether it was lowered; [`EstimateError::Impossible`] when
/// even `min` does not fit. The model's default (no client cap) and a
/// client's cap clamped to a tenant's room now (`on_short_output =
/// "clamp"`) are both this.
pub fn fit_output(
    input: u64,
    choices: u64,
    wanted: u64,
    min: u64,
    room: TokenRoom,
) -> Result<(u64, bool), EstimateError> {
    let default = wanted;
    let choices = choices.max(1);
    // Checked, not saturating: an overflow must read as "does not fit".
    let total_fits = |per_choice: u64| {
        room.total.is_none_or(|c| {
            choices
                .checked_mul(per_choice)
                .and_then(|out| input.checked_add(out))
                .is_some_and(|total| total <= c)
        })
    };
    let output_fits = |per_choice: u64| {
        room.output
            .is_none_or(|c| choices.checked_mul(per_choice).is_some_and(|out| out <= c))
    };
    if total_fits(default) && output_fits(default) {
        return Ok((default, false));
    }
    let at_min = choices.saturating_mul(min);
    if let (false, Some(capacity)) = (total_fits(min), room.total) {
        let needed = input.saturating_add(at_min);
        return Err(EstimateError::Impossible { needed, capacity });
    }
    if let (false, Some(capacity)) = (output_fits(min), room.output) {
        return Err(EstimateError::Impossible {
            needed: at_min,
            capacity,
        });
    }
    // Both fit at the floor here: input <= total, and each bound >= min.
    let by_total = room.total.map_or(u64::MAX, |c| (c - input) / choices);
    let by_output = room.output.map_or(u64::MAX, |c| c / choices);
    Ok((default.min(by_total).min(by_output).max(min), true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::estimate::Encoding;

    fn model() -> ModelEstimation {
        ModelEstimation {
            encoding: Encoding::O200kBase,
            default_max_output_tokens: 1000,
            max_output_tokens: Some(4000),
            min_output_tokens: 16,
            token_ratio: 1000,
            image: crate::config::estimate::ImageCost::flat(1536),
        }
    }

    #[test]
    fn the_default_is_lowered_to_the_tightest_of_both_rooms() {
        let m = model();
        let room = |total, output| TokenRoom { total, output };
        assert_eq!(
            default_output(100, 1, &m, TokenRoom::default()),
            Ok((1000, false))
        );
        assert_eq!(
            default_output(100, 1, &m, room(Some(600), None)),
            Ok((500, true))
        );
        // An output-only limit ignores the input.
        assert_eq!(
            default_output(100, 2, &m, room(None, Some(600))),
            Ok((300, true))
        );
        assert_eq!(
            default_output(100, 1, &m, room(Some(500), Some(300))),
            Ok((300, true))
        );
        assert_eq!(
            default_output(100, 1, &m, room(Some(5000), Some(3000))),
            Ok((1000, false))
        );
        assert_eq!(
            default_output(100, 1, &m, room(None, Some(10))),
            Err(EstimateError::Impossible {
                needed: 16,
                capacity: 10
            })
        );
        assert_eq!(
            default_output(100, 1, &m, room(Some(110), Some(10))),
            Err(EstimateError::Impossible {
                needed: 116,
                capacity: 110
            })
        );
    }
}
