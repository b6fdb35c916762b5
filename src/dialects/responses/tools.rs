//! The tools of a Responses body, wherever they sit: the top-level
//! `tools`, the `tools` of `additional_tools` input items (where Codex CLI
//! puts its tools), and the members of `namespace` groups, nested up to
//! [`MAX_DEPTH`] levels. A `namespace` is a client-side group of tools:
//! its members are checked, estimated and metered as if they were listed
//! one by one. Each tool is classed by its `type` ([`class`]): run by the
//! client (its calls are model output, metered as such), run by the
//! provider (hosted: allowed per model), or unknown to the gateway.

use serde_json::{Map, Value};

/// Deepest nesting of tool lists: a top-level tool is at depth 1, a
/// member of a top-level `namespace` at depth 2.
pub const MAX_DEPTH: usize = 4;

/// The type of a group of tools.
pub const NAMESPACE: &str = "namespace";

/// Tool types the client runs: the model writes their calls (output the
/// gateway meters) and the client sends their results back as input.
pub const CLIENT_TOOLS: &[&str] = &["function", "custom", "local_shell", "shell", "apply_patch"];

/// Tool types the provider runs, with inputs and costs the gateway does
/// not see (OpenAI API reference, "Tools"; dated variants by prefix).
pub const HOSTED_TOOLS: &[&str] = &[
    "web_search",
    "file_search",
    "code_interpreter",
    "image_generation",
    "mcp",
    "computer_use_preview",
    "tool_search",
];

/// What runs a tool of a given `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolClass {
    /// The client (function, custom, shell tools).
    Client,
    /// A group whose members are tools of their own.
    Group,
    /// The provider (web search, file search, code interpreter…).
    Hosted,
    /// A type this gateway does not know.
    Unknown,
}

/// The class of tool type `kind`. Hosted types match with their dated
/// variants (`web_search_preview`, `web_search_2025_08_26`).
pub fn class(kind: &str) -> ToolClass {
    if CLIENT_TOOLS.contains(&kind) {
        ToolClass::Client
    } else if kind == NAMESPACE {
        ToolClass::Group
    } else if HOSTED_TOOLS
        .iter()
        .any(|h| kind == *h || kind.strip_prefix(h).is_some_and(|r| r.starts_with('_')))
    {
        ToolClass::Hosted
    } else {
        ToolClass::Unknown
    }
}

/// One step of a tool's path in the body.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// `tools[i]` at the top level.
    Top(usize),
    /// `input[i]` (an `additional_tools` item).
    Input(usize),
    /// `.tools[i]` of the previous step.
    Member(usize),
}

/// Where a tool sits in the body, rendered only when a refusal names it
/// (`tools[4].tools[2]`, `input[0].tools[1]`).
#[derive(Debug, Clone, Copy)]
pub struct ToolPath<'p>(&'p [Step]);

impl std::fmt::Display for ToolPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for step in self.0 {
            match step {
                Step::Top(i) => write!(f, "tools[{i}]")?,
                Step::Input(i) => write!(f, "input[{i}]")?,
                Step::Member(i) => write!(f, ".tools[{i}]")?,
            }
        }
        Ok(())
    }
}

/// What [`visit`] found wrong with the tool lists themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooDeep {
    /// The `namespace` whose members are too deep (`tools[0].tools[1]`).
    pub path: String,
}

/// Calls `f` with every tool that is not a group (its path, the tool and
/// its `type`), groups' members included, in document order; stops at
/// the first error `f` returns. A group nested deeper than [`MAX_DEPTH`]
/// is an error of its own (`too_deep`).
pub fn visit<'a, E>(
    body: &'a Map<String, Value>,
    mut f: impl FnMut(ToolPath<'_>, &'a Value, &'a str) -> Result<(), E>,
    too_deep: impl Fn(TooDeep) -> E,
) -> Result<(), E> {
    let mut path = Vec::with_capacity(MAX_DEPTH + 1);
    if let Some(Value::Array(tools)) = body.get("tools") {
        for (i, tool) in tools.iter().enumerate() {
            path.push(Step::Top(i));
            one(tool, &mut path, 1, &mut f, &too_deep)?;
            path.pop();
        }
    }
    if let Some(Value::Array(items)) = body.get("input") {
        for (i, item) in items.iter().enumerate() {
            if item.get("type").and_then(Value::as_str) != Some("additional_tools") {
                continue;
            }
            if let Some(Value::Array(tools)) = item.get("tools") {
                path.push(Step::Input(i));
                for (j, tool) in tools.iter().enumerate() {
                    path.push(Step::Member(j));
                    one(tool, &mut path, 1, &mut f, &too_deep)?;
                    path.pop();
                }
                path.pop();
            }
        }
    }
    Ok(())
}

fn one<'a, E>(
    tool: &'a Value,
    path: &mut Vec<Step>,
    depth: usize,
    f: &mut impl FnMut(ToolPath<'_>, &'a Value, &'a str) -> Result<(), E>,
    too_deep: &impl Fn(TooDeep) -> E,
) -> Result<(), E> {
    let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != NAMESPACE {
        return f(ToolPath(path), tool, kind);
    }
    let Some(Value::Array(members)) = tool.get("tools") else {
        return Ok(());
    };
    if depth >= MAX_DEPTH && !members.is_empty() {
        return Err(too_deep(TooDeep {
            path: ToolPath(path).to_string(),
        }));
    }
    for (i, member) in members.iter().enumerate() {
        path.push(Step::Member(i));
        one(member, path, depth + 1, f, too_deep)?;
        path.pop();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn all(body: Value) -> Result<Vec<(String, String)>, TooDeep> {
        let mut out = Vec::new();
        visit(
            body.as_object().unwrap(),
            |p, _, k| {
                out.push((p.to_string(), k.to_string()));
                Ok(())
            },
            |e| e,
        )?;
        Ok(out)
    }

    #[test]
    fn groups_are_walked_wherever_tools_sit() {
        let body = json!({
            "tools": [{"type": "function", "name": "f"},
                      {"type": "namespace", "name": "ns", "tools": [
                          {"type": "custom", "name": "c"},
                          {"type": "web_search"}]}],
            "input": [{"type": "message", "role": "user", "content": "hi"},
                      {"type": "additional_tools", "tools": [
                          {"type": "namespace", "name": "functions", "tools": [{"type": "function", "name": "g"}]}]}]
        });
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            all(body).unwrap(),
            pairs(&[
                ("tools[0]", "function"),
                ("tools[1].tools[0]", "custom"),
                ("tools[1].tools[1]", "web_search"),
                ("input[1].tools[0].tools[0]", "function"),
            ])
        );
    }

    #[test]
    fn nesting_is_bounded() {
        let leaf = json!({"type": "function", "name": "f"});
        let wrap = |t: Value| json!({"type": "namespace", "name": "n", "tools": [t]});
        // Depth 4: three groups around a function.
        let ok = json!({"tools": [wrap(wrap(wrap(leaf.clone())))]});
        assert_eq!(all(ok).unwrap().len(), 1);
        let deep = json!({"tools": [wrap(wrap(wrap(wrap(leaf))))]});
        assert_eq!(
            all(deep),
            Err(TooDeep {
                path: "tools[0].tools[0].tools[0].tools[0]".into()
            })
        );
    }

    #[test]
    fn types_are_classed() {
        assert_eq!(class("function"), ToolClass::Client);
        assert_eq!(class("namespace"), ToolClass::Group);
        assert_eq!(class("web_search"), ToolClass::Hosted);
        assert_eq!(class("web_search_preview_2025_03_11"), ToolClass::Hosted);
        assert_eq!(class("mcp"), ToolClass::Hosted);
        assert_eq!(class("web_searcher"), ToolClass::Unknown);
        assert_eq!(class("teleport"), ToolClass::Unknown);
        assert_eq!(class(""), ToolClass::Unknown);
    }
}
