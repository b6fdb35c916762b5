//! The policy side of the `tenant` key layout (`store.layout`): the
//! tenant trees and deployment groups the placement rule
//! (`budget::placement`) reads, recomputed with every policy.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// How stored keys are spread over hash tags (`store.layout`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// One hash tag for the fleet (the default for this release).
    #[default]
    Single,
    /// One hash tag per top-level tenant tree, one per deployment group.
    Tenant,
}

impl Layout {
    /// Config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Single => "single",
            Layout::Tenant => "tenant",
        }
    }
}

/// The tenant tree and deployment groups the `tenant` layout places by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainMap {
    /// `store.domain`: the fleet's namespace, first word of every tag.
    domain: String,
    /// Tenant name → its top-level tenant's name (absent: itself).
    roots: HashMap<Arc<str>, Arc<str>>,
    /// Deployment budget scope → its group's name (absent: itself).
    groups: HashMap<Arc<str>, Arc<str>>,
}

impl DomainMap {
    /// The map of `domain` for tenants `(name, top-level tenant)` and the
    /// deployment budget scopes of each model.
    pub fn new<'a>(
        domain: &str,
        tenants: impl IntoIterator<Item = (&'a str, &'a str)>,
        models: impl IntoIterator<Item = Vec<&'a str>>,
    ) -> Self {
        let roots = tenants
            .into_iter()
            .filter(|(t, r)| t != r)
            .map(|(t, r)| (Arc::from(t), Arc::from(r)))
            .collect();
        Self {
            domain: domain.to_string(),
            roots,
            groups: deployment_groups(models),
        }
    }

    /// The top-level tenant of `tenant`.
    pub fn root_of<'a>(&'a self, tenant: &'a str) -> &'a str {
        self.roots.get(tenant).map_or(tenant, |r| r)
    }

    /// The group (its smallest deployment budget scope) of deployment budget scope `d`.
    pub fn group_of<'a>(&'a self, d: &'a str) -> &'a str {
        self.groups.get(d).map_or(d, |g| g)
    }

    /// The fleet's namespace (`store.domain`).
    pub fn domain(&self) -> &str {
        &self.domain
    }
}

/// Union-find over models: deployments serving a common model share a
/// group, named by its smallest member.
fn deployment_groups<'a>(
    models: impl IntoIterator<Item = Vec<&'a str>>,
) -> HashMap<Arc<str>, Arc<str>> {
    let mut parent: BTreeMap<&'a str, &'a str> = BTreeMap::new();
    fn find<'a>(parent: &mut BTreeMap<&'a str, &'a str>, x: &'a str) -> &'a str {
        let mut root = x;
        while let Some(&p) = parent.get(root) {
            if p == root {
                break;
            }
            root = p;
        }
        // Path compression: every node on the way points at the root.
        let mut cur = x;
        while cur != root {
            let next = parent.get(cur).copied().unwrap_or(root);
            parent.insert(cur, root);
            cur = next;
        }
        root
    }
    for deployments in models {
        for d in &deployments {
            parent.entry(d).or_insert(d);
        }
        let Some((&first, rest)) = deployments.split_first() else {
            continue;
        };
        for &d in rest {
            let (a, b) = (find(&mut parent, first), find(&mut parent, d));
            // The smaller name becomes the root: the group is named by it.
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            parent.insert(hi, lo);
        }
    }
    let names: Vec<&str> = parent.keys().copied().collect();
    let mut out = HashMap::new();
    for d in names {
        let g = find(&mut parent, d);
        if g != d {
            out.insert(Arc::from(d), Arc::from(g));
        }
    }
    out
}
