//! What a Responses body refers to that the gateway cannot meter or keep
//! to one tenant (DESIGN section 11: refused clearly, never passed
//! through). Every tenant reaches the provider through the gateway's one
//! key, so a provider object (a stored conversation, prompt template,
//! file, vector store, container, stored item) named in a body would be
//! reachable by any tenant that learns its id, and its contents become
//! input the gateway cannot count. Such a body is refused with a 400
//! naming the field unless the tenant's config lists the object's id.
//! `conversation` is always refused. Hosted tools run on the provider's
//! side (searches, code, images, remote MCP) with costs and inputs the
//! gateway does not see: refused unless the model allows the tool by
//! type, wherever it sits ([`super::tools`]: nested in `namespace`
//! groups, in `additional_tools` items), the refusal naming its path and
//! quoting the config line that would allow it; a type the gateway does
//! not know is refused the same way. `background: true` is refused
//! unless the model allows it.

use serde_json::{Map, Value};

use super::valid_id;
use crate::config::bounds::RESPONSES_MIN_CAP as MIN_CAP;

/// The config that relaxes the refusals.
#[derive(Clone, Copy)]
pub struct Rules<'a> {
    /// Provider object ids this tenant may name (files, vector stores,
    /// containers, prompts, items).
    pub allowed_objects: &'a [String],
    /// Hosted tool types this model may use (e.g. `web_search`).
    pub hosted_tools: &'a [String],
    /// Whether `background: true` is allowed for this model.
    pub allow_background: bool,
    /// The model's public name (refusals name it).
    pub model: &'a str,
    /// The config line that would allow a tool type on this model.
    pub allowing_line: &'a dyn Fn(&str) -> String,
}

/// Why a body is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 400 naming `param`.
    Invalid {
        /// The field.
        param: String,
        /// Why.
        message: String,
    },
    /// `previous_response_id` that is not a valid id: 404 without a lookup.
    UnknownResponse(String),
}

/// What a valid body refers to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// `previous_response_id`, shape-checked.
    pub previous_response_id: Option<String>,
    /// `background: true` (allowed by the model).
    pub background: bool,
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> Refusal {
    Refusal::Invalid {
        param: param.into(),
        message: message.into(),
    }
}

/// Checks a body against the rules; what it refers to when it passes.
pub fn check(body: &Map<String, Value>, rules: &Rules) -> Result<References, Refusal> {
    let allowed = |id: &str| rules.allowed_objects.iter().any(|a| a == id);
    let present = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if present("conversation") {
        return Err(invalid(
            "conversation",
            "Conversations are stored by the provider under the gateway's shared key and cannot be kept to one tenant or metered; this gateway does not forward `conversation`. Send the conversation's items in `input`, or chain responses with `previous_response_id`.",
        ));
    }
    if let Some(p) = body.get("prompt").filter(|v| !v.is_null()) {
        let id = p.get("id").and_then(Value::as_str).unwrap_or("");
        if !allowed(id) {
            return Err(invalid(
                "prompt",
                "Stored prompt templates are provider objects this gateway has not recorded for your tenant (their text cannot be estimated); ask the operator to allow-list the prompt id, or send the prompt's text as `instructions`.",
            ));
        }
    }
    if let Some(Value::Array(items)) = body.get("input") {
        for (i, item) in items.iter().enumerate() {
            if item.get("type").and_then(Value::as_str) == Some("item_reference") {
                let id = item.get("id").and_then(Value::as_str).unwrap_or("");
                if !allowed(id) {
                    return Err(invalid(
                        format!("input[{i}].id"),
                        "Item references name items stored by the provider that this gateway has not recorded for your tenant; send the item itself.",
                    ));
                }
            }
            if let Some(Value::Array(parts)) = item.get("content") {
                for (j, part) in parts.iter().enumerate() {
                    if let Some(id) = part.get("file_id").and_then(Value::as_str) {
                        if !allowed(id) {
                            return Err(invalid(
                                format!("input[{i}].content[{j}].file_id"),
                                format!("The file `{id}` is a provider object this gateway has not recorded for your tenant; send its content inline (e.g. `file_data` or an image URL) or ask the operator to allow-list it."),
                            ));
                        }
                    }
                }
            }
        }
    }
    super::tools::visit(
        body,
        |path, tool, kind| check_tool(path, tool, kind, rules, &allowed),
        |deep| {
            invalid(
                format!("{}.tools", deep.path),
                format!(
                    "Tool groups (`namespace`) nest at most {} levels deep.",
                    super::tools::MAX_DEPTH
                ),
            )
        },
    )?;
    let background = body.get("background").and_then(Value::as_bool) == Some(true);
    if background && !rules.allow_background {
        return Err(invalid(
            "background",
            "Background responses run after the HTTP response ends, so the gateway cannot meter their output or end them when a budget runs out; this model does not allow `background: true`.",
        ));
    }
    if let Some(cap) = body.get("max_output_tokens").and_then(Value::as_u64) {
        if cap < MIN_CAP {
            return Err(invalid(
                "max_output_tokens",
                format!("'max_output_tokens' must be at least {MIN_CAP}, got {cap}."),
            ));
        }
    }
    let previous_response_id = match body.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if valid_id(id) => Some(id.clone()),
        Some(Value::String(id)) => return Err(Refusal::UnknownResponse(id.clone())),
        Some(_) => {
            return Err(invalid(
                "previous_response_id",
                "'previous_response_id' must be a string.",
            ))
        }
    };
    Ok(References {
        previous_response_id,
        background,
    })
}

fn check_tool(
    path: super::tools::ToolPath<'_>,
    tool: &Value,
    kind: &str,
    rules: &Rules,
    allowed: &impl Fn(&str) -> bool,
) -> Result<(), Refusal> {
    use super::tools::{class, ToolClass};
    let listed = rules.hosted_tools.iter().any(|t| t == kind);
    match class(kind) {
        ToolClass::Client | ToolClass::Group => return Ok(()),
        ToolClass::Hosted if !listed => {
            return Err(invalid(
                format!("{path}.type"),
                format!("Hosted tool `{kind}` runs on the provider's side with inputs and costs this gateway cannot meter; it is not allowed for model `{}` (function, custom and namespace tools are). An operator allows it with this line in the model's entry: {}", rules.model, (rules.allowing_line)(kind)),
            ))
        }
        ToolClass::Unknown if !listed => {
            return Err(invalid(
                format!("{path}.type"),
                format!("Tool type `{kind}` is unknown to this gateway, which cannot tell whether the client or the provider runs it (nor what it costs); it is refused on model `{}`. If the provider runs it, an operator allows it with this line in the model's entry: {}", rules.model, (rules.allowing_line)(kind)),
            ))
        }
        ToolClass::Hosted | ToolClass::Unknown => {}
    }
    if let Some(Value::Array(ids)) = tool.get("vector_store_ids") {
        for id in ids {
            let id = id.as_str().unwrap_or("");
            if !allowed(id) {
                return Err(invalid(
                    format!("{path}.vector_store_ids"),
                    format!("The vector store `{id}` is a provider object this gateway has not recorded for your tenant."),
                ));
            }
        }
    }
    if let Some(Value::String(id)) = tool.get("container") {
        if !allowed(id) {
            return Err(invalid(
                format!("{path}.container"),
                format!("The container `{id}` is a provider object this gateway has not recorded for your tenant; use `{{\"type\": \"auto\"}}`."),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(body: Value, rules: Rules) -> Result<References, Refusal> {
        check(body.as_object().unwrap(), &rules)
    }

    fn line(kind: &str) -> String {
        format!("hosted_tools = [\"{kind}\"]")
    }

    const NONE: Rules<'static> = Rules {
        allowed_objects: &[],
        hosted_tools: &[],
        allow_background: false,
        model: "m",
        allowing_line: &line,
    };

    fn param(r: Result<References, Refusal>) -> String {
        match r {
            Err(Refusal::Invalid { param, .. }) => param,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn refusals_name_the_field() {
        assert_eq!(
            param(run(json!({"conversation": "conv_1"}), NONE)),
            "conversation"
        );
        assert_eq!(
            param(run(json!({"prompt": {"id": "pmpt_1"}}), NONE)),
            "prompt"
        );
        assert_eq!(
            param(run(
                json!({"input": [{"role":"user","content":[{"type":"input_file","file_id":"file-1"}]}]}),
                NONE
            )),
            "input[0].content[0].file_id"
        );
        assert_eq!(
            param(run(json!({"tools": [{"type":"web_search"}]}), NONE)),
            "tools[0].type"
        );
        assert_eq!(param(run(json!({"background": true}), NONE)), "background");
        assert_eq!(
            param(run(json!({"max_output_tokens": 15}), NONE)),
            "max_output_tokens"
        );
        let tools = ["file_search".to_string()];
        let rules = Rules {
            hosted_tools: &tools,
            ..NONE
        };
        assert_eq!(
            param(run(
                json!({"tools": [{"type":"file_search","vector_store_ids":["vs_1"]}]}),
                rules
            )),
            "tools[0].vector_store_ids"
        );
        assert_eq!(
            run(json!({"previous_response_id": "../x"}), NONE),
            Err(Refusal::UnknownResponse("../x".into()))
        );
    }

    #[test]
    fn allow_lists_relax_them() {
        let ids = ["file-1".to_string(), "vs_1".to_string()];
        let tools = ["file_search".to_string()];
        let rules = Rules {
            allowed_objects: &ids,
            hosted_tools: &tools,
            allow_background: true,
            ..NONE
        };
        let r = run(
            json!({"input": [{"role":"user","content":[{"type":"input_file","file_id":"file-1"}]}],
                   "tools": [{"type":"function","name":"f"},{"type":"file_search","vector_store_ids":["vs_1"]}],
                   "background": true, "previous_response_id": "resp_1"}),
            rules,
        )
        .unwrap();
        assert_eq!(r.previous_response_id.as_deref(), Some("resp_1"));
        assert!(r.background);
    }
}
