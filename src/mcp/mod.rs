//! `bgwork mcp`: an MCP server on stdio (rmcp) exposing the calls of SPEC §11 as tools.
//!
//! Each tool call becomes one `wire::Request` to the daemon; the reply object is the
//! tool's structured result (and its JSON text). Every result also carries the
//! session's pending notices in `notices`, so a model hears of ended work on its next
//! call of any tool without polling; they count as delivered once the client's next
//! message arrives ([`notices`]). A long `wait` sends progress notifications when
//! the client gave a progress token, so clients that time out idle calls keep waiting.

mod notices;
mod tools;

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::{Envelope, Request, WireError};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// How often a blocked call reports progress (`BGWORK_MCP_PROGRESS_MS` changes it).
fn progress_every() -> Duration {
    let ms = std::env::var("BGWORK_MCP_PROGRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    Duration::from_millis(ms.unwrap_or(5000).max(10))
}

/// Runs the server on stdin/stdout until the client goes away.
pub fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let server = McpServer::from_env();
        let service = server.serve(rmcp::transport::stdio()).await?;
        service.waiting().await?;
        anyhow::Ok(())
    })
}

pub struct McpServer {
    paths: Arc<Paths>,
    session: String,
    notices: notices::NoticeBox,
}

impl McpServer {
    /// The session is `BGWORK_SESSION`, else a fresh one for this server process.
    pub fn from_env() -> McpServer {
        let session = std::env::var("BGWORK_SESSION")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("mcp-{}-{}", std::process::id(), crate::paths::now_ms()));
        let paths = Arc::new(Paths::from_env());
        McpServer {
            notices: notices::NoticeBox::new(paths.clone(), session.clone()),
            paths,
            session,
        }
    }

    /// Sends one request to the daemon (on a blocking thread: the client is synchronous).
    async fn call(&self, request: Request) -> Result<Value, WireError> {
        let paths = self.paths.clone();
        let envelope = Envelope {
            session: self.session.clone(),
            request,
        };
        tokio::task::spawn_blocking(move || {
            let mut client = Client::connect(&paths)?;
            client.call::<Value>(&envelope)
        })
        .await
        .map_err(|e| WireError::internal(format!("the call failed: {e}")))?
    }
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
        self.notices.arrived().await;
        let tools = tools::definitions()
            .into_iter()
            .map(|(name, description, schema)| {
                let Value::Object(schema) = schema else {
                    unreachable!("every schema is an object")
                };
                Tool::new(name, description, Arc::new(schema))
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.notices.arrived().await;
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
        let outcome = match tools::request(&name, &args) {
            Ok(Request::Notices { peek: false, .. }) => {
                Ok(serde_json::json!({ "notices": self.notices.take().await }))
            }
            Ok(request) => self.call(request).await,
            Err(e) => Err(e),
        };
        if let Some(ticker) = ticker {
            ticker.abort();
        }
        // The notices tool's own result is the notices; every other result carries them.
        let notices = match (&outcome, name.as_str()) {
            (Ok(reply), "notices") => reply["notices"].clone(),
            _ => self.notices.take().await,
        };
        let result = match outcome {
            Ok(Value::Object(mut reply)) => {
                reply.insert("notices".into(), notices);
                CallToolResult::structured(Value::Object(reply))
            }
            Ok(other) => CallToolResult::structured(other),
            Err(error) => {
                let mut object = tools::error_object(&error);
                object["notices"] = notices;
                CallToolResult::structured_error(object)
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}
