//! Nested tenants (`parent = "acme"`): each tenant's ancestors, checked
//! at load. Names stay flat and unique; a parent must exist, a chain may
//! not loop, and a tree is at most [`MAX_DEPTH`] tenants deep (a root is
//! at depth 1). Errors name the chain they found, e.g.
//! `tenants[2].parent: cycle ml → team → ml`.

use std::collections::HashMap;

use super::V;
use crate::config::raw::RawConfig;
use crate::config::TenantPolicy;

/// Most tenants from a root down to a leaf, the root included.
pub const MAX_DEPTH: usize = 4;

/// Fills in `parent` and `ancestors` of every tenant, and what each
/// inherits from its ancestors (`end_user_required`, `reads_end_user`).
/// `names` maps tenant names to their index.
pub(super) fn resolve(
    v: &mut V,
    raw: &RawConfig,
    tenants: &mut [TenantPolicy],
    names: &HashMap<String, usize>,
) {
    let parents: Vec<Option<usize>> = raw
        .tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let p = t.parent.as_ref()?;
            let found = names.get(p).copied();
            if found.is_none() {
                v.err(
                    format!("tenants[{i}].parent"),
                    format!("unknown tenant {p:?} ({} → {p})", t.name),
                );
            }
            found
        })
        .collect();
    let depths = depths(&parents);
    for i in 0..tenants.len() {
        match depths[i] {
            Some(d) if d <= MAX_DEPTH => {
                tenants[i].parent = parents[i];
                let mut at = i;
                while let Some(p) = parents[at] {
                    tenants[i].ancestors.push(p);
                    at = p;
                }
            }
            Some(d) => v.err(
                format!("tenants[{i}].parent"),
                format!(
                    "{} is {d} tenants deep; a tree is at most {MAX_DEPTH}",
                    path_of(tenants, &parents, i)
                ),
            ),
            None => v.err(
                format!("tenants[{i}].parent"),
                format!("cycle {}", path_of(tenants, &parents, i)),
            ),
        }
    }
    for i in 0..tenants.len() {
        let lineage = std::iter::once(i).chain(tenants[i].ancestors.iter().copied());
        let (mut required, mut reads) = (false, false);
        for l in lineage {
            required |= tenants[l].end_user_required;
            reads |= tenants[l].end_user_required || !tenants[l].end_user_limits.is_empty();
        }
        tenants[i].end_user_required = required;
        tenants[i].reads_end_user = reads;
    }
}

/// How many tenants each chain holds from the tenant up to its root (1
/// for a root), or `None` when it runs into a cycle. Each tenant is walked
/// once: a chain stops at a tenant already known.
fn depths(parents: &[Option<usize>]) -> Vec<Option<usize>> {
    const NEW: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![NEW; parents.len()];
    let mut depth: Vec<Option<usize>> = vec![None; parents.len()];
    for start in 0..parents.len() {
        let mut path = Vec::new();
        let mut at = start;
        // What the tenant above the walked path resolves to.
        let mut above: Option<usize> = loop {
            match state[at] {
                DONE => break depth[at],
                ON_PATH => {
                    // A cycle: every tenant on it from `at` on is cyclic.
                    let from = path.iter().position(|&t| t == at).unwrap_or(0);
                    for &t in &path[from..] {
                        state[t] = DONE;
                    }
                    path.truncate(from);
                    break None;
                }
                _ => {}
            }
            state[at] = ON_PATH;
            path.push(at);
            match parents[at] {
                Some(p) => at = p,
                None => break Some(0),
            }
        };
        for &t in path.iter().rev() {
            above = above.map(|d| d + 1);
            depth[t] = above;
            state[t] = DONE;
        }
    }
    depth
}

/// `a → b → c`: tenant `i` and the tenants above it, by name, up to the
/// first repeated one (a cycle), at most `2 × MAX_DEPTH` of them.
fn path_of(tenants: &[TenantPolicy], parents: &[Option<usize>], i: usize) -> String {
    let mut names = vec![tenants[i].name.as_str()];
    let mut seen = vec![i];
    let mut at = i;
    while let Some(p) = parents[at] {
        names.push(tenants[p].name.as_str());
        if seen.contains(&p) {
            break;
        }
        if names.len() > 2 * MAX_DEPTH {
            names.push("…");
            break;
        }
        seen.push(p);
        at = p;
    }
    names.join(" → ")
}
