//! A scripted model server on 127.0.0.1: it answers a harness's model requests from a
//! script (a tool call, then another, …, then a text) and logs every request, so a test
//! can read exactly what reached the model's context.
//!
//! How it works: one HTTP/1.1 request a connection (`Connection: close`, the whole answer
//! with its `Content-Length`). The dialect comes from the path: Anthropic Messages
//! (`/v1/messages`, streamed as SSE when asked), OpenAI Responses (`/responses`, SSE), and
//! Gemini (`:streamGenerateContent?alt=sse`; the non-streaming `:generateContent` that
//! its router and checkers ask for a JSON object). Which step of the script answers is
//! the number of model turns already in the request's conversation, so a retried request
//! gets the same answer and a side request (a title, a router's question) moves nothing.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One answer of the model: a tool call, or a text that ends the turn.
#[derive(Clone, Debug)]
pub enum Step {
    /// A call of `name` (for Codex's MCP tools, inside `namespace`) with these arguments.
    Call {
        name: String,
        namespace: Option<String>,
        args: Value,
    },
    Text(String),
}

pub fn call(name: &str, args: Value) -> Step {
    Step::Call {
        name: name.to_string(),
        namespace: None,
        args,
    }
}

pub fn text(text: &str) -> Step {
    Step::Text(text.to_string())
}

/// A request the server received.
#[derive(Clone, Debug)]
pub struct Logged {
    pub path: String,
    /// The body as it came (what reached the model).
    pub raw: String,
    pub body: Value,
    /// The step that answered it, when it was a turn of the agent.
    pub step: Option<usize>,
}

pub struct ModelServer {
    pub port: u16,
    log: Arc<Mutex<Vec<Logged>>>,
}

impl ModelServer {
    /// Serves `script` on a free port of 127.0.0.1 until the test's process ends.
    pub fn start(script: Vec<Step>) -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the model server");
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(script);
        let served = log.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (log, script) = (served.clone(), script.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &script, &log);
                });
            }
        });
        ModelServer { port, log }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> Vec<Logged> {
        self.log.lock().unwrap().clone()
    }

    /// The agent's turns (requests a step answered), in the order they came.
    pub fn turns(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| r.step.is_some())
            .collect()
    }

    /// Waits until a request answered by step `step` or later came, at most `limit`.
    pub fn wait_for_step(&self, step: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.turns().iter().any(|r| r.step >= Some(step)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Every request's body, joined: what the model was ever sent.
    pub fn everything_sent(&self) -> String {
        self.requests()
            .iter()
            .map(|r| format!("{} {}\n", r.path, r.raw))
            .collect()
    }
}

fn serve(stream: TcpStream, script: &[Step], log: &Mutex<Vec<Logged>>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut length, mut chunked) = (0usize, false);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        let lower = header.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let body = if chunked {
        read_chunked(&mut reader)?
    } else {
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        body
    };
    let raw = String::from_utf8_lossy(&body).into_owned();
    let request: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
    let (step, answer) = answer(&path, &request, script);
    log.lock().unwrap().push(Logged {
        path,
        raw,
        body: request,
        step,
    });
    let mut stream = stream;
    let (kind, body) = answer;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

fn read_chunked(reader: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size)?;
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk)?;
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

type Answer = (&'static str, String);

/// The step that answers (for the agent's turns) and the answer's content type and body.
fn answer(path: &str, request: &Value, script: &[Step]) -> (Option<usize>, Answer) {
    let step_at = |n: usize| script.get(n).cloned().unwrap_or_else(|| text("done"));
    if path.contains("/messages/count_tokens") {
        return (None, json_answer(json!({"input_tokens": 100})));
    }
    if path.contains("/messages") {
        let has_tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
        if !has_tools {
            return (None, anthropic(request, &text("ok")));
        }
        let n = count(&request["messages"], |m| m["role"] == "assistant");
        return (Some(n), anthropic(request, &step_at(n)));
    }
    if path.contains("/responses") {
        let n = count(&request["input"], |i| {
            i["type"] == "function_call" || (i["type"] == "message" && i["role"] == "assistant")
        });
        return (Some(n), openai(&step_at(n)));
    }
    if path.contains(":streamGenerateContent") {
        let n = count(&request["contents"], |c| c["role"] == "model");
        return (Some(n), gemini_stream(&step_at(n)));
    }
    if path.contains(":generateContent") {
        return (None, gemini_json(request));
    }
    (None, json_answer(json!({})))
}

fn count(list: &Value, what: impl Fn(&Value) -> bool) -> usize {
    list.as_array()
        .map_or(0, |l| l.iter().filter(|v| what(v)).count())
}

fn json_answer(body: Value) -> Answer {
    ("application/json", body.to_string())
}

fn sse(events: &[(Option<&str>, Value)]) -> Answer {
    let mut body = String::new();
    for (name, data) in events {
        if let Some(name) = name {
            body.push_str(&format!("event: {name}\n"));
        }
        body.push_str(&format!("data: {data}\n\n"));
    }
    ("text/event-stream", body)
}

fn anthropic(request: &Value, step: &Step) -> Answer {
    let (block, delta, stop) = match step {
        Step::Call { name, args, .. } => (
            json!({"type": "tool_use", "id": format!("toolu_{}", unique()), "name": name, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": args.to_string()}),
            "tool_use",
        ),
        Step::Text(text) => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": text}),
            "end_turn",
        ),
    };
    let model = request["model"].as_str().unwrap_or("claude-sonnet-4-5");
    let usage = json!({"input_tokens": 100, "output_tokens": 10});
    if request["stream"] != true {
        let mut content = block.clone();
        match step {
            Step::Call { args, .. } => content["input"] = args.clone(),
            Step::Text(text) => content["text"] = json!(text),
        }
        return json_answer(json!({
            "id": format!("msg_{}", unique()), "type": "message", "role": "assistant",
            "model": model, "content": [content], "stop_reason": stop,
            "stop_sequence": null, "usage": usage,
        }));
    }
    sse(&[
        (
            Some("message_start"),
            json!({"type": "message_start", "message": {
                "id": format!("msg_{}", unique()), "type": "message", "role": "assistant",
                "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": usage}}),
        ),
        (
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": 0, "content_block": block}),
        ),
        (
            Some("content_block_delta"),
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        (
            Some("content_block_stop"),
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            Some("message_delta"),
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                   "usage": {"output_tokens": 10}}),
        ),
        (Some("message_stop"), json!({"type": "message_stop"})),
    ])
}

fn openai(step: &Step) -> Answer {
    let id = format!("resp_{}", unique());
    let item = match step {
        Step::Call {
            name,
            namespace,
            args,
        } => {
            let mut item = json!({"type": "function_call", "id": format!("fc_{}", unique()),
                "call_id": format!("call_{}", unique()), "name": name,
                "arguments": args.to_string(), "status": "completed"});
            if let Some(namespace) = namespace {
                item["namespace"] = json!(namespace);
            }
            item
        }
        Step::Text(text) => json!({"type": "message", "id": format!("msg_{}", unique()),
            "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}),
    };
    let usage = json!({"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 110});
    sse(&[
        (
            Some("response.created"),
            json!({"type": "response.created", "response": {"id": id}}),
        ),
        (
            Some("response.output_item.done"),
            json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        ),
        (
            Some("response.completed"),
            json!({"type": "response.completed", "response": {"id": id, "usage": usage}}),
        ),
    ])
}

fn gemini_parts(step: &Step) -> Value {
    match step {
        Step::Call { name, args, .. } => json!([{"functionCall": {"name": name, "args": args}}]),
        Step::Text(text) => json!([{"text": text}]),
    }
}

fn gemini_candidate(parts: Value) -> Value {
    json!({"candidates": [{"content": {"role": "model", "parts": parts},
        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110}})
}

fn gemini_stream(step: &Step) -> Answer {
    sse(&[(None, gemini_candidate(gemini_parts(step)))])
}

/// Gemini's side questions, each asked for a JSON object: the router's complexity, the
/// next speaker after a text; anything else gets a plain text.
fn gemini_json(request: &Value) -> Answer {
    let asked = request["generationConfig"].to_string() + &request["config"].to_string();
    let answer = if asked.contains("complexity_score") {
        json!({"complexity_reasoning": "a scripted test", "complexity_score": 10}).to_string()
    } else if asked.contains("next_speaker") {
        json!({"reasoning": "the turn is done", "next_speaker": "user"}).to_string()
    } else {
        "ok".to_string()
    };
    json_answer(gemini_candidate(json!([{ "text": answer }])))
}

fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:016x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl ModelServer {
    /// Keeps the request log in `target/harness-logs/NAME.jsonl`, to read after a run.
    pub fn save(&self, name: &str) {
        let dir = crate::setup::target_dir().join("harness-logs");
        std::fs::create_dir_all(&dir).unwrap();
        let lines: String = self
            .requests()
            .iter()
            .map(|r| json!({"path": r.path, "step": r.step, "body": r.body}).to_string() + "\n")
            .collect();
        std::fs::write(dir.join(format!("{name}.jsonl")), lines).unwrap();
    }
}

impl ModelServer {
    /// The newest request that step `step` answered (what the model saw before it).
    pub fn at(&self, step: usize) -> Logged {
        self.turns()
            .into_iter()
            .rfind(|t| t.step == Some(step))
            .unwrap_or_else(|| {
                let got: Vec<_> = self.turns().iter().map(|t| t.step).collect();
                panic!("the model was never asked for step {step} (steps asked: {got:?})")
            })
    }
}

/// The end of a request's body, where its newest messages are, for a failure's message.
pub fn excerpt(raw: &str) -> String {
    let body: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
    let conversation = ["messages", "input", "contents"]
        .iter()
        .find_map(|key| body[key].as_array())
        .map(|list| json!(list[list.len().saturating_sub(3)..]).to_string());
    let raw = conversation.as_deref().unwrap_or(raw);
    let start = raw.len().saturating_sub(2500);
    let start = (start..raw.len())
        .find(|&i| raw.is_char_boundary(i))
        .unwrap_or(0);
    format!("…{}", &raw[start..])
}
