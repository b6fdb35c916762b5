//! A gateway in this process, started the way the binary starts one:
//! `app::run` on a serving thread of its own (a single-threaded runtime),
//! with its config written to a file (the reload watcher and SIGHUP are
//! armed), graceful shutdown when dropped. What differs from `serve` is
//! test-sized: a frozen clock, one serving thread, no budget-gauge job
//! (tests count store calls), and optionally a store of the test's own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use budgetgate::admission::plan;
use budgetgate::app::{Launch, Started};
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::{BudgetName, BudgetSpec, BudgetState, BudgetStore, Scope};
use budgetgate::clock::{Clock, ManualClock};
use budgetgate::config::{Policy, StoreKind};
use budgetgate::gateway::AppState;
use tokio::sync::oneshot;

use super::config::TestConfig;
use super::http::Endpoint;
use super::NOON;

/// A gateway running in this process.
pub struct Gateway {
    pub addr: SocketAddr,
    /// Serving thread 0's state (policy, settlements, … are shared by all).
    pub state: Arc<AppState>,
    /// The clock the gateway and its memory store read.
    pub clock: ManualClock,
    /// The store the gateway runs on, under the layers the gateway adds
    /// (deny cache, failure policy): the memory store the harness made, the
    /// Redis store the config names, or the test's own.
    pub store: Arc<dyn BudgetStore>,
    /// The memory store, when the harness made it (not a test's own store).
    memory: Option<Arc<MemoryStore>>,
    /// The config file the gateway runs on (and reloads).
    pub config_path: std::path::PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    /// Holds the config file the reload watcher watches.
    _dir: tempfile::TempDir,
}

impl Endpoint for Gateway {
    fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl TestConfig {
    /// Starts a gateway for this config on a clock frozen at [`NOON`]: a
    /// memory store on that clock, or the Redis store `[store]` names.
    pub async fn start(&self) -> Gateway {
        self.start_at(ManualClock::new(NOON)).await
    }

    /// [`TestConfig::start`] reading time from `clock`.
    pub async fn start_at(&self, clock: ManualClock) -> Gateway {
        let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let policy = self.policy();
        match policy.store.kind {
            StoreKind::Memory => {
                let memory = Arc::new(MemoryStore::new(dyn_clock));
                start(self, clock, memory.clone(), Some(memory)).await
            }
            StoreKind::Redis { .. } => {
                let store = budgetgate::app::build_store(&policy, dyn_clock)
                    .await
                    .unwrap_or_else(|e| panic!("test store: {e}"));
                start(self, clock, store, None).await
            }
        }
    }

    /// Starts a gateway for this config over `store` (a test's own),
    /// reading time from `clock`.
    pub async fn start_with(&self, clock: ManualClock, store: Arc<dyn BudgetStore>) -> Gateway {
        start(self, clock, store, None).await
    }
}

async fn start(
    config: &TestConfig,
    clock: ManualClock,
    store: Arc<dyn BudgetStore>,
    memory: Option<Arc<MemoryStore>>,
) -> Gateway {
    let dir = tempfile::tempdir().expect("temp dir");
    // The control database in the test's own directory unless the test
    // names one (never the user's state directory).
    let mut config = config.clone();
    if config.control.database_url.is_none() {
        config.control.database_url = Some(format!(
            "sqlite://{}",
            dir.path().join("control.db").display()
        ));
    }
    let path = config.write(dir.path());
    let policy = Policy::load(&path).unwrap_or_else(|e| panic!("test config invalid: {e}"));
    let config_path = path.clone();
    let launch = Launch {
        threads: 1,
        clock: Arc::new(clock.clone()),
        store: Some(store.clone()),
        budget_gauges: None,
        ..Launch::new(policy, path)
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (ready_tx, ready_rx) = oneshot::channel::<Started>();
    // Serving thread 0, as `budgetgate serve` runs it.
    std::thread::Builder::new()
        .name("test-gateway".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("gateway runtime");
            let shutdown = async {
                let _ = stop_rx.await;
            };
            let ready = move |s: Started| {
                let _ = ready_tx.send(s);
            };
            if let Err(e) = rt.block_on(budgetgate::app::run(launch, shutdown, ready)) {
                eprintln!("test gateway: {e}");
            }
        })
        .expect("start the gateway thread");
    let started = tokio::time::timeout(Duration::from_secs(30), ready_rx)
        .await
        .expect("the gateway did not start within 30 s")
        .expect("the gateway failed to start (its error is above)");
    Gateway {
        addr: started.addr,
        state: started.state,
        clock,
        store,
        memory,
        config_path,
        shutdown: Some(stop_tx),
        _dir: dir,
    }
}

impl Gateway {
    /// The memory store the harness made for this gateway.
    pub fn memory(&self) -> &MemoryStore {
        self.memory
            .as_deref()
            .expect("this gateway runs on a store the test gave it, not the harness's memory store")
    }

    /// Waits until every settlement task has finished.
    pub async fn settled(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.state.settlements.wait_idle())
            .await
            .expect("settlements did not finish within 10 s");
    }

    /// The budget specs of `scope`'s limits under the active policy.
    pub fn budgets(&self, scope: Scope) -> Vec<BudgetSpec> {
        let policy = self.state.policy.load_full();
        let ks = AppState::key_space(&policy);
        let tenant = |t: &str| {
            policy
                .tenants
                .iter()
                .find(|x| x.name == t)
                .unwrap_or_else(|| panic!("no tenant {t}"))
        };
        let limits = match &scope {
            Scope::Tenant(t) => tenant(t).limits.clone(),
            Scope::Key(t, k) => tenant(t)
                .keys
                .iter()
                .find(|x| x.id == **k)
                .unwrap_or_else(|| panic!("no key {t}/{k}"))
                .limits
                .clone(),
            Scope::TenantModel(t, m) => tenant(t)
                .model_limits
                .get(&**m)
                .unwrap_or_else(|| panic!("no limits of {t} for {m}"))
                .clone(),
            Scope::Upstream(u) => policy
                .upstreams
                .iter()
                .find(|x| x.budget_scope() == &**u)
                .unwrap_or_else(|| panic!("no upstream {u}"))
                .limits
                .clone(),
            Scope::EndUser(t, _) => tenant(t).end_user_limits.clone(),
            Scope::Run(..) => panic!(
                "a run's limits are the run's own: build its specs with admission::plan::run_plan"
            ),
        };
        plan::scope_budgets(&ks, scope, &limits, true)
    }

    /// The scope of end user `id` of tenant `tenant` (its keyed hash under
    /// the active policy's key, [`end_user_key`]).
    pub fn end_user(&self, tenant: &str, id: &str) -> Scope {
        let policy = self.state.policy.load_full();
        let key = policy
            .end_user_key
            .as_ref()
            .expect("the test config has end-user settings");
        Scope::EndUser(tenant.into(), key.hash(id.as_bytes()).into())
    }

    /// The state of budget `name` of `scope`, read from the store.
    pub async fn budget(&self, scope: Scope, name: BudgetName) -> BudgetState {
        let spec: Vec<BudgetSpec> = self
            .budgets(scope.clone())
            .into_iter()
            .filter(|s| s.name == name)
            .collect();
        assert_eq!(spec.len(), 1, "{scope:?} has no {name:?} budget");
        self.store
            .inspect(&spec)
            .await
            .expect("inspect")
            .pop()
            .expect("one state")
    }

    /// What is left of budget `name` of `scope`.
    pub async fn remaining(&self, scope: Scope, name: BudgetName) -> i64 {
        self.budget(scope, name).await.remaining
    }

    /// What is left of budget `name` of tenant `t1`.
    pub async fn t1(&self, name: BudgetName) -> i64 {
        self.remaining(Scope::Tenant("t1".into()), name).await
    }

    /// How much of budget `name` of tenant `t1` is used (limit − remaining).
    pub async fn t1_used(&self, name: BudgetName) -> u64 {
        self.used(Scope::Tenant("t1".into()), name).await
    }

    /// How much of budget `name` of `scope` is used (limit − remaining).
    pub async fn used(&self, scope: Scope, name: BudgetName) -> u64 {
        let s = self.budget(scope, name).await;
        (s.limit as i64 - s.remaining) as u64
    }

    /// Waits (10 s at most) until the memory store holds no reservation and
    /// every settlement task has run: a stream settles after its last
    /// frame, which may be after the client finished reading.
    pub async fn all_settled(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.memory().live_holds() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "a reservation never settled"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.settled().await;
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// The end-user hash key every test gateway uses, set once in this
/// process's environment under the default variable name (every test sets
/// the same value, so the order tests run in does not matter).
pub fn end_user_key() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| {
        // SAFETY: the same value each time, set before any gateway reads it.
        unsafe { std::env::set_var("BUDGETGATE_END_USER_KEY", "test-end-user-key-0123456789") };
    });
}
