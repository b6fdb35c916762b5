//! `budgetgate spend`: the spend ledger's queries from the command line,
//! one HTTP call to a running gateway's `/admin/v1/spend` (or
//! `/admin/v1/spend/rows` with `--rows`); the answer is printed (JSON
//! indented as every admin command prints it, CSV as it came), a
//! refusal's message goes to stderr.

use clap::Args;

use crate::admin_call;

/// The arguments of `budgetgate spend`.
#[derive(Debug, Args)]
pub struct SpendArgs {
    /// The gateway's base URL.
    #[arg(long, env = "BUDGETGATE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An admin token.
    #[arg(long, env = "BUDGETGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Group by these (comma-separated): tenant, key, model, end_user,
    /// deployment, dialect, outcome.
    #[arg(long)]
    pub group_by: Option<String>,
    /// Totals per `day` or `month` (UTC).
    #[arg(long)]
    pub period: Option<String>,
    /// First day, YYYY-MM-DD (default: 30 days before `--to`).
    #[arg(long)]
    pub from: Option<String>,
    /// Day after the last, YYYY-MM-DD (default: tomorrow).
    #[arg(long)]
    pub to: Option<String>,
    /// Only this tenant and its descendants.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only the request a client knows by this id (`x-request-id`): every
    /// attempt of it, over all time unless `--from` or `--to` is given.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Only the N largest groups by cost.
    #[arg(long)]
    pub top: Option<usize>,
    /// CSV instead of JSON.
    #[arg(long)]
    pub csv: bool,
    /// The rows themselves instead of totals (at most `--limit`).
    #[arg(long)]
    pub rows: bool,
    /// Most rows with `--rows`.
    #[arg(long)]
    pub limit: Option<usize>,
}

/// The answer's body, or the message to print on failure.
pub async fn run(a: &SpendArgs) -> Result<String, String> {
    let token = admin_call::token(&a.token)?;
    let path = if a.rows {
        "/admin/v1/spend/rows"
    } else {
        "/admin/v1/spend"
    };
    let mut query: Vec<(&str, String)> = Vec::new();
    let mut put = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            query.push((k, v));
        }
    };
    put("group_by", a.group_by.clone());
    put("period", a.period.clone());
    put("from", a.from.clone());
    put("to", a.to.clone());
    put("tenant", a.tenant.clone());
    put("request_id", a.request_id.clone());
    put("top", a.top.map(|n| n.to_string()));
    put("limit", a.limit.map(|n| n.to_string()));
    put("format", a.csv.then(|| "csv".to_string()));
    let query: Vec<String> = query
        .iter()
        .map(|(k, v)| format!("{k}={}", admin_call::enc(v)))
        .collect();
    let mut url = format!("{}{path}", a.url.trim_end_matches('/'));
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    let r = reqwest::Client::new()
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| admin_call::unreachable(&a.url, &url, &e))?;
    let status = r.status();
    let body = r.text().await.map_err(|e| format!("{url}: {e}"))?;
    if status.is_success() {
        return Ok(body);
    }
    let message = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or(body);
    Err(format!("{url}: {}: {message}", status.as_u16()))
}

/// The arguments of `budgetgate reconcile`.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// The gateway's base URL.
    #[arg(long, env = "BUDGETGATE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An admin token.
    #[arg(long, env = "BUDGETGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Only this tenant and its descendants (default: every tenant the
    /// token sees).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Exit non-zero when a quota's unexplained difference passes this
    /// many units (tokens or µ$).
    #[arg(long, default_value_t = 0)]
    pub threshold: u64,
}

/// What `budgetgate reconcile` prints and whether it fails.
pub struct Reconciled {
    /// The answer, as it came.
    pub body: String,
    /// The quotas whose unexplained difference passes the threshold, one
    /// line each (empty: the command succeeds).
    pub unexplained: Vec<String>,
}

/// Runs `budgetgate reconcile`: one call to `/admin/v1/reconcile`.
pub async fn reconcile(a: &ReconcileArgs) -> Result<Reconciled, String> {
    let token = admin_call::token(&a.token)?;
    let mut url = format!(
        "{}/admin/v1/reconcile?threshold={}",
        a.url.trim_end_matches('/'),
        a.threshold
    );
    if let Some(t) = &a.tenant {
        url.push_str(&format!("&tenant={}", admin_call::enc(t)));
    }
    let r = reqwest::Client::new()
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| admin_call::unreachable(&a.url, &url, &e))?;
    let status = r.status();
    let body = r.text().await.map_err(|e| format!("{url}: {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    if !status.is_success() {
        let message = v["error"]["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or(body);
        return Err(format!("{url}: {}: {message}", status.as_u16()));
    }
    let unexplained = v["quotas"]
        .as_array()
        .map(|qs| {
            qs.iter()
                .filter(|q| q["over_threshold"] == true)
                .map(|q| {
                    format!(
                        "{} of {}: store {} and ledger {} differ by {}, {} unexplained ({})",
                        q["budget"].as_str().unwrap_or(""),
                        q["scope"].as_str().unwrap_or(""),
                        q["store"],
                        q["ledger"],
                        q["difference"],
                        q["unexplained"],
                        q["unit"].as_str().unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Reconciled { body, unexplained })
}
