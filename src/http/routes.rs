//! The strip's routes: its page, the JSON answers of the same requests the CLI sends,
//! and the event streams (`stream.rs`).

use super::{guard, json, stream, Target, Web};
use crate::wire::{Actor, Envelope, ReadArgs, Request, RestartArgs, SendArgs, StopArgs};
use axum::extract::{Json, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use std::sync::Arc;

const PAGE: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/strip.js");
const STYLE: &str = include_str!("page/strip.css");

/// The most of a log one "load earlier" gives.
const EARLIER_MAX: usize = 256 << 10;

pub(super) fn router(web: Arc<Web>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { page(PAGE, "text/html; charset=utf-8") }),
        )
        .route(
            "/strip.js",
            get(|| async { page(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/strip.css",
            get(|| async { page(STYLE, "text/css; charset=utf-8") }),
        )
        .route("/api/items", get(items))
        .route("/api/read", get(read))
        .route("/api/events", get(stream::changes))
        .route("/api/output", get(stream::output))
        .route("/api/screen", get(stream::screen))
        .route("/api/stop", post(stop))
        .route("/api/close", post(close))
        .route("/api/send", post(send))
        .route("/api/restart", post(restart))
        .route("/api/dismiss", post(dismiss))
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such page\n") })
        .layer(axum::middleware::from_fn_with_state(
            web.clone(),
            guard::check,
        ))
        .with_state(web)
}

fn page(body: &'static str, kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

impl Web {
    /// Serves `request` as `session` would send it, and answers its reply line.
    pub(super) async fn ask(&self, session: &str, request: Request) -> Vec<u8> {
        let envelope = Envelope {
            session: session.to_string(),
            request,
        };
        // A request runs to its end even when its page goes first (a tab closed while a
        // restart stops the old item): axum drops a handler whose connection closed.
        let served = tokio::spawn(self.daemon.clone().ask(envelope));
        served.await.unwrap_or_else(|e| {
            crate::wire::encode_result::<()>(&Err(crate::wire::WireError::internal(format!(
                "the daemon failed to serve this request: {e}"
            ))))
        })
    }
}

async fn items(State(web): State<Arc<Web>>) -> Response {
    let request = Request::List {
        all: true,
        all_sessions: true,
    };
    json(web.ask(super::stream::VIEWER, request).await)
}

#[derive(Deserialize)]
struct Range {
    session: String,
    id: String,
    from: u64,
    to: u64,
}

/// Bytes `from..to` of a log (at most [`EARLIER_MAX`]), base64: "load earlier".
async fn read(State(web): State<Arc<Web>>, Query(range): Query<Range>) -> Response {
    let max = range.to.saturating_sub(range.from).min(EARLIER_MAX as u64) as usize;
    let request = Request::Read(ReadArgs {
        id: range.id,
        from: Some(range.from),
        raw: true,
        max_bytes: Some(max.max(1)),
        ..ReadArgs::default()
    });
    json(web.ask(&range.session, request).await)
}

async fn stop(State(web): State<Arc<Web>>, Json(target): Json<Target>) -> Response {
    let request = Request::Stop(StopArgs {
        id: target.id,
        grace_s: None,
        actor: Actor::Person,
    });
    json(web.ask(&target.session, request).await)
}

async fn close(State(web): State<Arc<Web>>, Json(target): Json<Target>) -> Response {
    let request = Request::Close { id: target.id };
    json(web.ask(&target.session, request).await)
}

#[derive(Deserialize)]
struct Keys {
    session: String,
    id: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    keys: Vec<String>,
}

async fn send(State(web): State<Arc<Web>>, Json(keys): Json<Keys>) -> Response {
    let request = Request::Send(SendArgs {
        id: keys.id,
        text: keys.text,
        keys: keys.keys,
    });
    json(web.ask(&keys.session, request).await)
}

async fn restart(State(web): State<Arc<Web>>, Json(target): Json<Target>) -> Response {
    // A person's click carries no environment: the new item gets a plain one, never the
    // daemon's own (that of whichever client started it), and its --env values are
    // asked for as `restart` asks for them. No window: what the new item prints is the
    // agent's to read, and a reply to a click must not count it as read.
    let request = Request::Restart(RestartArgs {
        id: target.id,
        inherit_env: Some(crate::environ::plain()),
        plain_env: true,
        window_ms: Some(0),
        ..RestartArgs::default()
    });
    json(web.ask(&target.session, request).await)
}

async fn dismiss(State(web): State<Arc<Web>>, Json(target): Json<Target>) -> Response {
    let request = Request::Dismiss {
        id: Some(target.id),
        ids: Vec::new(),
    };
    json(web.ask(&target.session, request).await)
}
