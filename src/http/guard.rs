//! Who may use the strip: a request for the loopback address and port the strip listens
//! on (never another `Host`: no DNS rebinding), carrying the daemon's token (a header, or
//! the cookie that the page's first load sets from its URL), and, when it changes
//! anything, sent by the page itself (`Origin`).

use super::Web;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

/// The cookie that carries the token, named after the port: a browser sends the cookies
/// of 127.0.0.1 to all its ports, so the strips of two homes must not overwrite each
/// other's.
fn cookie_name(port: u16) -> String {
    format!("bgwork_token_{port}")
}
/// The header that carries the token (for scripts).
const TOKEN_HEADER: &str = "x-bgwork-token";

/// Every request passes here first.
pub(super) async fn check(State(web): State<Arc<Web>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if !host_is_ours(headers, web.port) {
        return refuse(
            StatusCode::FORBIDDEN,
            "this page answers only at its loopback address (127.0.0.1 or localhost and its port)",
        );
    }
    // The first load carries the token in its URL: it becomes a cookie, and the URL
    // loses it (so it stays out of the history and of what the page links to).
    if request.method() == Method::GET && request.uri().path() == "/" {
        if let Some(given) = query_token(request.uri().query()) {
            if !same(given, &web.token) {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    "this token is not the daemon's: run `bgwork ui` for the page's address",
                );
            }
            let cookie = format!(
                "{}={}; Path=/; HttpOnly; SameSite=Strict",
                cookie_name(web.port),
                web.token
            );
            return Response::builder()
                .status(StatusCode::SEE_OTHER)
                .header(header::LOCATION, "/")
                .header(header::SET_COOKIE, cookie)
                .header(header::REFERRER_POLICY, "no-referrer")
                .body(Body::empty())
                .unwrap_or_default();
        }
    }
    let by_header = header_token(headers);
    // Every cookie of the name is tried: a page on another port of 127.0.0.1 can set
    // one of the same name (with a longer `Path`, which the browser sends first).
    let allowed = match by_header {
        Some(given) => same(given, &web.token),
        None => cookie_tokens(headers, &cookie_name(web.port)).any(|t| same(t, &web.token)),
    };
    if !allowed {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "no valid token: open the address `bgwork ui` prints (it carries the token)",
        );
    }
    let changes = !matches!(*request.method(), Method::GET | Method::HEAD);
    if changes {
        // A page of another site may send a cookie along, never our `Origin`. A script
        // that shows the token in a header needs none.
        let origin_ok = match headers.get(header::ORIGIN) {
            Some(origin) => origin_is_ours(origin, web.port),
            None => by_header.is_some(),
        };
        if !origin_ok {
            return refuse(
                StatusCode::FORBIDDEN,
                "a request that changes anything must come from the strip's own page",
            );
        }
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{why}\n"),
    )
        .into_response()
}

fn host_is_ours(headers: &HeaderMap, port: u16) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    host == format!("127.0.0.1:{port}") || host == format!("localhost:{port}")
}

fn origin_is_ours(origin: &HeaderValue, port: u16) -> bool {
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    origin == format!("http://127.0.0.1:{port}") || origin == format!("http://localhost:{port}")
}

fn query_token(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
}

fn header_token(headers: &HeaderMap) -> Option<&str> {
    if let Some(token) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return Some(token);
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The values of every cookie called `name` (a browser sends all the cookies of that
/// name whose path matches, longest path first).
fn cookie_tokens<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(move |pair| pair.trim().strip_prefix(name)?.strip_prefix('='))
}

/// Compares in time that does not depend on where the texts differ.
fn same(given: &str, token: &str) -> bool {
    let (a, b) = (given.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The home's token: the one in `path` when it is this user's private file holding a
/// token, else a new random one written there (0600).
pub(super) fn token(path: &Path) -> std::io::Result<String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        let ours = meta.is_file()
            && meta.uid() == nix::unistd::geteuid().as_raw()
            && meta.permissions().mode() & 0o077 == 0;
        if ours {
            let text = std::fs::read_to_string(path)?;
            let text = text.trim();
            if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(text.to_string());
            }
        }
    }
    fresh_token(path)
}

/// A new random token, written in `path` (0600) in place of the one there: the strip
/// moved to another port, which another user may have taken, and an open page sends
/// the old token there.
pub(super) fn fresh_token(path: &Path) -> std::io::Result<String> {
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))?;
    let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let fresh = path.with_extension("token.new");
    let _ = std::fs::remove_file(&fresh);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&fresh)?;
    file.write_all(token.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&fresh, path)?;
    Ok(token)
}
