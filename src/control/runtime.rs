//! The runtime entities as the gateway serves them: a [`Snapshot`] of the
//! control database (tenants, keys with their secrets' digests, admin
//! tokens, at one version of the counter), and how it merges with the
//! config file into one [`Policy`] ([`compose`]).
//!
//! Runtime tenants are `RawTenant`s, the config file's own type: merged
//! after the file's tenants, they go through the file's validator, so a
//! value refused in the file is refused through the API with the same
//! message, and a changed limit is a policy change like a reload. The
//! policy's version is the file's digest and the counter
//! (`<file>.<counter>`): every change tags decisions anew and rebuilds the
//! budget plans.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use sqlx::Row;

use crate::config::raw::{KeyTerms, RawConfig, RawKey, RawLimits, RawTenant};
use crate::config::{ConfigErrors, Policy};
use crate::db::Db;

/// An admin role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads only.
    Read,
    /// Reads and changes.
    Admin,
}

impl Role {
    /// `read` or `admin`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "read" => Some(Role::Read),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// The name stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }
}

/// One secret of a key: its digest and, after a rotation, the end of
/// its overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// Lower-case hex SHA-256.
    pub sha256: String,
    /// UTC µs from which this secret is refused (`None`: the current one).
    pub retires_at: Option<u64>,
}

/// A key created through the admin API.
#[derive(Debug, Clone)]
pub struct RuntimeKey {
    /// Its tenant (of the file or of the database).
    pub tenant: String,
    /// Key id (scope `key:<tenant>/<id>`).
    pub id: String,
    /// A name for people.
    pub alias: Option<String>,
    /// Free-form owner metadata (JSON object).
    pub owner: serde_json::Value,
    /// Limits of this key alone, as the config file writes them.
    pub limits: RawLimits,
    /// Public model names it may use; `None`: all.
    pub allowed_models: Option<Vec<String>>,
    /// UTC µs from which it is refused.
    pub expires_at: Option<u64>,
    /// UTC µs it was revoked at; a revoked key is not served.
    pub revoked_at: Option<u64>,
    /// UTC µs it was created at.
    pub created_at: u64,
    /// Its secrets (the current one and those still in a rotation overlap).
    pub secrets: Vec<Secret>,
}

/// A runtime tenant: the config file's tenant fields (without keys).
#[derive(Debug, Clone)]
pub struct RuntimeTenant {
    /// As the config file writes a tenant; `keys` is empty.
    pub spec: RawTenant,
    /// UTC µs.
    pub created_at: u64,
    /// UTC µs.
    pub updated_at: u64,
}

/// An admin token of the database (the bootstrap token is not stored).
#[derive(Debug, Clone)]
pub struct AdminToken {
    /// Its id (shown in the audit trail).
    pub id: String,
    /// SHA-256 of the token.
    pub sha256: [u8; 32],
    /// What it may do.
    pub role: Role,
    /// The subtree it is limited to; `None`: every tenant.
    pub tenant: Option<String>,
}

/// Every runtime entity at one version of the counter.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The control database's version counter.
    pub version: i64,
    /// Tenants by creation order.
    pub tenants: Vec<RuntimeTenant>,
    /// Keys, revoked ones included (the API lists them).
    pub keys: Vec<RuntimeKey>,
    /// Admin tokens that are not revoked.
    pub tokens: Vec<AdminToken>,
}

/// A stored value that does not parse (the database was edited by hand).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The query failed (database unreachable).
    #[error("control database: {0}")]
    Db(#[from] sqlx::Error),
    /// A stored JSON value does not parse.
    #[error("control database: {what} does not parse: {error}")]
    Value {
        /// Which row and column.
        what: String,
        /// The parser's message.
        error: serde_json::Error,
    },
}

fn parse<T: serde::de::DeserializeOwned>(
    what: impl FnOnce() -> String,
    text: &str,
) -> Result<T, LoadError> {
    serde_json::from_str(text).map_err(|error| LoadError::Value {
        what: what(),
        error,
    })
}

fn micros(v: Option<i64>) -> Option<u64> {
    v.map(|x| x.max(0) as u64)
}

/// The database's version counter.
pub async fn version(db: &Db) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar::<_, i64>("SELECT version FROM control_version WHERE id = 1")
        .fetch_one(db.pool())
        .await
}

/// Reads every runtime entity, in one transaction (one version).
pub async fn load(db: &Db) -> Result<Snapshot, LoadError> {
    let mut tx = db.pool().begin().await?;
    let snap = load_in(&mut tx).await?;
    tx.commit().await?;
    Ok(snap)
}

/// Reads every runtime entity through `tx` (a write's own transaction
/// reads what it is about to change, under its lock).
pub async fn load_in(tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<Snapshot, LoadError> {
    let version: i64 = sqlx::query_scalar("SELECT version FROM control_version WHERE id = 1")
        .fetch_one(&mut **tx)
        .await?;
    let mut tenants = Vec::new();
    for row in sqlx::query(
        "SELECT name, spec, created_at, updated_at FROM tenants ORDER BY created_at, name",
    )
    .fetch_all(&mut **tx)
    .await?
    {
        let name: String = row.try_get("name")?;
        let spec: String = row.try_get("spec")?;
        let mut spec: RawTenant = parse(|| format!("tenant {name:?}"), &spec)?;
        spec.name = name;
        tenants.push(RuntimeTenant {
            spec,
            created_at: micros(Some(row.try_get("created_at")?)).unwrap_or(0),
            updated_at: micros(Some(row.try_get("updated_at")?)).unwrap_or(0),
        });
    }
    let mut secrets: HashMap<(String, String), Vec<Secret>> = HashMap::new();
    for row in sqlx::query(
        "SELECT sha256, tenant, key_id, retires_at FROM key_secrets ORDER BY created_at DESC",
    )
    .fetch_all(&mut **tx)
    .await?
    {
        secrets
            .entry((row.try_get("tenant")?, row.try_get("key_id")?))
            .or_default()
            .push(Secret {
                sha256: row.try_get("sha256")?,
                retires_at: micros(row.try_get("retires_at")?),
            });
    }
    let mut keys = Vec::new();
    for row in sqlx::query(
        "SELECT tenant, id, alias, owner, limits, allowed_models, expires_at, revoked_at, created_at FROM api_keys ORDER BY created_at, tenant, id",
    )
    .fetch_all(&mut **tx)
    .await?
    {
        let tenant: String = row.try_get("tenant")?;
        let id: String = row.try_get("id")?;
        let what = || format!("key {tenant:?}/{id:?}");
        let limits: String = row.try_get("limits")?;
        let models: String = row.try_get("allowed_models")?;
        let owner: String = row.try_get("owner")?;
        keys.push(RuntimeKey {
            limits: parse(what, &limits)?,
            allowed_models: parse(what, &models)?,
            owner: parse(what, &owner)?,
            alias: row.try_get("alias")?,
            expires_at: micros(row.try_get("expires_at")?),
            revoked_at: micros(row.try_get("revoked_at")?),
            created_at: micros(Some(row.try_get("created_at")?)).unwrap_or(0),
            secrets: secrets.remove(&(tenant.clone(), id.clone())).unwrap_or_default(),
            tenant,
            id,
        });
    }
    let mut tokens = Vec::new();
    for row in
        sqlx::query("SELECT id, sha256, role, tenant FROM admin_tokens WHERE revoked_at IS NULL")
            .fetch_all(&mut **tx)
            .await?
    {
        let id: String = row.try_get("id")?;
        let hex_digest: String = row.try_get("sha256")?;
        let role: String = row.try_get("role")?;
        let mut sha256 = [0u8; 32];
        let (Ok(()), Some(role)) = (
            hex::decode_to_slice(&hex_digest, &mut sha256),
            Role::parse(&role),
        ) else {
            tracing::warn!(token = %id, "control database: admin token with an unreadable digest or role; ignored");
            continue;
        };
        tokens.push(AdminToken {
            id,
            sha256,
            role,
            tenant: row.try_get("tenant")?,
        });
    }
    Ok(Snapshot {
        version,
        tenants,
        keys,
        tokens,
    })
}

/// Where the runtime entities land in the merged file: tenant `name` at
/// `tenants[i]`, key `(tenant, id)` at `tenants[i].keys[j]`.
#[derive(Debug, Default)]
pub struct Placement {
    /// Tenant name → index in the merged `tenants`.
    pub tenants: HashMap<String, usize>,
    /// (tenant, key id) → (tenant index, key index).
    pub keys: HashMap<(String, String), (usize, usize)>,
}

/// An entity of the control database, as the quarantine names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entity {
    /// A runtime tenant.
    Tenant {
        /// Its name.
        name: String,
    },
    /// A runtime key (of a file tenant or of a runtime one).
    Key {
        /// Its tenant.
        tenant: String,
        /// Its id.
        id: String,
    },
}

impl std::fmt::Display for Entity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entity::Tenant { name } => write!(f, "tenant {name:?}"),
            Entity::Key { tenant, id } => write!(f, "key {id:?} of tenant {tenant:?}"),
        }
    }
}

/// An entity of the control database that does not merge with the config
/// file and the rest of the database, and is therefore not served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quarantined {
    /// What is not served.
    #[serde(flatten)]
    pub entity: Entity,
    /// Why, e.g. `its parent "acme" is not defined`.
    pub reason: String,
}

/// Entity → why it is not served.
pub type Quarantine = BTreeMap<Entity, String>;

/// The config file with the snapshot's entities merged in, and where they
/// went. An entity that cannot be placed (a tenant the file also defines,
/// a tenant whose parent or a key whose tenant is neither in the file nor
/// served from the database, a key id the file's tenant also has) is
/// added to `out` and left out, as is every entity already in `out`; the
/// rest is merged. What the validator would refuse is not looked at here
/// ([`compose`] does).
pub fn merge_placing(
    file: &RawConfig,
    snap: &Snapshot,
    out: &mut Quarantine,
) -> (RawConfig, Placement) {
    let file_names: HashSet<&str> = file.tenants.iter().map(|t| t.name.as_str()).collect();
    let tenant_entity = |name: &str| Entity::Tenant {
        name: name.to_string(),
    };
    for t in &snap.tenants {
        if file_names.contains(t.spec.name.as_str()) {
            out.entry(tenant_entity(&t.spec.name)).or_insert_with(|| {
                format!(
                    "tenant {:?} is defined both in the config file and in the control database; the file's is served",
                    t.spec.name
                )
            });
        }
    }
    // A parent that is left out leaves its children out in turn: until no
    // more are.
    loop {
        let served: HashSet<&str> = snap
            .tenants
            .iter()
            .map(|t| t.spec.name.as_str())
            .filter(|n| !out.contains_key(&tenant_entity(n)))
            .collect();
        let mut more = Vec::new();
        for t in &snap.tenants {
            let Some(p) = t.spec.parent.as_deref() else {
                continue;
            };
            if out.contains_key(&tenant_entity(&t.spec.name))
                || file_names.contains(p)
                || served.contains(p)
            {
                continue;
            }
            let why = if snap.tenants.iter().any(|x| x.spec.name == p) {
                format!("its parent {p:?} is quarantined")
            } else {
                format!("its parent {p:?} is not defined")
            };
            more.push((tenant_entity(&t.spec.name), why));
        }
        if more.is_empty() {
            break;
        }
        out.extend(more);
    }
    let mut raw = file.clone();
    let mut at = Placement::default();
    for (i, t) in file.tenants.iter().enumerate() {
        at.tenants.insert(t.name.clone(), i);
    }
    for t in &snap.tenants {
        if out.contains_key(&tenant_entity(&t.spec.name)) {
            continue;
        }
        at.tenants.insert(t.spec.name.clone(), raw.tenants.len());
        raw.tenants.push(t.spec.clone());
    }
    for k in snap.keys.iter().filter(|k| k.revoked_at.is_none()) {
        let entity = Entity::Key {
            tenant: k.tenant.clone(),
            id: k.id.clone(),
        };
        if out.contains_key(&entity) {
            continue;
        }
        let Some(&ti) = at.tenants.get(&k.tenant) else {
            let why = if snap.tenants.iter().any(|x| x.spec.name == k.tenant) {
                format!("its tenant {:?} is quarantined", k.tenant)
            } else {
                format!("its tenant {:?} is not defined", k.tenant)
            };
            out.insert(entity, why);
            continue;
        };
        let tenant = &mut raw.tenants[ti];
        if tenant.keys.iter().any(|x| x.id == k.id) {
            out.insert(
                entity,
                format!(
                    "key {:?} of tenant {:?} is defined both in the config file and in the control database; the file's is served",
                    k.id, k.tenant
                ),
            );
            continue;
        }
        let Some(current) = k.secrets.iter().find(|s| s.retires_at.is_none()) else {
            continue;
        };
        at.keys
            .insert((k.tenant.clone(), k.id.clone()), (ti, tenant.keys.len()));
        tenant.keys.push(RawKey {
            id: k.id.clone(),
            sha256: current.sha256.clone(),
            limits: k.limits.clone(),
            output_reservation: None,
            terms: KeyTerms {
                expires_at: k.expires_at,
                allowed_models: k.allowed_models.clone(),
                retiring: k
                    .secrets
                    .iter()
                    .filter_map(|s| Some((s.sha256.clone(), s.retires_at?)))
                    .collect(),
            },
            ..RawKey::default()
        });
    }
    (raw, at)
}

/// The config file with the snapshot's entities merged in, and where they
/// went; an entity that cannot be placed is an error naming it (what a
/// change through the API is held to).
pub fn merge(file: &RawConfig, snap: &Snapshot) -> Result<(RawConfig, Placement), ConfigErrors> {
    let mut out = Quarantine::new();
    let merged = merge_placing(file, snap, &mut out);
    if out.is_empty() {
        Ok(merged)
    } else {
        Err(ConfigErrors(
            out.into_iter().map(|(e, why)| describe(&e, &why)).collect(),
        ))
    }
}

/// `tenant "x": why` (a reason that names the entity already is kept as is).
pub fn describe(entity: &Entity, why: &str) -> String {
    if why.starts_with("tenant ") || why.starts_with("key ") {
        why.to_string()
    } else {
        format!("{entity}: {why}")
    }
}

/// What the gateway serves: the policy, and the entities of the database
/// left out of it.
#[derive(Debug)]
pub struct Composed {
    /// The config file merged with every entity that merges.
    pub policy: Policy,
    /// The others, by entity.
    pub quarantine: Quarantine,
}

impl Composed {
    /// The quarantine as a list (by entity).
    pub fn quarantined(&self) -> Vec<Quarantined> {
        list(&self.quarantine)
    }
}

/// `q` as a list, by entity.
pub fn list(q: &Quarantine) -> Vec<Quarantined> {
    q.iter()
        .map(|(entity, reason)| Quarantined {
            entity: entity.clone(),
            reason: reason.clone(),
        })
        .collect()
}

/// The policy of the config file `file` (version `file_version`) with the
/// snapshot's entities: what the gateway serves. One entity that does not
/// merge never keeps the others out: it is quarantined (left out, with
/// why), and so is what depends on it (a tenant's children and keys).
/// Each validator error is traced to a runtime entity a place it names is
/// (its path, else another place its message names: a secret configured
/// twice names both keys, and the file's key keeps it). An error that
/// names no runtime entity fails the whole: the file's own, or one of
/// the merge the validator does not trace, which keeps the running
/// policy rather than quarantine what it may not concern.
pub fn compose(
    file: &RawConfig,
    file_version: &str,
    snap: &Snapshot,
) -> Result<Composed, ConfigErrors> {
    compose_with(file, file_version, snap, Policy::from_raw)
}

/// [`compose`] with the validator `validate` (a test can give one whose
/// errors name nothing).
fn compose_with(
    file: &RawConfig,
    file_version: &str,
    snap: &Snapshot,
    validate: impl Fn(RawConfig, String) -> Result<Policy, ConfigErrors>,
) -> Result<Composed, ConfigErrors> {
    let version = format!("{file_version}.{}", snap.version);
    let mut quarantine = Quarantine::new();
    loop {
        let (raw, at) = merge_placing(file, snap, &mut quarantine);
        let errors = match validate(raw, version.clone()) {
            Ok(policy) => return Ok(Composed { policy, quarantine }),
            Err(e) => e.0,
        };
        let places = Places::of(&at, file.tenants.len());
        let before = quarantine.len();
        let mut untraced = Vec::new();
        for error in errors {
            match places.trace(&error) {
                Some((entity, why)) => {
                    quarantine.entry(entity).or_insert(why);
                }
                None => untraced.push(error),
            }
        }
        // What is left out may have caused the rest: validate again.
        if quarantine.len() > before {
            continue;
        }
        // The file alone failing: its own errors, as a file without a
        // database gets them.
        let none = Snapshot {
            version: snap.version,
            ..Snapshot::default()
        };
        let (alone, _) = merge_placing(file, &none, &mut Quarantine::new());
        validate(alone, version.clone())?;
        return Err(ConfigErrors(
            untraced
                .into_iter()
                .map(|e| {
                    format!("{e} (the config file validates alone, not with the control database's tenants and keys)")
                })
                .collect(),
        ));
    }
}

/// The runtime entities by their place in the merged file.
struct Places<'a> {
    tenants: HashMap<usize, &'a str>,
    keys: HashMap<(usize, usize), &'a (String, String)>,
}

impl<'a> Places<'a> {
    fn of(at: &'a Placement, file_tenants: usize) -> Self {
        Places {
            tenants: at
                .tenants
                .iter()
                .filter(|(_, &i)| i >= file_tenants)
                .map(|(n, &i)| (i, n.as_str()))
                .collect(),
            keys: at.keys.iter().map(|(k, &ij)| (ij, k)).collect(),
        }
    }

    /// The runtime entity of the first place `error` names that is one,
    /// and why it is quarantined: the message relative to it when it is
    /// the error's own path, else the error with that place named.
    fn trace(&self, error: &str) -> Option<(Entity, String)> {
        places_named(error).find_map(|(at, i, j)| {
            let (entity, prefix) = match j.and_then(|j| self.keys.get(&(i, j))) {
                Some((tenant, id)) => (
                    Entity::Key {
                        tenant: tenant.clone(),
                        id: id.clone(),
                    },
                    format!("tenants[{i}].keys[{}]", j.unwrap_or(0)),
                ),
                None => (
                    Entity::Tenant {
                        name: self.tenants.get(&i)?.to_string(),
                    },
                    format!("tenants[{i}]"),
                ),
            };
            let why = if at == 0 {
                let (_, msg) = relative(std::slice::from_ref(&error.to_string()), &prefix)
                    .pop()
                    .unwrap_or((None, error.to_string()));
                msg
            } else {
                let end = at + prefix.len();
                format!("{}{entity}{}", &error[..at], &error[end..])
            };
            Some((entity, why))
        })
    }
}

/// Every `tenants[i]` (with `.keys[j]` right after it) `error` names, as
/// (offset, i, j), in order: its path, then places in its message (an
/// error of another section about a tenant, the other place of a
/// duplicate).
fn places_named(error: &str) -> impl Iterator<Item = (usize, usize, Option<usize>)> + '_ {
    error.match_indices("tenants[").filter_map(|(at, _)| {
        let rest = &error[at + "tenants[".len()..];
        let close = rest.find(']')?;
        let i = rest[..close].parse().ok()?;
        let j = rest[close + 1..]
            .strip_prefix(".keys[")
            .and_then(|r| r.split_once(']'))
            .and_then(|(j, _)| j.parse().ok());
        Some((at, i, j))
    })
}

/// The errors of `errors` about the entity at `prefix` (`tenants[3]`,
/// `tenants[3].keys[1]`) with that prefix taken off their paths (the
/// field's path in an API body); the others as they are.
pub fn relative(errors: &[String], prefix: &str) -> Vec<(Option<String>, String)> {
    errors
        .iter()
        .map(|e| {
            let own = e
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('.'))
                .and_then(|r| r.split_once(": "));
            match own {
                Some((path, msg)) => (Some(path.to_string()), format!("{path}: {msg}")),
                None => (None, e.clone()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[server]
listen = "127.0.0.1:8080"
[[upstreams]]
name = "u"
kind = "self_hosted"
base_url = "http://127.0.0.1:9/v1"
[[models]]
name = "m"
upstreams = ["u"]
[[tenants]]
name = "f"
limits = { tpm = 1000 }
"#;

    fn file() -> RawConfig {
        toml::from_str(FILE).unwrap()
    }

    fn tenant(name: &str, parent: Option<&str>) -> RuntimeTenant {
        RuntimeTenant {
            spec: RawTenant {
                name: name.into(),
                parent: parent.map(str::to_string),
                ..RawTenant::default()
            },
            created_at: 0,
            updated_at: 0,
        }
    }

    fn key(tenant: &str, id: &str) -> RuntimeKey {
        RuntimeKey {
            tenant: tenant.into(),
            id: id.into(),
            alias: None,
            owner: serde_json::Value::Null,
            limits: RawLimits::default(),
            allowed_models: None,
            expires_at: None,
            revoked_at: None,
            created_at: 0,
            secrets: vec![Secret {
                sha256: crate::config::hash_key(&format!("{tenant}/{id}")),
                retires_at: None,
            }],
        }
    }

    fn names(q: &Quarantine) -> Vec<String> {
        q.keys().map(|e| e.to_string()).collect()
    }

    #[test]
    fn an_orphan_and_what_hangs_from_it_are_quarantined_and_the_rest_served() {
        let snap = Snapshot {
            version: 7,
            tenants: vec![
                tenant("a", Some("f")),
                tenant("b", Some("gone")),
                tenant("c", Some("b")),
            ],
            keys: vec![
                key("f", "k"),
                key("a", "k"),
                key("c", "k"),
                key("gone", "k"),
            ],
            tokens: Vec::new(),
        };
        let c = compose(&file(), "v", &snap).expect("composes");
        assert_eq!(
            names(&c.quarantine),
            [
                "tenant \"b\"",
                "tenant \"c\"",
                "key \"k\" of tenant \"c\"",
                "key \"k\" of tenant \"gone\""
            ]
        );
        assert_eq!(
            c.quarantine[&Entity::Tenant { name: "c".into() }],
            "its parent \"b\" is quarantined"
        );
        let served: Vec<(&str, usize)> = c
            .policy
            .tenants
            .iter()
            .map(|t| (t.name.as_str(), t.keys.len()))
            .collect();
        assert_eq!(served, [("f", 1), ("a", 1)]);
        assert_eq!(c.policy.version, "v.7");
        assert!(merge(&file(), &snap).is_err(), "the API's merge refuses it");
    }

    #[test]
    fn what_the_validator_refuses_is_traced_to_its_runtime_entity() {
        // Five deep under the file's root: the fifth is refused (at most 4).
        let snap = Snapshot {
            version: 1,
            tenants: vec![
                tenant("a", Some("f")),
                tenant("b", Some("a")),
                tenant("c", Some("b")),
                tenant("d", Some("c")),
                tenant("e", Some("d")),
            ],
            keys: vec![key("d", "k"), key("e", "k")],
            tokens: Vec::new(),
        };
        let c = compose(&file(), "v", &snap).expect("composes");
        assert_eq!(
            names(&c.quarantine),
            [
                "tenant \"d\"",
                "tenant \"e\"",
                "key \"k\" of tenant \"d\"",
                "key \"k\" of tenant \"e\""
            ]
        );
        let why = &c.quarantine[&Entity::Tenant { name: "d".into() }];
        assert!(why.starts_with("parent: "), "{why}");
        assert_eq!(c.policy.tenants.len(), 4);
    }

    #[test]
    fn a_secret_the_file_also_configures_quarantines_the_database_key_alone() {
        // The file's later tenant `g` takes the secret of the database's
        // key `moved` of the file's earlier tenant `f`: the validator
        // reports it on the file's key; the database's is the one left out.
        let mut file = file();
        let mut g = RawTenant {
            name: "g".into(),
            ..RawTenant::default()
        };
        g.keys.push(RawKey {
            id: "pinned".into(),
            sha256: crate::config::hash_key("f/moved"),
            ..RawKey::default()
        });
        file.tenants.push(g);
        let snap = Snapshot {
            version: 3,
            tenants: vec![tenant("rt", Some("f"))],
            keys: vec![key("f", "moved"), key("f", "other"), key("rt", "k")],
            tokens: Vec::new(),
        };
        let c = compose(&file, "v", &snap).expect("composes");
        assert_eq!(names(&c.quarantine), ["key \"moved\" of tenant \"f\""]);
        let why = &c.quarantine[&Entity::Key {
            tenant: "f".into(),
            id: "moved".into(),
        }];
        assert!(
            why.contains("tenants[1].keys[0].sha256")
                && why.contains("also at key \"moved\" of tenant \"f\""),
            "{why}"
        );
        let served: Vec<(&str, Vec<&str>)> = c
            .policy
            .tenants
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.keys.iter().map(|k| k.id.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            served,
            [
                ("f", vec!["other"]),
                ("g", vec!["pinned"]),
                ("rt", vec!["k"])
            ]
        );
    }

    #[test]
    fn an_error_traced_to_no_entity_fails_instead_of_quarantining_the_unrelated() {
        let snap = Snapshot {
            version: 1,
            tenants: vec![tenant("a", Some("f"))],
            keys: vec![key("f", "k"), key("a", "k")],
            tokens: Vec::new(),
        };
        let files_tenants = file().tenants.len();
        // A merge-wide error naming no place (the file alone validates).
        let validate = |raw: RawConfig, version: String| {
            if raw.tenants.len() > files_tenants || raw.tenants.iter().any(|t| !t.keys.is_empty()) {
                return Err(ConfigErrors(vec!["store.domain: boom".into()]));
            }
            Policy::from_raw(raw, version)
        };
        let e = compose_with(&file(), "v", &snap, validate).expect_err("not served");
        assert_eq!(e.0.len(), 1, "{e:?}");
        assert!(e.0[0].starts_with("store.domain: boom"), "{e:?}");
    }

    #[test]
    fn a_name_the_file_defines_is_the_files_and_a_bad_file_is_the_only_failure() {
        let snap = Snapshot {
            version: 1,
            tenants: vec![tenant("f", None)],
            keys: vec![key("f", "k")],
            tokens: Vec::new(),
        };
        let c = compose(&file(), "v", &snap).expect("composes");
        assert_eq!(names(&c.quarantine), ["tenant \"f\""]);
        assert_eq!(
            c.policy.tenants[0].keys.len(),
            1,
            "its key is the file tenant's"
        );
        let mut bad = file();
        bad.tenants[0].limits.tpm = Some(0);
        let e = compose(&bad, "v", &snap).expect_err("the file's own error");
        assert!(
            e.0.iter().any(|m| m.contains("tenants[0].limits.tpm")),
            "{e:?}"
        );
    }
}
