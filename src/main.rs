//! The `budgetgate` command: `serve`, `check-config`, `estimate`, `hash-key`,
//! `end-user-hash`, `store migrate`, and the control API's `keys`, `tenants`,
//! `admin-tokens`.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use budgetgate::admin_cli;
use budgetgate::admission::plan;
use budgetgate::config::{hash_key, Policy};
use budgetgate::dialects::Dialect;
use budgetgate::estimate::{self, ModelEstimation};

#[derive(Parser)]
#[command(
    name = "budgetgate",
    version,
    about = "An OpenAI-compatible LLM token-budget gateway"
)]
struct Cli {
    /// Log as JSON lines instead of text (`BUDGETGATE_LOG_JSON`: `1`,
    /// `true`, `yes`, `on` / `0`, `false`, `no`, `off`).
    #[arg(
        long,
        global = true,
        env = "BUDGETGATE_LOG_JSON",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Config file (TOML).
        #[arg(long, short, env = "BUDGETGATE_CONFIG")]
        config: PathBuf,
        /// Listen address, overriding `server.listen`.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Serving threads, each with its own single-threaded runtime,
        /// listener (SO_REUSEPORT), upstream and store connections; 0 means
        /// one per available CPU.
        #[arg(long, env = "BUDGETGATE_THREADS", default_value_t = 0)]
        threads: usize,
    },
    /// Validate a config file; print every validation error with its path
    /// (a TOML syntax error, an unknown field or a wrong type: the parser's
    /// first, with its line and column).
    CheckConfig {
        /// Config file (TOML).
        #[arg(long, short, env = "BUDGETGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Config file (TOML), as an argument: `check-config FILE` (wins over
        /// `BUDGETGATE_CONFIG`).
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Print the cost breakdown of a request body (tokens, and dollars on
    /// each priced deployment).
    Estimate {
        /// Config file (TOML).
        #[arg(long, short, env = "BUDGETGATE_CONFIG")]
        config: PathBuf,
        /// Public model name.
        #[arg(long, short)]
        model: Option<String>,
        /// Endpoint: chat, completions, embeddings, responses or messages.
        #[arg(long, default_value = "chat")]
        endpoint: String,
        /// Request body file, or `-` for stdin.
        #[arg(default_value = "-")]
        file: String,
    },
    /// Read an API key on stdin, print its SHA-256 digest for `keys[].sha256`.
    HashKey,
    /// Spend from the ledger of a running gateway (docs/LEDGER.md): totals
    /// by tenant, key, model, end user, day or month; top N; CSV.
    Spend(budgetgate::ledger::cli::SpendArgs),
    /// Compare the ledger with the store's calendar quota counters and
    /// explain the difference (docs/LEDGER.md, "Reconciliation"); exits 1
    /// when an unexplained difference passes --threshold.
    Reconcile(budgetgate::ledger::cli::ReconcileArgs),
    /// Why was this request refused? The kept record of its refusal
    /// (docs/API.md, "Why was this refused?").
    Explain {
        #[command(flatten)]
        target: admin_cli::Target,
        /// The request id the client saw (`x-request-id`, `request-id`).
        request_id: String,
    },
    /// Print the hash an end user's id goes by in refusals, logs and
    /// budgets (keyed with the secret in `server.end_user_key_env`), to find
    /// one user's refusals.
    EndUserHash {
        /// Config file (TOML).
        #[arg(long, short, env = "BUDGETGATE_CONFIG")]
        config: PathBuf,
        /// The tenant whose requests name the end user.
        tenant: String,
        /// The end-user id as clients send it; read from stdin when absent
        /// (keeps it out of the shell's history).
        id: Option<String>,
    },
    /// The Redis store's key layouts (docs/OPERATIONS.md, "Key layout").
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Keys through the admin API of a running gateway.
    Keys {
        #[command(flatten)]
        target: admin_cli::Target,
        #[command(subcommand)]
        command: admin_cli::KeysCommand,
    },
    /// Tenants through the admin API of a running gateway.
    Tenants {
        #[command(flatten)]
        target: admin_cli::Target,
        #[command(subcommand)]
        command: admin_cli::TenantsCommand,
    },
    /// Admin tokens (roles `read`, `admin`, optionally tenant-scoped)
    /// through the admin API, with the bootstrap token.
    AdminTokens {
        #[command(flatten)]
        target: admin_cli::Target,
        #[command(subcommand)]
        command: admin_cli::TokensCommand,
    },
}

fn init_logging(json: bool) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // The AWS SDK's signer and providers trace canonical requests (with
    // session tokens) below `info`: never logged, whatever RUST_LOG says.
    for target in [
        "aws_sigv4",
        "aws_config",
        "aws_smithy_runtime",
        "aws_smithy_http_client",
        "aws_credential_types",
        "aws_sdk_sts",
        "aws_runtime",
    ] {
        if let Ok(d) = format!("{target}=info").parse::<tracing_subscriber::filter::Directive>() {
            filter = filter.add_directive(d);
        }
    }
    // Colour codes only for a person at a terminal: redirected to a file or
    // a journal they are noise. `NO_COLOR` (no-color.org) turns them off too.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    if json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .init();
    }
}

/// jemalloc instead of glibc's malloc: a request allocates and frees many
/// blocks above glibc's 1 KB thread-cache limit (header maps, the Redis
/// command, body buffers), whose slow path (bin consolidation) was ~20% of
/// the gateway's CPU under load. Measured with `scripts/bench.sh`: ~15% less
/// CPU per request and a lower idle RSS (50 MB against 54 MB).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start (the `_RJEM_MALLOC_CONF`
/// variable still overrides them). `tcache_gc_incr_bytes`: the thread
/// caches are garbage-collected after every 4 MiB allocated instead of
/// every 64 KiB (jemalloc's default); at 64 KiB the collection ran a few
/// times per request and was ~5% of a request's instructions
/// (docs/PERFORMANCE.md). A thread cache stays bounded by its slots per
/// size class whatever the interval, so only when unused cached blocks go
/// back to the arena changes.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"tcache_gc_incr_bytes:4194304\0";

#[derive(Subcommand)]
enum StoreCommand {
    /// Copy each budget's counters from the `single` layout's keys to the
    /// `tenant` layout's, where the `tenant` layout has none yet: run it
    /// before the first gateway of the `tenant` layout starts (running it
    /// again changes nothing).
    Migrate {
        /// Config file (TOML): the store, and the tenants and models that
        /// place budgets in the `tenant` layout.
        #[arg(long, short, env = "BUDGETGATE_CONFIG")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            config,
            listen,
            threads,
        } => {
            init_logging(cli.log_json);
            let policy = match Policy::load(&config) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("{}: {e}", config.display());
                    return ExitCode::FAILURE;
                }
            };
            // Only the configured encodings: each one costs tens of MB of RSS.
            let mut encodings: Vec<_> = policy.models.iter().map(|m| m.encoding).collect();
            encodings.dedup();
            for enc in encodings {
                enc.warm_up();
            }
            let mut launch = budgetgate::app::Launch::new(policy, config);
            launch.listen = listen;
            if threads > 0 {
                launch.threads = threads;
            }
            match budgetgate::app::run_blocking(launch) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("budgetgate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::CheckConfig { config, file } => {
            let Some(config) = file.or(config) else {
                eprintln!("budgetgate check-config: give the config file: `check-config FILE`, `--config FILE` or BUDGETGATE_CONFIG");
                return ExitCode::from(2);
            };
            check_config(&config)
        }
        Command::Estimate {
            config,
            model,
            endpoint,
            file,
        } => estimate_cmd(config, model, &endpoint, &file),
        Command::Spend(args) => {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("cannot start a runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(budgetgate::ledger::cli::run(&args)) {
                Ok(body) => {
                    println!("{}", admin_cli::printable(&body));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Reconcile(args) => reconcile_cmd(&args),
        Command::Explain { target, request_id } => {
            admin(&target, Ok(admin_cli::explain_call(&request_id)), None)
        }
        Command::HashKey => {
            let mut key = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut key) {
                eprintln!("cannot read stdin: {e}");
                return ExitCode::FAILURE;
            }
            let key = key.trim_end_matches(['\n', '\r']);
            if key.is_empty() {
                eprintln!("no key on stdin");
                return ExitCode::FAILURE;
            }
            println!("{}", hash_key(key));
            ExitCode::SUCCESS
        }
        Command::EndUserHash { config, tenant, id } => end_user_hash(&config, &tenant, id),
        Command::Store {
            command: StoreCommand::Migrate { config },
        } => store_migrate(&config),
        Command::Keys { target, command } => {
            let note = admin_cli::keys_note(&command);
            admin(&target, admin_cli::keys_call(command), note)
        }
        Command::Tenants { target, command } => {
            admin(&target, admin_cli::tenants_call(command), None)
        }
        Command::AdminTokens { target, command } => {
            let note = admin_cli::tokens_note(&command);
            admin(&target, admin_cli::tokens_call(command), note)
        }
    }
}

fn store_migrate(config: &std::path::Path) -> ExitCode {
    use budgetgate::budget::keys::KeySpace;
    use budgetgate::budget::placement::Layout;
    use budgetgate::config::store::StoreKind;
    let policy = match Policy::load(config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::FAILURE;
        }
    };
    let StoreKind::Redis { url } = &policy.store.kind else {
        eprintln!(
            "{}: store.kind is not \"redis\": the memory store has no key layouts to migrate",
            config.display()
        );
        return ExitCode::FAILURE;
    };
    let single = KeySpace::new(&policy.store.key_prefix, &policy.store.domain);
    let tenant = single
        .clone()
        .with_layout(Layout::Tenant, Some(policy.tenant_placement()));
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A one-off scan: each call may take longer than a request's store call.
    let timeout = policy.store.timeout.max(std::time::Duration::from_secs(5));
    match rt.block_on(budgetgate::budget::redis::migrate::migrate(
        url, timeout, &single, &tenant,
    )) {
        Ok(m) => {
            println!("store migrate: {m}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "store migrate: {e} (store.url {})",
                budgetgate::upstreams::redact::endpoint(url)
            );
            ExitCode::FAILURE
        }
    }
}

fn reconcile_cmd(args: &budgetgate::ledger::cli::ReconcileArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(budgetgate::ledger::cli::reconcile(args)) {
        Ok(r) => {
            println!("{}", admin_cli::printable(&r.body));
            for line in &r.unexplained {
                eprintln!("budgetgate: unexplained: {line}");
            }
            if r.unexplained.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

fn admin(
    target: &admin_cli::Target,
    call: Result<admin_cli::Call, String>,
    note: Option<&str>,
) -> ExitCode {
    match admin_cli::run(target, call, note) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("budgetgate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn end_user_hash(config: &std::path::Path, tenant: &str, id: Option<String>) -> ExitCode {
    let policy = match Policy::load(config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::FAILURE;
        }
    };
    let Some(t) = policy.tenants.iter().find(|t| t.name == tenant) else {
        eprintln!("unknown tenant {tenant:?} in {}", config.display());
        return ExitCode::FAILURE;
    };
    if !t.reads_end_user {
        eprintln!(
            "tenant {tenant:?} has no end-user settings (end_user_limits, end_user_required) in its tree: its requests' end-user ids are not read, so no hash of them appears anywhere"
        );
        return ExitCode::FAILURE;
    }
    let id = match id {
        Some(id) => id,
        None => {
            let mut s = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut s) {
                eprintln!("cannot read stdin: {e}");
                return ExitCode::FAILURE;
            }
            s.trim_end_matches(['\n', '\r']).to_string()
        }
    };
    let max = budgetgate::lifecycle::end_user::MAX_ID_BYTES;
    if id.is_empty() || id.len() > max {
        eprintln!(
            "an end-user id is 1 to {max} bytes (this one: {}); an empty id counts as none",
            id.len()
        );
        return ExitCode::FAILURE;
    }
    // Loading checked it: a tree with end-user settings has a key.
    let Some(key) = &policy.end_user_key else {
        eprintln!(
            "environment variable {} holds no end-user key",
            policy.server.end_user_key_env
        );
        return ExitCode::FAILURE;
    };
    println!("{}", key.hash(id.as_bytes()));
    ExitCode::SUCCESS
}

fn check_config(config: &std::path::Path) -> ExitCode {
    match Policy::load(config) {
        Ok(p) => {
            if let Some(files) = &p.server.tls {
                if let Err(e) = budgetgate::tls::load_certified_key(files) {
                    eprintln!("{e}");
                    eprintln!("{}: 1 error(s)", config.display());
                    return ExitCode::FAILURE;
                }
            }
            // Not errors (the gateway runs and refuses those requests
            // clearly), but worth knowing before a tenant finds out.
            let mut warnings = p.renamed_keys.clone();
            warnings.extend(p.unpriced_warnings());
            warnings.extend(p.long_context_warnings());
            for w in &warnings {
                println!("warning: {w}");
            }
            // On stderr, outside the tally: a model without a limit is a
            // supported setup (embeddings models have none to give).
            for w in p.output_limit_warnings() {
                eprintln!("warning: {w}");
            }
            for line in budgetgate::admission::quota_lease::bounds::describe(&p) {
                println!("{line}");
            }
            for line in budgetgate::admission::expected::describe(&p) {
                println!("{line}");
            }
            for line in p.model_pattern_notes() {
                println!("{line}");
            }
            for line in p.deployment_model_notes() {
                println!("{line}");
            }
            for u in &p.upstreams {
                if let Some(b) = &u.bedrock {
                    println!(
                        "upstreams {:?}: kind = \"bedrock\", {:?} API, credentials: {}",
                        u.name,
                        b.api,
                        b.credential_source(u.api_key_env.as_deref())
                    );
                }
            }
            for line in budgetgate::upstreams::vertex::source::describe_policy(&p) {
                println!("{line}");
            }
            println!(
                "{}: ok (policy version {}, {} upstreams, {} models, {} tenants{})",
                config.display(),
                p.version,
                p.upstreams.len(),
                p.models.len(),
                p.tenants.len(),
                if warnings.is_empty() {
                    String::new()
                } else {
                    format!(", {} warning(s)", warnings.len())
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Errors on stderr (stdout stays for the verdict of a valid
            // file), so a script or CI log separates them.
            for line in &e.0 {
                eprintln!("{line}");
            }
            eprintln!("{}: {} error(s)", config.display(), e.0.len());
            ExitCode::FAILURE
        }
    }
}

fn estimate_cmd(config: PathBuf, model: Option<String>, endpoint: &str, file: &str) -> ExitCode {
    let policy = match Policy::load(&config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::FAILURE;
        }
    };
    let endpoint = match endpoint {
        "chat" | "chat/completions" => Dialect::ChatCompletions,
        "completions" => Dialect::Completions,
        "embeddings" => Dialect::Embeddings,
        "messages" => Dialect::Messages,
        "responses" => Dialect::Responses,
        "gemini" => Dialect::Gemini,
        other => {
            eprintln!(
                "unknown endpoint {other:?} (chat, completions, embeddings, responses, messages, gemini)"
            );
            return ExitCode::FAILURE;
        }
    };
    let text = if file == "-" {
        let mut s = String::new();
        if let Err(e) = std::io::stdin().read_to_string(&mut s) {
            eprintln!("cannot read stdin: {e}");
            return ExitCode::FAILURE;
        }
        s
    } else {
        match std::fs::read_to_string(file) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{file}: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let body: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("the body is not JSON: {e}");
            return ExitCode::FAILURE;
        }
    };
    let model_name = model.or_else(|| {
        body.get("model")
            .and_then(|m| m.as_str())
            .map(str::to_string)
    });
    let Some(model_name) = model_name else {
        eprintln!("give --model or a `model` field in the body");
        return ExitCode::FAILURE;
    };
    let Some(m) = policy.model(&model_name) else {
        let names: Vec<&str> = policy.models.iter().map(|m| m.name.as_str()).collect();
        eprintln!(
            "unknown model {model_name:?} (models: {})",
            names.join(", ")
        );
        return ExitCode::FAILURE;
    };
    let resolution = policy
        .describe_resolution(&model_name)
        .unwrap_or_else(|| m.name.clone());
    let ks = plan::key_space(&policy);
    let candidates = plan::candidate_budgets(&ks, &policy, m);
    let room = plan::token_room(&[], &candidates);
    let me = ModelEstimation {
        encoding: m.encoding,
        default_max_output_tokens: m.default_max_output_tokens,
        max_output_tokens: m.refused_above(),
        min_output_tokens: policy.min_output_tokens,
        token_ratio: m.token_ratio,
        image: m.image,
    };
    match estimate::estimate(endpoint, &body, &me, &policy.estimation, room) {
        Ok(e) => {
            println!("model:             {resolution}");
            println!("encoding:          {}", m.encoding);
            println!("input tokens:      {}", e.input_tokens);
            println!("output per choice: {}", e.output_tokens_per_choice);
            println!("choices:           {}", e.choices);
            println!("output reserved:   {}", e.output_tokens);
            println!("total reserved:    {}", e.total_tokens);
            print_costs(&policy, m, endpoint, &body, &e);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            if let Some(hint) = endpoint_hint(endpoint, &body) {
                eprintln!("{hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The dollar cost the reservation of `e` would have on each deployment
/// of `m`, at its prices (docs/MONEY.md), beside the tokens.
fn print_costs(
    policy: &Policy,
    m: &budgetgate::config::ModelPolicy,
    endpoint: Dialect,
    body: &serde_json::Value,
    e: &estimate::Estimate,
) {
    let cache = budgetgate::lifecycle::pricing::cache_writes(endpoint, body);
    for &u in &m.upstreams {
        let upstream = &policy.upstreams[u];
        match m.price_on(upstream) {
            Some(p) => {
                let micros =
                    p.at(e.input_tokens)
                        .reservation(e.input_tokens, e.output_tokens, cache);
                println!(
                    "cost reserved:     ${} on {} ({micros} µ$)",
                    budgetgate::money::format_usd(micros as i64),
                    upstream.name
                );
            }
            None => println!("cost reserved:     not priced on {}", upstream.name),
        }
    }
}

/// A hint when `body` looks written for another endpoint than the one
/// asked for (e.g. an embeddings body estimated as chat).
fn endpoint_hint(endpoint: Dialect, body: &serde_json::Value) -> Option<&'static str> {
    let has = |field: &str| body.get(field).is_some();
    match endpoint {
        Dialect::ChatCompletions if !has("messages") && has("input") => {
            Some("hint: this looks like an embeddings body; add `--endpoint embeddings`")
        }
        Dialect::ChatCompletions if !has("messages") && has("prompt") => {
            Some("hint: this looks like a legacy completions body; add `--endpoint completions`")
        }
        Dialect::Embeddings | Dialect::Completions if has("messages") => {
            Some("hint: this looks like a chat body; add `--endpoint chat` (the default)")
        }
        Dialect::ChatCompletions | Dialect::Completions if has("input") => {
            Some("hint: this looks like an embeddings body; add `--endpoint embeddings`")
        }
        _ => None,
    }
}
