//! What an image input part costs, in tokens, by model family and `detail`.
//!
//! OpenAI's "Images and vision" guide, section "Calculating costs"
//! (<https://platform.openai.com/docs/guides/images-vision#calculating-costs>)
//! publishes two rules:
//!
//! * **Tiles** (gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o1, o3, gpt-4o-mini,
//!   computer-use-preview): `detail: "low"` costs a fixed *base*; `"high"`
//!   costs base + tiles × *tile*, where the image is fitted in 2048 × 2048,
//!   its short side scaled to 768 px and covered by 512 px tiles. That
//!   allows at most 2 × 4 = 8 tiles (768 × 2048).
//! * **Patches** (gpt-4.1-mini, gpt-4.1-nano, o4-mini, gpt-5-mini,
//!   gpt-5-nano): 32 px patches, at most 1536 (larger images are scaled
//!   down), times a model multiplier. `detail` does not change the count.
//!
//! The gateway never sees the image's size (a URL is not fetched, a data
//! URL is not decoded), so `"high"`, `"auto"` and a missing `detail` are
//! charged the worst case the rule allows, and `"low"` its fixed cost.

use crate::config::estimate::{EstimateSettings, ImageCost};

/// Most 512 px tiles a high-detail image can need (768 × 2048 after scaling).
const MAX_TILES: u64 = 8;
/// Most 32 px patches an image is scaled down to.
const MAX_PATCHES: u64 = 1536;

/// Built-in rules by model-name prefix, most specific first (the first
/// match wins). Figures from the guide cited in the module docs.
const RULES: &[(&str, Rule)] = &[
    (
        "gpt-4o-mini",
        Rule::Tiles {
            base: 2833,
            tile: 5667,
        },
    ),
    ("gpt-4.1-mini", Rule::Patches { per_mille: 1620 }),
    ("gpt-4.1-nano", Rule::Patches { per_mille: 2460 }),
    ("gpt-5-mini", Rule::Patches { per_mille: 1620 }),
    ("gpt-5-nano", Rule::Patches { per_mille: 2460 }),
    ("o4-mini", Rule::Patches { per_mille: 1720 }),
    (
        "computer-use-preview",
        Rule::Tiles {
            base: 65,
            tile: 129,
        },
    ),
    (
        "o1",
        Rule::Tiles {
            base: 75,
            tile: 150,
        },
    ),
    (
        "o3",
        Rule::Tiles {
            base: 75,
            tile: 150,
        },
    ),
    (
        "gpt-4o",
        Rule::Tiles {
            base: 85,
            tile: 170,
        },
    ),
    (
        "chatgpt-4o",
        Rule::Tiles {
            base: 85,
            tile: 170,
        },
    ),
    (
        "gpt-4.1",
        Rule::Tiles {
            base: 85,
            tile: 170,
        },
    ),
    (
        "gpt-4.5",
        Rule::Tiles {
            base: 85,
            tile: 170,
        },
    ),
    (
        "gpt-5",
        Rule::Tiles {
            base: 85,
            tile: 170,
        },
    ),
];

#[derive(Debug, Clone, Copy)]
enum Rule {
    Tiles {
        base: u64,
        tile: u64,
    },
    /// Tokens per 1000 patches.
    Patches {
        per_mille: u64,
    },
}

impl Rule {
    fn cost(self) -> ImageCost {
        match self {
            Rule::Tiles { base, tile } => ImageCost {
                low: base,
                high: base + MAX_TILES * tile,
            },
            Rule::Patches { per_mille } => {
                let worst = (MAX_PATCHES * per_mille).div_ceil(1000);
                ImageCost {
                    low: worst,
                    high: worst,
                }
            }
        }
    }
}

impl ImageCost {
    /// The same cost whatever the `detail`.
    pub const fn flat(tokens: u64) -> ImageCost {
        ImageCost {
            low: tokens,
            high: tokens,
        }
    }

    /// The published rule for a model name, by prefix (ASCII
    /// case-insensitive, a fine-tune `ft:` prefix looked through); `None`
    /// for a name no rule covers.
    pub fn for_model(model: &str) -> Option<ImageCost> {
        let lower = model.to_ascii_lowercase();
        let name = lower.strip_prefix("ft:").unwrap_or(&lower);
        RULES
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix))
            .map(|(_, rule)| rule.cost())
    }

    /// The cost of one part whose `detail` is `detail`.
    pub fn of(self, detail: Option<&str>) -> u64 {
        if detail == Some("low") {
            self.low
        } else {
            self.high
        }
    }
}

impl EstimateSettings {
    /// What an image part costs on a model sent upstream as `upstream_model`
    /// and known to clients as `name`: a configured prefix of either, else
    /// the published rule for either, else a flat
    /// [`image_part_tokens`](EstimateSettings::image_part_tokens).
    pub fn image_cost(&self, upstream_model: &str, name: &str) -> ImageCost {
        let names = [
            upstream_model.to_ascii_lowercase(),
            name.to_ascii_lowercase(),
        ];
        for n in &names {
            let configured = self
                .image_tokens
                .iter()
                .filter(|(prefix, _)| n.starts_with(prefix.as_str()))
                .max_by_key(|(prefix, _)| prefix.len());
            if let Some((_, cost)) = configured {
                return *cost;
            }
        }
        names
            .iter()
            .find_map(|n| ImageCost::for_model(n))
            .unwrap_or(ImageCost::flat(self.image_part_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_worst_cases_per_family() {
        let c = |m: &str| ImageCost::for_model(m).map(|c| (c.low, c.high));
        assert_eq!(c("gpt-4o-2024-08-06"), Some((85, 1445)));
        assert_eq!(c("GPT-4.1"), Some((85, 1445)));
        assert_eq!(c("o3-pro"), Some((75, 1275)));
        assert_eq!(c("gpt-4o-mini"), Some((2833, 48_169)));
        assert_eq!(c("gpt-4.1-mini"), Some((2489, 2489)));
        assert_eq!(c("gpt-4.1-nano"), Some((3779, 3779)));
        assert_eq!(c("ft:o4-mini:acme"), Some((2642, 2642)));
        assert_eq!(c("my-azure-deployment"), None);
    }
}
