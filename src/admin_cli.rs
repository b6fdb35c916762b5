//! `budgetgate keys …`, `budgetgate tenants …`, `budgetgate admin-tokens …`,
//! `budgetgate explain`: the admin API from the command line. Every command is one HTTP call
//! to a running gateway (`--url`, `BUDGETGATE_URL`) with an admin token
//! (`--token`, `BUDGETGATE_ADMIN_TOKEN`); the answer's JSON is printed
//! indented, and a refusal's message goes to stderr with a failing exit.
//! The helpers every such command shares (the token, a path segment, a
//! gateway that does not answer, the printing) are in
//! [`crate::admin_call`], which `spend` and `reconcile`
//! ([`crate::ledger::cli`]) use too.

use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// Where the gateway is and who asks.
#[derive(Debug, Args)]
pub struct Target {
    /// The gateway's base URL.
    #[arg(long, env = "BUDGETGATE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An admin token (the bootstrap token or one of `admin-tokens create`).
    #[arg(long, env = "BUDGETGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub use crate::admin_call::{enc, printable, token, unreachable};

/// `budgetgate keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key; prints it with its secret (shown this once).
    Create {
        /// The key's tenant.
        #[arg(long)]
        tenant: String,
        /// Key id (default: generated).
        #[arg(long)]
        id: Option<String>,
        /// A name for people.
        #[arg(long)]
        alias: Option<String>,
        /// Limits as JSON, e.g. '{"tpm": 10000}'.
        #[arg(long)]
        limits: Option<String>,
        /// Allowed model (repeat for several; default: all).
        #[arg(long = "model")]
        models: Vec<String>,
        /// Unix time in seconds from which the key is refused.
        #[arg(long)]
        expires_at: Option<i64>,
    },
    /// List keys (of one tenant with --tenant).
    List {
        /// Only this tenant's keys.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a key everywhere.
    Revoke {
        /// The key's tenant.
        #[arg(long)]
        tenant: String,
        /// Key id.
        id: String,
    },
    /// Give a key a new secret; the old one works for --overlap-secs.
    Rotate {
        /// The key's tenant.
        #[arg(long)]
        tenant: String,
        /// Key id.
        id: String,
        /// Seconds the old secret keeps working.
        #[arg(long, default_value_t = 3600)]
        overlap_secs: u64,
    },
}

/// `budgetgate tenants …`.
#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant from JSON (the config file's tenant fields).
    Create {
        /// The tenant as JSON, e.g. '{"name": "ml", "parent": "acme", "limits": {"tpm": 5000}}'.
        json: String,
    },
    /// List tenants.
    List {
        /// Only children of this tenant.
        #[arg(long)]
        parent: Option<String>,
    },
    /// Show a tenant.
    Get {
        /// Tenant name.
        name: String,
    },
    /// Change a tenant (JSON merge patch, e.g. '{"limits": {"tpm": 8000}}').
    Update {
        /// Tenant name.
        name: String,
        /// The patch.
        json: String,
    },
    /// Delete a tenant and its keys.
    Delete {
        /// Tenant name.
        name: String,
    },
}

/// `budgetgate admin-tokens …` (root token only for create and revoke).
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create an admin token; prints it (shown this once).
    Create {
        /// `read` or `admin`.
        #[arg(long)]
        role: String,
        /// Limit the token to this tenant's subtree.
        #[arg(long)]
        tenant: Option<String>,
        /// Token id (default: generated).
        #[arg(long)]
        id: Option<String>,
    },
    /// List admin tokens.
    List,
    /// Revoke an admin token.
    Revoke {
        /// Token id.
        id: String,
    },
}

/// One call: method, path (with its query), body.
pub type Call = (reqwest::Method, String, Option<Value>);

fn parse_json(what: &str, text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what} is not JSON: {e}"))
}

/// The call of a `keys` command.
pub fn keys_call(c: KeysCommand) -> Result<Call, String> {
    use reqwest::Method;
    Ok(match c {
        KeysCommand::Create {
            tenant,
            id,
            alias,
            limits,
            models,
            expires_at,
        } => {
            let mut body = json!({});
            if let Some(id) = id {
                body["id"] = json!(id);
            }
            if let Some(a) = alias {
                body["alias"] = json!(a);
            }
            if let Some(l) = limits {
                body["limits"] = parse_json("--limits", &l)?;
            }
            if !models.is_empty() {
                body["allowed_models"] = json!(models);
            }
            if let Some(e) = expires_at {
                body["expires_at"] = json!(e);
            }
            (
                Method::POST,
                format!("/admin/v1/tenants/{}/keys", enc(&tenant)),
                Some(body),
            )
        }
        KeysCommand::List { tenant } => match tenant {
            Some(t) => (
                Method::GET,
                format!("/admin/v1/tenants/{}/keys?limit=1000", enc(&t)),
                None,
            ),
            None => (Method::GET, "/admin/v1/keys?limit=1000".into(), None),
        },
        KeysCommand::Revoke { tenant, id } => (
            Method::POST,
            format!(
                "/admin/v1/tenants/{}/keys/{}/revoke",
                enc(&tenant),
                enc(&id)
            ),
            None,
        ),
        KeysCommand::Rotate {
            tenant,
            id,
            overlap_secs,
        } => (
            Method::POST,
            format!(
                "/admin/v1/tenants/{}/keys/{}/rotate",
                enc(&tenant),
                enc(&id)
            ),
            Some(json!({ "overlap_secs": overlap_secs })),
        ),
    })
}

/// The call of a `tenants` command.
pub fn tenants_call(c: TenantsCommand) -> Result<Call, String> {
    use reqwest::Method;
    Ok(match c {
        TenantsCommand::Create { json } => (
            Method::POST,
            "/admin/v1/tenants".into(),
            Some(parse_json("the tenant", &json)?),
        ),
        TenantsCommand::List { parent } => {
            let q = parent
                .map(|p| format!("&parent={}", enc(&p)))
                .unwrap_or_default();
            (
                Method::GET,
                format!("/admin/v1/tenants?limit=1000{q}"),
                None,
            )
        }
        TenantsCommand::Get { name } => (
            Method::GET,
            format!("/admin/v1/tenants/{}", enc(&name)),
            None,
        ),
        TenantsCommand::Update { name, json } => (
            Method::PATCH,
            format!("/admin/v1/tenants/{}", enc(&name)),
            Some(parse_json("the patch", &json)?),
        ),
        TenantsCommand::Delete { name } => (
            Method::DELETE,
            format!("/admin/v1/tenants/{}", enc(&name)),
            None,
        ),
    })
}

/// The call of an `admin-tokens` command.
pub fn tokens_call(c: TokensCommand) -> Result<Call, String> {
    use reqwest::Method;
    Ok(match c {
        TokensCommand::Create { role, tenant, id } => (
            Method::POST,
            "/admin/v1/admin_tokens".into(),
            Some(json!({ "role": role, "tenant": tenant, "id": id })),
        ),
        TokensCommand::List => (Method::GET, "/admin/v1/admin_tokens".into(), None),
        TokensCommand::Revoke { id } => (
            Method::POST,
            format!("/admin/v1/admin_tokens/{}/revoke", enc(&id)),
            None,
        ),
    })
}

/// The call of `budgetgate explain REQUEST_ID`.
pub fn explain_call(request_id: &str) -> Call {
    (
        reqwest::Method::GET,
        format!("/admin/v1/refusals/{}", enc(request_id)),
        None,
    )
}

/// What a successful `keys` command adds on stderr: a secret is in this
/// answer only.
pub fn keys_note(c: &KeysCommand) -> Option<&'static str> {
    match c {
        KeysCommand::Create { .. } | KeysCommand::Rotate { .. } => Some(
            "the \"secret\" above is shown this once: store it now (the gateway keeps only its SHA-256 digest)",
        ),
        _ => None,
    }
}

/// What a successful `admin-tokens` command adds on stderr.
pub fn tokens_note(c: &TokensCommand) -> Option<&'static str> {
    match c {
        TokensCommand::Create { .. } => Some(
            "the \"token\" above is shown this once: store it now (the gateway keeps only its SHA-256 digest)",
        ),
        _ => None,
    }
}

/// Makes `call` against `target`; prints the answer (and `note`, on
/// stderr, when it succeeded). `Err` holds what to print on stderr.
pub fn run(target: &Target, call: Result<Call, String>, note: Option<&str>) -> Result<(), String> {
    let token = token(&target.token)?;
    let (method, path, body) = call?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async {
        let url = format!("{}{path}", target.url.trim_end_matches('/'));
        let client = reqwest::Client::new();
        let mut req = client.request(method, &url).bearer_auth(token);
        if let Some(b) = body {
            // `null` members of a create body are left out.
            let mut b = b;
            if let Some(o) = b.as_object_mut() {
                o.retain(|_, v| !v.is_null());
            }
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| unreachable(&target.url, &url, &e))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| format!("{url}: {e}"))?;
        if status.is_success() {
            println!("{}", printable(&text));
            if let Some(n) = note {
                eprintln!("budgetgate: {n}");
            }
            Ok(())
        } else {
            let msg = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            Err(format!("{status}: {msg}"))
        }
    })
}
