//! Wiring: build the store a policy asks for, bind, serve until shutdown.
//!
//! Graceful shutdown (SIGTERM or ctrl-c): stop accepting connections, let
//! in-flight requests and streams finish for up to `server.shutdown_grace_secs`,
//! then cut off the streams still running (a clean final chunk with
//! `finish_reason: "length"` and `[DONE]`) and end the requests still waiting
//! for their upstream (503), wait for every settlement, and return.
//! Hot reload (SIGHUP, file change) runs alongside ([`crate::config::reload`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::admission::quota_lease::{LeaseOff, QuotaLeases};
use crate::budget::memory::MemoryStore;
use crate::budget::redis::RedisStore;
use crate::budget::BudgetStore;
use crate::clock::{Clock, SystemClock};
use crate::config::reload;
use crate::config::store::LeaseMode;
use crate::config::{Policy, StoreKind};
use crate::connections::{Accept, Connections, PlainListener};
use crate::gateway::AppState;
use crate::server::{budget_view, router};
use crate::tls::Tls;
use crate::upstreams::redact;

/// Builds the store `policy` configures, reading time from `clock`. The
/// memory store built here is the in-process one without persistence
/// (tests, tools); `serve` uses [`build_serving_store`].
pub async fn build_store(
    policy: &Policy,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn BudgetStore>, String> {
    match &policy.store.kind {
        StoreKind::Memory => Ok(Arc::new(MemoryStore::new(clock))),
        StoreKind::Redis { url } => {
            // Redis mode reads time from Redis TIME (one clock for the fleet), not `clock`.
            let store = RedisStore::from_policy(&policy.store)
                .await
                .map_err(|e| format!("store.url {}: {e}", redact::endpoint(url)))?;
            Ok(Arc::new(store))
        }
    }
}

/// The quota leases of a Redis store with `lease = "auto"`, on a
/// connection of their own (lease calls never queue behind reservations).
async fn build_leases(policy: &Policy) -> Result<Option<Arc<QuotaLeases>>, String> {
    let StoreKind::Redis { url } = &policy.store.kind else {
        return Ok(None);
    };
    let lease = &policy.store.lease;
    if lease.mode != LeaseMode::Auto {
        return Ok(None);
    }
    let store = RedisStore::from_policy(&policy.store)
        .await
        .map_err(|e| format!("store.url {}: {e}", redact::endpoint(url)))?;
    // Unique per process and start: lease ids never repeat across restarts.
    let gateway = uuid::Uuid::new_v4().simple().to_string();
    let leases = QuotaLeases::new(
        lease,
        LeaseOff::of(lease),
        Arc::new(store),
        policy.store.timeout,
        &gateway[..12],
    );
    // Two domains make an exact deployment budget a second call: a
    // leased one beside exact tenant budgets saves it.
    leases.set_split(policy.store.layout == crate::budget::placement::Layout::Tenant);
    Ok(Some(Arc::new(leases)))
}

/// The store `serve` runs on: as [`build_store`], except that the memory
/// store persists its state (`store.snapshot_path`, default data directory)
/// and is returned as well, for its final snapshot at shutdown.
async fn build_serving_store(
    policy: &Policy,
    clock: Arc<dyn Clock>,
) -> Result<(Arc<dyn BudgetStore>, Option<Arc<MemoryStore>>), String> {
    match &policy.store.kind {
        StoreKind::Memory => {
            let path = policy
                .store
                .snapshot_path
                .clone()
                .unwrap_or_else(crate::budget::memory::snapshot::default_path);
            let store = Arc::new(MemoryStore::persistent(clock, &path)?);
            Ok((store.clone(), Some(store)))
        }
        StoreKind::Redis { .. } => Ok((build_store(policy, clock).await?, None)),
    }
}

/// How long connections may take to close after the cutoff before the
/// server stops waiting for them (a client that stopped reading).
const AFTER_CUTOFF: Duration = Duration::from_secs(5);

/// How often histogram samples are folded into buckets when nobody scrapes.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// How often the remaining-share gauges are read from the store.
const BUDGET_GAUGES: Duration = Duration::from_secs(10);

/// Serves one listener until `shutdown` resolves, then drains gracefully:
/// returns once every connection is done (or abandoned after the cutoff),
/// without waiting for settlements. With `tls`, connections are TLS
/// ([`crate::tls`]). `connections` bounds them across serving threads.
async fn serve_connections(
    listener: TcpListener,
    state: Arc<AppState>,
    tls: Option<Arc<Tls>>,
    connections: Arc<Connections>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match tls {
        None => {
            let listener = PlainListener {
                tcp: listener,
                connections: connections.clone(),
            };
            serve_listener(listener, state, connections, shutdown).await
        }
        Some(tls) => {
            let listener = tls.listener(listener, connections.clone())?;
            serve_listener(listener, state, connections, shutdown).await
        }
    }
}

async fn serve_listener<L: Accept>(
    listener: L,
    state: Arc<AppState>,
    connections: Arc<Connections>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let (began_tx, began_rx) = oneshot::channel::<()>();
    let policy = state.policy.clone();
    let server = crate::connections::serve(
        listener,
        app,
        connections,
        move || policy.load().server.connections,
        async move {
            shutdown.await;
            let _ = began_tx.send(());
        },
    );
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => r,
        Ok(()) = began_rx => {
            // Waiters are answered 503 at once: they may go to another gateway.
            state.queue.close();
            drain(&state, &mut server).await
        }
    }
}

async fn wait_for_settlements(state: &AppState) {
    let pending = state.settlements.pending();
    if pending > 0 {
        tracing::info!(pending, "waiting for settlements");
    }
    state.settlements.wait_idle().await;
    tracing::info!(
        settled = state.settlements.settled(),
        failed = state.settlements.failed(),
        "settlements drained"
    );
}

/// The graceful part of shutdown: waits for `server` (which no longer
/// accepts) up to the grace period, then cuts off what is left.
async fn drain(
    state: &AppState,
    server: &mut (impl std::future::Future<Output = std::io::Result<()>> + Unpin),
) -> std::io::Result<()> {
    let grace = state.policy.load().server.shutdown_grace;
    tracing::info!(
        grace_secs = grace.as_secs(),
        "shutting down: no new connections; in-flight requests and streams may finish"
    );
    if let Ok(r) = tokio::time::timeout(grace, &mut *server).await {
        tracing::info!("in-flight requests finished");
        return r;
    }
    tracing::warn!(
        grace_secs = grace.as_secs(),
        "shutdown grace period over: cutting off streams and ending requests still running"
    );
    state.settlements.begin_cutoff();
    match tokio::time::timeout(AFTER_CUTOFF, &mut *server).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("connections still open after the cutoff; closing without them");
            Ok(())
        }
    }
}

/// Serving threads to start when `--threads` is 0: one per available CPU.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs the `serve` command: [`run`] on a single-threaded runtime on this
/// thread, which becomes serving thread 0, until SIGTERM or ctrl-c.
pub fn run_blocking(launch: Launch) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(run(launch, shutdown_signal(), |_| {}))
}

/// Loads the AWS credentials of the policy's SigV4 Bedrock deployments;
/// those that cannot be loaded are skipped (logged, named by `/readyz`,
/// never routed to) until a reload loads them.
async fn load_aws_credentials(state: &AppState) {
    for (deployment, why) in state.upstream.aws.load_all(&state.policy.load_full()).await {
        tracing::warn!(%deployment, error = %why, "deployment skipped: its AWS credentials could not be loaded");
    }
}

async fn load_aws_credentials_of(state: Arc<AppState>) {
    load_aws_credentials(&state).await;
}

/// Checks that no other process listens on `addr`, and resolves port 0 to a
/// free port. `SO_REUSEPORT` (see [`bind_shared`]) would otherwise let a
/// second gateway bind a port a first one holds, and the kernel would
/// silently split the clients between two processes that may run different
/// policies. A plain bind fails with `EADDRINUSE` whatever the holder set.
/// Errors: the bind's own (address in use, permission denied, …).
fn claim_address(addr: std::net::SocketAddr) -> std::io::Result<std::net::SocketAddr> {
    let probe = std::net::TcpListener::bind(addr)?;
    probe.local_addr()
}

/// A listener that other serving threads can bind to as well
/// (`SO_REUSEPORT`: the kernel spreads new connections over them).
fn bind_shared(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// What a gateway starts with. The binary uses [`Launch::new`]; tests
/// change the clock, the store and the sizes, and nothing else: they start
/// the gateway through the same [`run`].
pub struct Launch {
    /// The validated policy.
    pub policy: Policy,
    /// Listen address, overriding `server.listen`.
    pub listen: Option<std::net::SocketAddr>,
    /// The config file, reloaded on SIGHUP and on change.
    pub config_path: std::path::PathBuf,
    /// Serving threads (at least one).
    pub threads: usize,
    /// Time for budgets (the memory store) and for logs and responses.
    pub clock: Arc<dyn Clock>,
    /// The store to run on instead of the one the policy configures
    /// (tests: a store on their clock, or one that fails on demand). It is
    /// shared by every serving thread.
    pub store: Option<Arc<dyn BudgetStore>>,
    /// How often the remaining-share gauges are read from the store; `None`:
    /// never (tests that count store calls).
    pub budget_gauges: Option<Duration>,
}

impl Launch {
    /// The `serve` command's launch: system clock, the store the policy
    /// configures, one serving thread per CPU, every background job.
    pub fn new(policy: Policy, config_path: std::path::PathBuf) -> Self {
        Launch {
            policy,
            listen: None,
            config_path,
            threads: default_threads(),
            clock: Arc::new(SystemClock),
            store: None,
            budget_gauges: Some(BUDGET_GAUGES),
        }
    }
}

/// A gateway that is listening, as [`run`] hands it to its caller.
pub struct Started {
    /// The bound address (port 0 resolved).
    pub addr: std::net::SocketAddr,
    /// Serving thread 0's state; policy, settlements, leases, deny cache
    /// and cool-downs are shared with the other threads.
    pub state: Arc<AppState>,
}

/// Runs a gateway until `shutdown` resolves, then shuts it down gracefully
/// (see the module docs) and returns once every settlement has run.
/// `ready` is called once the gateway listens, before "budgetgate
/// listening on …" is printed; the reload watcher (SIGHUP included) is
/// armed by then.
///
/// Thread per core: the calling runtime serves, and `threads - 1` more OS
/// threads each run their own single-threaded runtime with their own
/// listener on the same address, their own upstream connections and their
/// own store connection (the memory store, or a store given in
/// [`Launch::store`], is one, shared). A request is served start to end on
/// the thread that accepted its connection, so it never waits for another
/// thread to be woken (a profile showed a multi-threaded runtime spent a quarter of
/// its CPU time handing work between threads). Policy, settlements, leases,
/// deny cache and the fallback limiter are shared by all threads.
pub async fn run(
    launch: Launch,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(Started),
) -> Result<(), String> {
    let Launch {
        policy,
        listen,
        config_path,
        threads,
        clock,
        store,
        budget_gauges,
    } = launch;
    let threads = threads.max(1);
    let given_store = store.is_some();
    let tls = policy.server.tls.clone().map(Tls::new).transpose()?;
    let addr = listen.unwrap_or(policy.server.listen);
    // The address first: a second gateway on a taken port says so, before
    // it touches the store (or another gateway's snapshot file).
    let listener = claim_address(addr)
        .and_then(bind_shared)
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let (store, persistent) = match store {
        Some(s) => (s, None),
        None => build_serving_store(&policy, clock.clone()).await?,
    };
    // Runtime tenants and keys join the file's before the first request.
    let (control, policy) = crate::control::open(&policy, &config_path).await?;
    let spans = crate::telemetry::Spans::start(&policy.telemetry)?.map(Arc::new);
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let connections = Connections::new(&policy.server.connections);
    let token_env = policy.server.admin_token_env.clone();
    let shared_store =
        (given_store || matches!(policy.store.kind, StoreKind::Memory)).then(|| store.clone());
    let leases = match given_store {
        false => build_leases(&policy).await?,
        true => None,
    };
    let state = AppState::with_leases(policy, store, clock.clone(), leases.clone());
    // A Bedrock deployment without credentials is skipped, not fatal:
    // the gateway serves its other deployments.
    load_aws_credentials(&state).await;
    // On this runtime, which outlives the serving threads: the token
    // sources' refresh tasks run here.
    state.upstream.vertex_tokens().load(&state.policy.load());
    let keeper = leases.as_ref().map(|l| l.spawn_keeper());
    let token = std::env::var(&token_env).ok().filter(|t| !t.is_empty());
    state.set_admin_token(token.as_deref());
    let control = control.into_plane(
        state.policy.clone(),
        tokio::runtime::Handle::current(),
        state.on_policy_installed(),
    );
    let _ = state.control.set(control.clone());
    let control_tasks = crate::control::sync::spawn(control.clone());
    if let Some(s) = &spans {
        let _ = state.spans.set(s.clone());
    }
    let ledger = crate::ledger::start(&state.policy.load().ledger, control.db(), clock.clone())?;
    let _ = state.spend.set(ledger.spend);
    if let Some(l) = ledger.ledger {
        let _ = state.ledger.set(l);
    }
    let ledger = ledger.writer;
    crate::metrics::register_policy_series(&state.policy.load());
    if budget_gauges.is_some() {
        if let Err(e) = budget_view::refresh_gauges(&state).await {
            tracing::warn!(error = %e, "budget gauges not set at start: the store did not answer; retrying every few seconds");
        }
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    let mut threads_ready = Vec::new();
    for i in 1..threads {
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
        threads_ready.push(ready_rx);
        let base = state.clone();
        let shared_store = shared_store.clone();
        let clock = clock.clone();
        let mut stop = stop_rx.clone();
        let tls = tls.clone();
        let connections = connections.clone();
        let worker = std::thread::Builder::new()
            .name(format!("budgetgate-{i}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("cannot start a runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let store = match shared_store {
                        Some(s) => Ok(s),
                        None => build_store(&base.policy.load(), clock).await,
                    };
                    let bound = store.and_then(|s| {
                        bind_shared(local)
                            .map(|l| (s, l))
                            .map_err(|e| format!("cannot listen on {local}: {e}"))
                    });
                    let (store, listener) = match bound {
                        Ok(x) => x,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let shutdown = async move {
                        let _ = stop.wait_for(|s| *s).await;
                    };
                    if let Err(e) = serve_connections(
                        listener,
                        base.with_store(store),
                        tls,
                        connections,
                        shutdown,
                    )
                    .await
                    {
                        tracing::error!(thread = i, error = %e, "serving thread failed");
                    }
                    // Settlement tasks run on this thread's runtime: it must outlive them.
                    base.settlements.wait_idle().await;
                });
            })
            .map_err(|e| format!("cannot start a serving thread: {e}"))?;
        workers.push(worker);
    }
    let mut failed = None;
    for r in threads_ready {
        match r.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = Some(e),
            Err(_) => failed = Some("a serving thread ended during start-up".into()),
        }
    }
    if let Some(e) = failed {
        let _ = stop_tx.send(true);
        join(workers).await;
        return Err(e);
    }
    // Armed before the gateway says it listens: a SIGHUP sent as soon as
    // it does must reload, not find the default action (exit).
    let reloader = {
        let st = state.clone();
        let control = control.clone();
        tokio::spawn(reload::watch(
            vec![config_path],
            "the config file",
            move |trigger| {
                if let reload::ReloadOutcome::Applied { .. } = control.reload_file(trigger) {
                    let policy = st.policy.load();
                    crate::metrics::register_policy_series(&policy);
                    st.upstream.vertex_tokens().load(&policy);
                    // Checked as at start, on this runtime (the chains'
                    // clients live here, not on a serving thread).
                    tokio::spawn(load_aws_credentials_of(st.clone()));
                    if let Some(l) = st.store.leases() {
                        l.set_policy(&policy.store.lease);
                    }
                }
            },
        ))
    };
    tracing::info!(listen = %local, threads, policy_version = %state.policy.load().version, "budgetgate listening");
    for note in &state.policy.load().renamed_keys {
        tracing::warn!("{note}");
    }
    ready(Started {
        addr: local,
        state: state.clone(),
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("budgetgate listening on {scheme}://{local}");
    let tls_watch = match &tls {
        Some(t) => {
            tracing::info!(fingerprint = %t.fingerprint(), "tls enabled: HTTP/2 and HTTP/1.1 by ALPN");
            t.spawn_watch()
        }
        None => Vec::new(),
    };
    if token.is_some() {
        tracing::info!(token_env = %token_env, "admin API enabled under /admin/v1/");
    } else {
        tracing::info!(token_env = %token_env, "admin API disabled (token variable unset)");
    }
    let gauges = budget_gauges.map(|every| budget_view::spawn_gauges(state.clone(), every));
    let alerts = crate::alerts::watch::spawn(
        crate::alerts::watch::Watched {
            policy: state.policy.clone(),
            clock: state.clock.clone(),
            store: state.store.clone(),
            budgets_of: crate::admission::plan::tenant_specs,
        },
        state.policy.load().alerts.clone(),
    );
    let upkeep = crate::metrics::spawn_upkeep(METRICS_UPKEEP);
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let result = serve_connections(listener, state.clone(), tls, connections, shutdown).await;
    join(workers).await;
    wait_for_settlements(&state).await;
    if let Some(l) = &leases {
        // After the last settlement: what the leases hold goes back whole.
        if let Some(k) = keeper {
            k.abort();
        }
        l.end_all().await;
    }
    if let Some(w) = ledger {
        // After the last settlement: every row is buffered by now.
        w.shutdown(state.policy.load().server.shutdown_grace).await;
    }
    if let Some(s) = spans {
        // After the last settlement: every span is queued by now.
        let _ = tokio::task::spawn_blocking(move || s.shutdown()).await;
    }
    if let Some(m) = persistent {
        // After the last settlement: a graceful shutdown loses nothing.
        m.finish_snapshots();
    }
    upkeep.abort();
    reloader.abort();
    control_tasks.iter().for_each(|t| t.abort());
    if let Some(g) = gauges {
        g.abort();
    }
    if let Some(a) = alerts {
        a.abort();
    }
    tls_watch.iter().for_each(|t| t.abort());
    // The last line: after the ledger's outcome, the spans, the snapshot.
    tracing::info!("shutdown complete");
    result.map_err(|e| e.to_string())
}

/// Waits for serving threads to end without blocking this runtime (its
/// tasks, such as the lease keeper, may still be needed by them).
async fn join(workers: Vec<std::thread::JoinHandle<()>>) {
    for w in workers {
        let _ = tokio::task::spawn_blocking(move || w.join()).await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
