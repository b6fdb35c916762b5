//! The live budget page at `/admin/ui`: plain HTML, CSS and
//! JavaScript compiled into the binary (`assets/admin_ui/`), no build step,
//! nothing loaded from elsewhere. It reads `/admin/v1/budgets` every few
//! seconds with the admin token the user types once (kept in the tab's
//! `sessionStorage`, never in a URL).
//!
//! - Served only while the admin API is enabled (otherwise the same 404
//!   with a hint as the admin API). The page itself holds no data: it is
//!   served without a token, and everything it shows needs one.
//! - `Content-Security-Policy: default-src 'self'; frame-ancestors 'none'`:
//!   no inline script or style, no other origin, no framing
//!   (clickjacking); config names are inserted as text, never as HTML.

use std::sync::Arc;

use axum::extract::{OriginalUri, Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::admin;
use crate::gateway::error::ApiError;
use crate::gateway::AppState;

const INDEX_HTML: &str = include_str!("../../assets/admin_ui/index.html");
const APP_JS: &str = include_str!("../../assets/admin_ui/app.js");
const KEYS_JS: &str = include_str!("../../assets/admin_ui/keys.js");
const APP_CSS: &str = include_str!("../../assets/admin_ui/app.css");

/// The page's Content-Security-Policy.
pub const CSP: &str = "default-src 'self'; frame-ancestors 'none'";

fn serve(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// `GET /admin/ui`.
pub async fn page(State(st): State<Arc<AppState>>, uri: OriginalUri) -> Response {
    if st.admin_token_digest().is_none() {
        return admin::disabled(&st, &uri);
    }
    serve(INDEX_HTML, "text/html; charset=utf-8")
}

/// `GET /admin/ui/{asset}`: the page's script and style sheet.
pub async fn asset(
    State(st): State<Arc<AppState>>,
    Path(asset): Path<String>,
    uri: OriginalUri,
) -> Response {
    if st.admin_token_digest().is_none() {
        return admin::disabled(&st, &uri);
    }
    match asset.as_str() {
        "app.js" => serve(APP_JS, "text/javascript; charset=utf-8"),
        "keys.js" => serve(KEYS_JS, "text/javascript; charset=utf-8"),
        "app.css" => serve(APP_CSS, "text/css; charset=utf-8"),
        _ => ApiError::NotFound(uri.path().to_string()).into_response(),
    }
}
