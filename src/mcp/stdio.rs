//! The MCP server's stdio transport: one JSON-RPC message per line, and every line a
//! client writes gets an answer.
//!
//! rmcp's own stdio transport passes over a line that is not JSON (invalid UTF-8, a
//! syntax error, nesting deeper than the parser goes, a line past its size bound) without
//! a word, so a client waits for ever for the answer to that request. This transport
//! reads stdin itself, on a thread of its own: a line that is a JSON-RPC message goes on
//! to rmcp; any other line is answered here, with the JSON-RPC error it deserves
//! (-32700 parse error, -32600 invalid request, -32602 invalid params) and the request's
//! id wherever it can be found, `null` where it cannot. A notification that is not valid
//! gets no answer (JSON-RPC forbids one): a line on stderr says why it was dropped.
//!
//! Every line to stdout goes through one writer thread, so an answer written here never
//! lands inside one of rmcp's; `send` resolves once its line is written and flushed.
//! When stdin ends, `receive` says so at once, and the server stops (see `mcp::main`).

use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use tokio::sync::{mpsc, oneshot};

/// The longest line read whole. No legal tool call comes near it: the daemon refuses a
/// request past 1 MiB.
const MAX_LINE: usize = 4 << 20;
/// How many dropped notifications are reported on stderr.
const NOTES_OF_DROPS: u32 = 20;
/// How much of a longer line is kept to find its id.
const KEPT_OF_LONG_LINE: usize = 64 << 10;

/// The requests this server serves (the others are "method not found").
const SERVED: [&str; 4] = ["initialize", "ping", "tools/list", "tools/call"];

/// JSON-RPC error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;

pub struct StdioLines {
    incoming: mpsc::Receiver<ClientJsonRpcMessage>,
    outgoing: mpsc::Sender<Outgoing>,
}

/// A line for stdout and, for rmcp's own, who waits for it to be written.
struct Outgoing {
    line: Vec<u8>,
    written: Option<oneshot::Sender<std::io::Result<()>>>,
}

impl StdioLines {
    /// Starts the reader (stdin) and writer (stdout) threads; the receiver resolves
    /// when stdin has ended (or failed).
    pub fn start() -> (StdioLines, oneshot::Receiver<()>) {
        // Both bounded: a client that writes and never reads is held back, not buffered.
        let (outgoing, to_stdout) = mpsc::channel::<Outgoing>(64);
        let (messages, incoming) = mpsc::channel(64);
        let (ended, stdin_ended) = oneshot::channel();
        std::thread::spawn(move || write_lines(to_stdout));
        let answers = outgoing.clone();
        std::thread::spawn(move || {
            read_lines(messages, answers);
            let _ = ended.send(());
        });
        (StdioLines { incoming, outgoing }, stdin_ended)
    }
}

impl Transport<RoleServer> for StdioLines {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl std::future::Future<Output = std::io::Result<()>> + Send + 'static {
        let outgoing = self.outgoing.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let (written, done) = oneshot::channel();
            let closed = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout closed");
            outgoing
                .send(Outgoing {
                    line,
                    written: Some(written),
                })
                .await
                .map_err(|_| closed())?;
            done.await.unwrap_or_else(|_| Err(closed()))
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.incoming.recv().await
    }

    async fn close(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes each line whole and flushes it. With stdout gone nobody can hear this server
/// any more: it ends.
fn write_lines(mut lines: mpsc::Receiver<Outgoing>) {
    let mut stdout = std::io::stdout().lock();
    while let Some(Outgoing { line, written }) = lines.blocking_recv() {
        let result = stdout.write_all(&line).and_then(|()| stdout.flush());
        if let Err(e) = &result {
            crate::note!("bgwork mcp: stdout closed ({e}); stopping");
            std::process::exit(1);
        }
        if let Some(written) = written {
            let _ = written.send(result);
        }
    }
}

/// Reads stdin line by line until it ends; messages go to rmcp, the rest is answered.
fn read_lines(messages: mpsc::Sender<ClientJsonRpcMessage>, answers: mpsc::Sender<Outgoing>) {
    let mut stdin = std::io::stdin().lock();
    let mut line = Vec::new();
    let mut dropped = 0;
    loop {
        let complete = match read_line(&mut stdin, &mut line) {
            Ok(Some(complete)) => complete,
            Ok(None) => return,
            Err(e) => {
                crate::note!("bgwork mcp: reading stdin failed ({e}); stopping");
                return;
            }
        };
        let verdict = if complete {
            judge(&line)
        } else {
            Verdict::Answer(error_line(
                scan_id(&line),
                INVALID_REQUEST,
                &format!("message refused: longer than {MAX_LINE} bytes"),
            ))
        };
        match verdict {
            Verdict::Forward(message) => {
                if messages.blocking_send(*message).is_err() {
                    return;
                }
            }
            Verdict::Answer(line) => {
                let answer = Outgoing {
                    line,
                    written: None,
                };
                if answers.blocking_send(answer).is_err() {
                    return;
                }
            }
            // Said a few times only: a client that floods bad notifications and does
            // not read stderr must not block this thread on a full pipe.
            Verdict::Drop(why) => {
                dropped += 1;
                if dropped <= NOTES_OF_DROPS {
                    crate::note!("bgwork mcp: dropped a notification: {why}");
                }
                if dropped == NOTES_OF_DROPS {
                    crate::note!("bgwork mcp: further dropped notifications are not reported");
                }
            }
            Verdict::Blank => {}
        }
    }
}

/// Reads one line (without its newline) into `line`: `Some(true)` when it came whole,
/// `Some(false)` when it passed [`MAX_LINE`] (its first bytes are kept, the rest
/// skipped), `None` at the end of input.
fn read_line(input: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<Option<bool>> {
    line.clear();
    let mut too_long = false;
    loop {
        let buffer = match input.fill_buf() {
            Ok(buffer) => buffer,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buffer.is_empty() {
            // A last line without a newline is still a line.
            return Ok((!line.is_empty() || too_long).then_some(!too_long));
        }
        let newline = buffer.iter().position(|&b| b == b'\n');
        let take = newline.map_or(buffer.len(), |end| end + 1);
        let piece = &buffer[..newline.unwrap_or(take)];
        if !too_long && line.len() + piece.len() > MAX_LINE {
            too_long = true;
        }
        let room = if too_long {
            KEPT_OF_LONG_LINE.saturating_sub(line.len())
        } else {
            piece.len()
        };
        line.extend_from_slice(&piece[..room.min(piece.len())]);
        input.consume(take);
        if newline.is_some() {
            return Ok(Some(!too_long));
        }
    }
}

/// What to do with one line.
enum Verdict {
    Forward(Box<ClientJsonRpcMessage>),
    Answer(Vec<u8>),
    Drop(String),
    Blank,
}

/// Decides what a whole line is.
fn judge(line: &[u8]) -> Verdict {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Blank;
    }
    let parse_error =
        |message: String| Verdict::Answer(error_line(scan_id(line), PARSE_ERROR, &message));
    let text = match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(e) => {
            return parse_error(format!(
                "parse error: the line is not UTF-8 (a bad byte at offset {}); JSON-RPC \
                 messages are UTF-8 text",
                e.valid_up_to()
            ))
        }
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) if e.to_string().contains("recursion limit") => {
            return parse_error(format!(
                "parse error: nested deeper than this server reads ({e}); flatten the arguments"
            ))
        }
        Err(e) => return parse_error(format!("parse error: not JSON ({e})")),
    };
    let Value::Object(object) = &value else {
        let message = if value.is_array() {
            "invalid request: batches are not supported; send one JSON-RPC object per line"
        } else {
            "invalid request: a JSON-RPC message is an object"
        };
        return Verdict::Answer(error_line(None, INVALID_REQUEST, message));
    };
    let id = object.get("id");
    let echo = match id {
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id.clone()),
        Some(Value::Null) | None => None,
        Some(_) => {
            return Verdict::Answer(error_line(
                None,
                INVALID_REQUEST,
                "invalid request: id must be a string or an integer",
            ))
        }
    };
    let invalid = |code: i64, message: String| match (id, object.get("method")) {
        // A notification is never answered.
        (None, Some(_)) => Verdict::Drop(message),
        _ => Verdict::Answer(error_line(echo.clone(), code, &message)),
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid(
            INVALID_REQUEST,
            "invalid request: \"jsonrpc\" must be \"2.0\"".to_string(),
        );
    }
    let method = match object.get("method") {
        Some(Value::String(method)) => Some(method.as_str()),
        Some(_) => {
            return Verdict::Answer(error_line(
                echo,
                INVALID_REQUEST,
                "invalid request: method must be a string",
            ))
        }
        None => None,
    };
    if let (Some("tools/call"), Some(_)) = (method, id) {
        if let Err(message) = check_tool_call(object.get("params")) {
            return invalid(INVALID_PARAMS, message);
        }
    }
    let served = method.is_some_and(|m| SERVED.contains(&m));
    let params_error = |method: &str| {
        format!("invalid params: the params of {method} do not fit its schema (see the MCP specification)")
    };
    let message: ClientJsonRpcMessage = match serde_json::from_value(value.clone()) {
        Ok(message) => message,
        Err(_) if served && id.is_some() => {
            return invalid(INVALID_PARAMS, params_error(method.unwrap_or_default()))
        }
        Err(_) if method.is_none() => {
            return invalid(
                INVALID_REQUEST,
                "invalid request: a message has a method (a request, a notification) or a \
                 result or error (a response)"
                    .to_string(),
            )
        }
        Err(e) => return invalid(INVALID_REQUEST, format!("invalid request: {e}")),
    };
    // A call of a method this server serves whose params do not fit its schema is parsed
    // as a custom request (answered "method not found"): it is a matter of params.
    if let JsonRpcMessage::Request(request) = &message {
        if let ClientRequest::CustomRequest(custom) = &request.request {
            if SERVED.contains(&custom.method.as_str()) {
                return invalid(INVALID_PARAMS, params_error(&custom.method));
            }
        }
    }
    Verdict::Forward(Box::new(message))
}

/// `tools/call` takes `{"name": string, "arguments": object}` (`arguments` optional).
fn check_tool_call(params: Option<&Value>) -> Result<(), String> {
    let Some(Value::Object(params)) = params else {
        return Err(
            "invalid params: tools/call takes params {\"name\": TOOL, \"arguments\": {…}}".into(),
        );
    };
    if !params.get("name").is_some_and(Value::is_string) {
        return Err("invalid params: tools/call needs the tool's name as a string".into());
    }
    match params.get("arguments") {
        None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(
            "invalid params: arguments must be an object of the tool's arguments (see tools/list)"
                .into(),
        ),
    }
}

/// One JSON-RPC error response as a line.
fn error_line(id: Option<Value>, code: i64, message: &str) -> Vec<u8> {
    let answer = json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(Value::Null),
        "error": {"code": code, "message": message},
    });
    let mut line = answer.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// The top-level `"id"` of a line that does not parse (not UTF-8, nested too deep, cut
/// short), found by a scan that follows only strings and nesting, so that its answer
/// still reaches the request that waits for it. Only a string or number id is taken.
fn scan_id(line: &[u8]) -> Option<Value> {
    let start = line.iter().position(|b| !b.is_ascii_whitespace())?;
    if line[start] != b'{' {
        return None;
    }
    let mut depth = 0usize;
    let mut at_key = false;
    let mut i = start;
    while i < line.len() {
        match line[i] {
            b'"' => {
                let end = string_end(line, i)?;
                if depth == 1 && at_key && &line[i + 1..end] == b"id" {
                    let colon = skip_space(line, end + 1);
                    if line.get(colon) != Some(&b':') {
                        return None;
                    }
                    return id_value(&line[skip_space(line, colon + 1)..]);
                }
                at_key = false;
                i = end;
            }
            b'{' => {
                depth += 1;
                at_key = depth == 1;
            }
            b'[' => depth += 1,
            b'}' | b']' => depth = depth.checked_sub(1)?,
            b',' => at_key = depth == 1,
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the quote that ends the string opening at `open`.
fn string_end(line: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    while i < line.len() {
        match line[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn skip_space(line: &[u8], mut i: usize) -> usize {
    while line.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// A string or number at the start of `rest`.
fn id_value(rest: &[u8]) -> Option<Value> {
    let end = match rest.first()? {
        b'"' => string_end(rest, 0)? + 1,
        b'-' | b'0'..=b'9' => rest
            .iter()
            .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
            .unwrap_or(rest.len()),
        _ => return None,
    };
    match serde_json::from_slice(&rest[..end]).ok()? {
        id @ (Value::String(_) | Value::Number(_)) => Some(id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_finds_the_top_level_id_only() {
        assert_eq!(scan_id(br#"{"jsonrpc":"2.0","id":7,"x":"#), Some(json!(7)));
        assert_eq!(
            scan_id(br#"{"a":{"id":1},"id":"q\"1"}"#),
            Some(json!("q\"1"))
        );
        assert_eq!(scan_id(br#"{"a":"id","b":["id",2]}"#), None);
        assert_eq!(scan_id(b"{\"id\":5,\"p\":\"caf\xe9\"}"), Some(json!(5)));
        assert_eq!(scan_id(br#"[{"id":1}]"#), None);
        assert_eq!(scan_id(br#"{"id":null}"#), None);
    }
}
