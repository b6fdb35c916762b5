//! Hosted tools priced per use (docs/MONEY.md, "Hosted tools"): a tool
//! the provider runs bills per unit beside the tokens (a web search per
//! call, a code-interpreter container per session, a generated image per
//! image). A model that prices a tool (`hosted_tools = { web_search = {
//! per = "call", usd = "0.01" } }`) allows it under dollar budgets: a
//! request reserves its price for the most uses it may make and settles
//! the uses its answer reports. The kinds here are the ones whose uses an
//! answer reports (Responses: its output items; Messages: its
//! `usage.server_tool_use` counts); another type can only be allowed
//! unpriced.

use super::MAX_COST;

/// The unit a hosted tool bills by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    /// Each call (web search, file search).
    Call,
    /// Each container session (code interpreter).
    Session,
    /// Each generated image.
    Image,
}

impl Per {
    /// The name the config uses (`per = "call"`).
    pub fn name(self) -> &'static str {
        match self {
            Per::Call => "call",
            Per::Session => "session",
            Per::Image => "image",
        }
    }

    /// Parses a config name.
    pub fn parse(s: &str) -> Option<Per> {
        [Per::Call, Per::Session, Per::Image]
            .into_iter()
            .find(|p| p.name() == s)
    }
}

/// A hosted tool whose uses an answer reports, so the gateway can price them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostedKind {
    /// `web_search` (and its dated and preview variants).
    WebSearch,
    /// `file_search`.
    FileSearch,
    /// `code_interpreter`.
    CodeInterpreter,
    /// `image_generation`.
    ImageGeneration,
    /// `web_fetch` (Anthropic's server tool, dated variants).
    WebFetch,
}

impl HostedKind {
    /// Every kind, in [`HostedCalls`] order.
    pub const ALL: [HostedKind; KINDS] = [
        HostedKind::WebSearch,
        HostedKind::FileSearch,
        HostedKind::CodeInterpreter,
        HostedKind::ImageGeneration,
        HostedKind::WebFetch,
    ];

    /// The tool type the config and bodies name it by.
    pub fn name(self) -> &'static str {
        match self {
            HostedKind::WebSearch => "web_search",
            HostedKind::FileSearch => "file_search",
            HostedKind::CodeInterpreter => "code_interpreter",
            HostedKind::ImageGeneration => "image_generation",
            HostedKind::WebFetch => "web_fetch",
        }
    }

    /// The unit the provider bills it by.
    pub fn unit(self) -> Per {
        match self {
            HostedKind::WebSearch | HostedKind::FileSearch | HostedKind::WebFetch => Per::Call,
            HostedKind::CodeInterpreter => Per::Session,
            HostedKind::ImageGeneration => Per::Image,
        }
    }

    /// The kind of a tool `type` in a body (`web_search_preview`,
    /// `web_search_2025_08_26` are web searches).
    pub fn of_tool_type(t: &str) -> Option<HostedKind> {
        HostedKind::ALL.into_iter().find(|k| {
            let n = k.name();
            t == n || t.strip_prefix(n).is_some_and(|r| r.starts_with('_'))
        })
    }

    /// The kind of an output item `type` in an answer (`web_search_call`).
    pub fn of_output_item(t: &str) -> Option<HostedKind> {
        let name = t.strip_suffix("_call")?;
        HostedKind::ALL.into_iter().find(|k| k.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How many kinds there are.
const KINDS: usize = 5;

/// Uses of each [`HostedKind`] (reserved, or reported by an answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostedCalls([u32; KINDS]);

impl HostedCalls {
    /// No use.
    pub const EMPTY: HostedCalls = HostedCalls([0; KINDS]);

    /// Sets the uses of `kind` to `n` (a count reported again replaces
    /// the one before).
    pub fn set(&mut self, kind: HostedKind, n: u32) {
        self.0[kind.index()] = n;
    }

    /// Uses of every kind.
    pub fn uses(&self) -> u64 {
        self.0.iter().map(|&n| u64::from(n)).sum()
    }

    /// Adds `n` uses of `kind`.
    pub fn add(&mut self, kind: HostedKind, n: u32) {
        let slot = &mut self.0[kind.index()];
        *slot = slot.saturating_add(n);
    }

    /// Uses of `kind`.
    pub fn get(&self, kind: HostedKind) -> u32 {
        self.0[kind.index()]
    }

    /// No use at all.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&n| n == 0)
    }
}

/// A model's prices of hosted tools, µ$ per unit of each kind (`None`:
/// not priced).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostedPrices([Option<u64>; KINDS]);

impl HostedPrices {
    /// Prices `kind` at `micros` per unit.
    pub fn set(&mut self, kind: HostedKind, micros: u64) {
        self.0[kind.index()] = Some(micros);
    }

    /// The price of one unit of `kind`, if priced.
    pub fn get(&self, kind: HostedKind) -> Option<u64> {
        self.0[kind.index()]
    }

    /// Whether no kind is priced.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// What `uses` cost, µ$ (an unpriced kind costs 0: a request using one
    /// is refused under a dollar budget before it is admitted), at most
    /// [`MAX_COST`].
    pub fn cost(&self, uses: &HostedCalls) -> u64 {
        let sum: u128 = HostedKind::ALL
            .into_iter()
            .map(|k| u128::from(uses.get(k)) * u128::from(self.get(k).unwrap_or(0)))
            .sum();
        u64::try_from(sum).unwrap_or(u64::MAX).min(MAX_COST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_tool_type_and_output_item() {
        assert_eq!(
            HostedKind::of_tool_type("web_search"),
            Some(HostedKind::WebSearch)
        );
        assert_eq!(
            HostedKind::of_tool_type("web_search_preview_2025_03_11"),
            Some(HostedKind::WebSearch)
        );
        assert_eq!(HostedKind::of_tool_type("web_searcher"), None);
        assert_eq!(HostedKind::of_tool_type("mcp"), None);
        assert_eq!(
            HostedKind::of_output_item("code_interpreter_call"),
            Some(HostedKind::CodeInterpreter)
        );
        assert_eq!(HostedKind::of_output_item("function_call"), None);
        assert_eq!(HostedKind::of_output_item("message"), None);
    }

    #[test]
    fn uses_cost_their_unit_price_exactly() {
        let mut p = HostedPrices::default();
        p.set(HostedKind::WebSearch, 10_000);
        p.set(HostedKind::CodeInterpreter, 30_000);
        let mut u = HostedCalls::default();
        u.add(HostedKind::WebSearch, 3);
        u.add(HostedKind::CodeInterpreter, 1);
        u.add(HostedKind::FileSearch, 7);
        assert_eq!(p.cost(&u), 60_000, "file search unpriced: 0");
        u.add(HostedKind::WebSearch, u32::MAX);
        assert_eq!(u.get(HostedKind::WebSearch), u32::MAX);
        let mut dear = HostedPrices::default();
        dear.set(HostedKind::WebSearch, u64::MAX);
        assert_eq!(dear.cost(&u), MAX_COST);
    }
}
