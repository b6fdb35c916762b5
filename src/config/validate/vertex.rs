//! `[upstreams.vertex]` of a deployment: required for `kind = "vertex"`,
//! refused on every other kind.

use super::V;
use crate::config::raw::RawUpstream;
use crate::config::vertex::VertexSettings;
use crate::config::UpstreamKind;

pub(super) fn settings(
    v: &mut V,
    path: &str,
    kind: UpstreamKind,
    u: &RawUpstream,
) -> Option<VertexSettings> {
    if kind != UpstreamKind::Vertex {
        if u.vertex.is_some() {
            v.err(format!("{path}.vertex"), "only for kind = \"vertex\"");
        }
        return None;
    }
    if u.api_key_env.is_some() {
        v.err(
            format!("{path}.api_key_env"),
            "kind = \"vertex\" authenticates with Google credentials (vertex.credentials_file, else Application Default Credentials)",
        );
    }
    VertexSettings::validate(path, u.vertex.as_ref(), |p, m| v.err(p, m))
}
