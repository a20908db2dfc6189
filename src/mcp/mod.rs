//! `bgwork mcp`: an MCP server on stdio (rmcp) exposing the calls of contract §11 as tools.
//!
//! Each tool call becomes one `wire::Request` to the daemon; the reply object is the
//! tool's structured result (and its JSON text). Every result also carries the
//! session's pending notices in `notices`, so a model hears of ended work on its next
//! call of any tool without polling; they count as delivered once the client's next
//! message arrives ([`notices`]). A long `wait` sends progress notifications when
//! the client gave a progress token, so clients that time out idle calls keep waiting.
//!
//! Every line on stdin gets an answer (`stdio.rs`). A call the client cancels
//! (`notifications/cancelled`) ends its daemon connection at once, so the daemon ends a
//! `wait` too; when stdin ends the server exits a moment later (`ANSWER_AFTER_EOF`),
//! abandoning the calls still in flight.

mod notices;
mod stdio;
mod tools;

use crate::client::{Client, Closer};
use crate::paths::Paths;
use crate::wire::{Envelope, ErrorCode, ProcessKey, Request, WireError};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a blocked call reports progress (`BGWORK_MCP_PROGRESS_MS` changes it).
fn progress_every() -> Duration {
    let ms = std::env::var("BGWORK_MCP_PROGRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    Duration::from_millis(ms.unwrap_or(5000).max(10))
}

/// How long calls in flight may still be answered after stdin ended.
const ANSWER_AFTER_EOF: Duration = Duration::from_secs(1);

/// Runs the server on stdin/stdout until the client goes away. Its session is
/// `session` (`--session` or `BGWORK_SESSION`) when given, else one of its own named
/// after the client and the folder when the first tool is called.
pub fn main(session: Option<String>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // A thread that made a daemon call does not outlive it for long.
        .thread_keep_alive(Duration::from_secs(1))
        .enable_all()
        .build()?;
    let served = runtime.block_on(async {
        let server = McpServer::new(session);
        let (transport, stdin_ended) = stdio::StdioLines::start();
        let service = server.serve(transport).await?;
        // A client that closes stdin is done (the MCP way to stop a stdio server): calls
        // that end within a moment are still answered, the others are abandoned.
        let abandon = async {
            let _ = stdin_ended.await;
            tokio::time::sleep(ANSWER_AFTER_EOF).await;
        };
        tokio::select! {
            quit = service.waiting() => { quit?; }
            () = abandon => {}
        }
        anyhow::Ok(())
    });
    // Calls still in flight (a `wait` whose client closed stdin) are not waited for:
    // their daemon connections close with this process, which ends them in the daemon.
    runtime.shutdown_background();
    served
}

pub struct McpServer {
    paths: Arc<Paths>,
    /// The session given (`--session`, `BGWORK_SESSION`), which never changes.
    given: Option<String>,
    /// The harness process this server runs under, and the server itself: the daemon
    /// gives the session of that harness (contract §11).
    harness: Option<ProcessKey>,
    server: Option<ProcessKey>,
    /// The session of the last call, and the daemon connection that takes notices for
    /// its results.
    current: tokio::sync::Mutex<Option<(String, Arc<notices::NoticeBox>)>>,
}

impl McpServer {
    /// A server for `session`, or for the session of its harness when none is given.
    pub fn new(session: Option<String>) -> McpServer {
        McpServer {
            paths: Arc::new(Paths::from_env()),
            given: session.filter(|s| !s.is_empty()),
            harness: crate::harness::harness_of_this_process(),
            server: crate::harness::this_process(),
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The notices of the session of the last call.
    async fn notice_box(&self) -> Option<Arc<notices::NoticeBox>> {
        self.current.lock().await.as_ref().map(|(_, b)| b.clone())
    }

    /// The client's message arrived: the notices on the result before it were seen.
    async fn message_arrived(&self) {
        if let Some(notices) = self.notice_box().await {
            notices.arrived().await;
        }
    }

    /// The session of this call, and the notices that ride on its result: the given
    /// one, else the one the daemon names for this server's harness process, asked at
    /// every call (a hook may have bound a new conversation of the harness since, as
    /// Claude Code's `/clear` does); see [`McpServer::ask_session`].
    async fn session(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> (String, Arc<notices::NoticeBox>) {
        let mut current = self.current.lock().await;
        let session = match &self.given {
            Some(given) => given.clone(),
            None => {
                let known = current.as_ref().map(|(session, _)| session.clone());
                self.ask_session(context, known).await
            }
        };
        match current.as_ref() {
            Some((same, notices)) if *same == session => (session, notices.clone()),
            _ => {
                let notices =
                    Arc::new(notices::NoticeBox::new(self.paths.clone(), session.clone()));
                *current = Some((session.clone(), notices.clone()));
                (session, notices)
            }
        }
    }

    /// Asks the daemon for the session: `CLIENT@FOLDER` (made unique there) when the
    /// harness process has none yet, so that a person finds it in `bgwork list
    /// --all-sessions`. With no daemon to ask, the session known so far, else a name no
    /// other server process has.
    async fn ask_session(
        &self,
        context: &RequestContext<RoleServer>,
        known: Option<String>,
    ) -> String {
        let client = context
            .peer
            .peer_info()
            .map(|info| info.client_info.name.clone())
            .unwrap_or_default();
        let base = session_base(&client, std::env::current_dir().ok().as_deref());
        if let (Some(known), None) = (&known, &self.harness) {
            // No harness to follow: the session stays the one first given.
            return known.clone();
        }
        let paths = self.paths.clone();
        let request = Request::NewSession {
            base: base.clone(),
            harness: self.harness.clone(),
            server: self.server.clone(),
        };
        let asked = base.clone();
        let claimed = tokio::task::spawn_blocking(move || {
            let mut client = Client::connect(&paths)?;
            let envelope = Envelope {
                session: asked,
                request,
            };
            client.call::<crate::wire::SessionReply>(&envelope)
        })
        .await;
        match claimed {
            Ok(Ok(reply)) => reply.session,
            _ => known.unwrap_or_else(|| format!("{base}-{}", std::process::id())),
        }
    }

    /// Sends one request to the daemon (on a blocking thread: the client is synchronous).
    /// When `cancelled` resolves, or this future is dropped, the daemon connection ends.
    async fn call(
        &self,
        session: &str,
        request: Request,
        cancelled: impl std::future::Future<Output = ()>,
    ) -> Result<Value, WireError> {
        let paths = self.paths.clone();
        let envelope = Envelope {
            session: session.to_string(),
            request,
        };
        let connection = Arc::new(Mutex::new(Connection::default()));
        let abandon_on_drop = Abandon(connection.clone());
        let call = tokio::task::spawn_blocking(move || {
            let mut client = Client::connect(&paths)?;
            {
                let mut connection = connection.lock().unwrap_or_else(|e| e.into_inner());
                if connection.abandoned {
                    return Err(cancelled_error());
                }
                connection.closer = client.closer().ok();
            }
            client.call::<Value>(&envelope)
        });
        let outcome = tokio::select! {
            joined = call => joined
                .map_err(|e| WireError::internal(format!("the call failed: {e}")))
                .and_then(|result| result),
            _ = cancelled => Err(cancelled_error()),
        };
        drop(abandon_on_drop);
        outcome
    }
}

/// `CLIENT@FOLDER` from the client's name in `initialize` and the server's working
/// directory, in plain characters (`claude-code@myproject`).
fn session_base(client: &str, cwd: Option<&std::path::Path>) -> String {
    let plain = |text: &str| {
        let text: String = text
            .chars()
            .map(|c| match c {
                c if c.is_alphanumeric() || "._-".contains(c) => c.to_ascii_lowercase(),
                _ => '-',
            })
            .take(60)
            .collect();
        text.trim_matches('-').to_string()
    };
    let client = Some(plain(client))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "mcp".to_string());
    let folder = cwd
        .and_then(|d| d.file_name())
        .map(|f| plain(&f.to_string_lossy()))
        .filter(|f| !f.is_empty());
    match folder {
        Some(folder) => format!("{client}@{folder}"),
        None => client,
    }
}

/// A daemon call's connection, as far as its async side knows it.
#[derive(Default)]
struct Connection {
    closer: Option<Closer>,
    /// The caller gave up: a connection made from now on is dropped at once.
    abandoned: bool,
}

/// Ends a call's daemon connection when the call is over, cancelled or dropped.
struct Abandon(Arc<Mutex<Connection>>);

impl Drop for Abandon {
    fn drop(&mut self) {
        let mut connection = self.0.lock().unwrap_or_else(|e| e.into_inner());
        connection.abandoned = true;
        connection.closer = None;
    }
}

fn cancelled_error() -> WireError {
    WireError::new(
        ErrorCode::Unavailable,
        "the call was cancelled by the client",
    )
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("bgwork", env!("CARGO_PKG_VERSION")))
            .with_instructions(tools::INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.message_arrived().await;
        let tools = tools::definitions()
            .into_iter()
            .map(|(name, description, schema)| {
                let Value::Object(schema) = schema else {
                    unreachable!("every schema is an object")
                };
                Tool::new(name, description, Arc::new(schema)).annotate(tools::annotations(name))
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.message_arrived().await;
        let name = request.name.to_string();
        let args: Map<String, Value> = request.arguments.unwrap_or_default();
        let ticker = context.meta.get_progress_token().map(|token| {
            let peer = context.peer.clone();
            let every = progress_every();
            tokio::spawn(async move {
                let mut beats = 0.0;
                loop {
                    tokio::time::sleep(every).await;
                    beats += every.as_secs_f64();
                    let note = ProgressNotificationParam::new(token.clone(), beats)
                        .with_message("still waiting");
                    if peer.notify_progress(note).await.is_err() {
                        return;
                    }
                }
            })
        });
        let (session, notice_box) = self.session(&context).await;
        let verbose = matches!(args.get("verbose"), Some(Value::Bool(true)));
        let outcome = match tools::request(&name, &args) {
            Ok(Request::Notices { peek: false, .. }) => {
                let taken = notice_box.take().await;
                let mut reply = serde_json::json!({ "notices": taken.notices });
                if let Some(note) = taken.note() {
                    reply["notices_note"] = note.into();
                }
                Ok(reply)
            }
            Ok(request) => self.call(&session, request, context.ct.cancelled()).await,
            Err(e) => Err(e),
        };
        let outcome = outcome.map(|mut reply| {
            tools::annotate(&mut reply);
            if name == "start" {
                tools::annotate_start(&mut reply);
            }
            if !verbose {
                tools::slim(&mut reply);
            }
            if name == "history" {
                tools::bound_history(&mut reply);
            }
            if name == "list" {
                tools::bound_list(&mut reply);
            }
            reply
        });
        if let Some(ticker) = ticker {
            ticker.abort();
        }
        if context.ct.is_cancelled() {
            // Nobody reads this result (rmcp drops it): take no notices with it.
            let error = outcome.err().unwrap_or_else(cancelled_error);
            return Ok(CallToolResponse::Complete(
                CallToolResult::structured_error(tools::error_object(&error)),
            ));
        }
        // The notices tool's own result is the notices; every other result carries them.
        let (notices, note) = match (&outcome, name.as_str()) {
            (Ok(reply), "notices") => {
                (reply["notices"].clone(), reply.get("notices_note").cloned())
            }
            _ => {
                let taken = notice_box.take().await;
                let note = taken.note().map(Value::from);
                (taken.notices, note)
            }
        };
        if context.ct.is_cancelled() {
            // Cancelled while its notices were taken: nobody reads this result, so they
            // are pending again.
            notice_box.give_back().await;
            let error = outcome.err().unwrap_or_else(cancelled_error);
            return Ok(CallToolResponse::Complete(
                CallToolResult::structured_error(tools::error_object(&error)),
            ));
        }
        let result = match outcome {
            Ok(Value::Object(mut reply)) => {
                reply.insert("notices".into(), notices);
                if let Some(note) = note {
                    reply.insert("notices_note".into(), note);
                }
                CallToolResult::structured(Value::Object(reply))
            }
            Ok(other) => CallToolResult::structured(other),
            Err(error) => {
                let mut object = tools::error_object(&error);
                object["notices"] = notices;
                if let Some(note) = note {
                    object["notices_note"] = note;
                }
                CallToolResult::structured_error(object)
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}
