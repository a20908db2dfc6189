//! The MCP tools: their schemas and descriptions (written for a model), and turning a
//! tool call's arguments into the one request type every front end sends.

mod arguments;
mod messages;
mod results;

use crate::environ::CallerEnv;
use crate::wire::{
    self, Actor, ReadArgs, Request, RestartArgs, RunArgs, SendArgs, StopArgs, WaitArgs, WireError,
};
use arguments::{
    absolute, env_arg, local, monitor_args, run_start, start_args, with_tool_names, Args,
};
pub use messages::error_object;
pub use results::{annotate, annotate_start, bound_history, bound_list, slim};
use rmcp::model::ToolAnnotations;
use serde_json::{json, Map, Value};

/// Said once, in the server's instructions, and echoed by the tools.
pub const INSTRUCTIONS: &str = "bgwork runs shell work in the background. Start long work \
(builds, test suites, dev servers, watches) with `start` and keep working: the call returns \
an id at once. You never need to poll: every tool result carries a `notices` array with the \
end and last lines of any work that ended since your last call (at most 10 a result; \
`notices_note` says how many more wait). A notice is a report, not a request to start more \
work. Use `wait` (it blocks, with a \
bound) only when your next step needs the result. A command that ends in a few seconds should \
just run with `run`; when you do not know how long a command takes, `run` with `timeout: \
\"auto\"` decides from how long it took here before (`start`, `list` and `history` show that \
too, as `expected`).";

/// Every tool, in the order `tools/list` gives them.
pub fn definitions() -> Vec<(&'static str, &'static str, Value)> {
    let id = |what: &str| json!({"type": "string", "description": what});
    let verbose = json!({"type": "boolean", "description": "Also return each item's cwd, session, env_names, log_path and folder (default false: results are kept short)"});
    let command = json!({"type": "string", "description": "The shell command line, run by `bash -c` (pipes, globs, && and $VARS work)"});
    let notify = json!({"type": "boolean", "description": "Fire one notice when it ends; it arrives in the `notices` of a later tool result (default false)"});
    let name = json!({"type": "string", "description": "A short name shown in lists and notices (default: the command)"});
    let cwd = json!({"type": "string", "description": "Working directory (default: the server's; a relative path is taken from the server's, ~ is the home folder)"});
    let env = json!({"type": "object", "additionalProperties": {"type": "string"},
                     "description": "Extra environment variables, NAME: value; values are never recorded, and values of 8 bytes or more are masked in output as [secret NAME]"});
    let secrets = json!({"type": "array", "items": {"type": "string"},
                         "description": "Names of variables of this server's environment that hold secrets: the job gets them, and their values (also base64 / URL-encoded) never appear in its output, log or results, only [secret NAME]"});
    vec![
        (
            "start",
            "Start a shell command in the background and return its id (bg-N) at once, with \
             what it printed in the first `window_ms` (default 1000). Use it for work that \
             takes longer than ~30 s or never ends (dev servers, watches). Set `notify` to \
             hear of its end in the `notices` of a later result, with no polling. Do not start \
             work whose result you need for your very next step: use `run` or `wait`. When \
             the command ran in this folder before, `expected` says how long it usually takes \
             (\"usually 41 s (5 runs; 2 of the last 5 failed)\").",
            schema(
                json!({
                    "command": command,
                    "notify": notify,
                    "name": name,
                    "cwd": cwd,
                    "env": env,
                    "secrets": secrets,
                    "window_ms": {"type": "integer", "minimum": 0, "description": "Milliseconds to wait for first output before returning (default 1000; 0 returns at once)"},
                    "pty": {"type": "boolean", "description": "Run on a terminal (a pane): takes keystrokes with `send`, has a screen for `read` with `screen` (default false)"},
                    "cols": {"type": "integer", "minimum": 2, "description": "A pane's width in columns (default 120)"},
                    "rows": {"type": "integer", "minimum": 2, "description": "A pane's height in rows (default 40)"},
                    "allow_duplicate": {"type": "boolean", "description": "Start even when the same command already runs in this session and folder (default false: the result is the running item, with `already_running`)"},
                    "quiet_after_s": {"type": "number", "exclusiveMinimum": 0, "description": "Fire a notice when it has printed nothing for this many seconds (once per quiet spell), saying whether it is busy, idle or waiting at a prompt"},
                    "max_runtime_s": {"type": "number", "exclusiveMinimum": 0, "description": "Stop it once it has run this many seconds (its end says \"ran past its limit\")"},
                    "restart": {"type": "string", "enum": ["on-failure"], "description": "`on-failure`: when it ends failed or killed by a signal from elsewhere, start it again as the same id after a back-off (never after a stop, nor past max_runtime_s), for servers that crash; `list` shows `restarting` and its `restart` count, its log has a marker line at each start, and one notice comes only when it gives up (or, with notify, at its end)"},
                    "max_restarts": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "With restart: how often it is started again at most (default 5); then it ends with its last end"},
                    "backoff": {"type": "string", "description": "With restart: the wait before each new start, MIN..MAX, doubling from MIN up to MAX (default \"1s..60s\")"},
                    "on": {"type": "string", "pattern": "^(local|slurm|ssh:.+)$", "description": "Where it runs: `local` (this machine), `slurm` (a Slurm cluster through sbatch) or `ssh:HOST` (a host as ssh knows it; `cwd` is then a path there) (default: BGWORK_EXECUTOR of the server, else local); a job on Slurm is `queued` until the cluster starts it"},
                    "partition": {"type": "string", "description": "With on=slurm: the Slurm partition"},
                    "time": {"type": "string", "description": "With on=slurm: the time limit in Slurm's words (30, 0:05, 1:00:00, 2-0)"},
                    "cpus": {"type": "integer", "minimum": 1, "description": "With on=slurm: CPUs for the job"},
                    "mem": {"type": "string", "description": "With on=slurm: memory in Slurm's words (500M, 4G)"},
                    "gpus": {"type": "integer", "minimum": 1, "description": "With on=slurm: GPUs for the job"},
                    "nodes": {"type": "integer", "minimum": 1, "description": "With on=slurm: nodes for the job (the command runs on the first)"},
                    "sbatch_args": {"type": "array", "items": {"type": "string"}, "description": "With on=slurm: more sbatch options, each one argument, e.g. [\"--constraint=a100\"]"},
                    "after": {"type": "array", "items": {"type": "string"}, "description": "Start it only once other work got far enough, each entry \"ID[:COND]\", all required: \"bg-3\" (bg-3 ended succeeded), \"bg-3:ended\" (ended at all), \"bg-3:output RE\" (a line of its output matches the regex), \"bg-3:port\" (it listens on a TCP port). Until then the result's `state` is `waiting` with `waiting_for`, and nothing runs; if a condition can no longer hold (bg-3 failed, was stopped, ended without the line) it ends `cancelled` with a notice saying why"},
                    "verbose": verbose
                }),
                &["command"],
            ),
        ),
        (
            "run",
            "Run a command in the foreground and return its output and exit status. If it is \
             still running after `timeout_s` (default 60) it moves to the background and you \
             get its id instead (outcome `promoted`) and a notice when it ends, so a slow command never blocks you for \
             longer than the timeout. With `timeout: \"auto\"` bgwork decides from how long \
             this command took here before: one that usually takes longer than the break-even (15 s unless \
             BGWORK_AUTO_BACKGROUND_S says otherwise) goes to the \
             background at once with its notice armed (do other work meanwhile), a quicker \
             one is waited for up to 3× its usual time; `timeout_choice` says which and why.",
            schema(
                json!({
                    "command": command,
                    "timeout_s": {"type": "number", "minimum": 0, "description": "Seconds to wait before it moves to the background (default 60)"},
                    "timeout": {"type": "string", "enum": ["auto"], "description": "\"auto\": choose from this command's history in this folder instead of timeout_s (background at once if it usually takes longer than the break-even, 15 s unless BGWORK_AUTO_BACKGROUND_S says otherwise, else wait up to 3× its usual time, else 60 s without history)"},
                    "notify": {"type": "boolean", "description": "Fire one notice when it ends (a run promoted to the background always does)"},
                    "name": name,
                    "cwd": cwd,
                    "env": env,
                    "secrets": secrets,
                    "on": {"type": "string", "pattern": "^(local|ssh:.+)$", "description": "Where it runs: `local` (this machine) or `ssh:HOST` (a host as ssh knows it; `cwd` is then a path there) (default: local, whatever BGWORK_EXECUTOR says)"},
                    "verbose": verbose
                }),
                &["command"],
            ),
        ),
        (
            "list",
            "List this session's running work (jobs, panes, monitors, sub-agents); `all` adds \
             ended records. A job with a history here carries `expected` (its usual time) and \
             `progress` (\"running 1m20s, usually 41 s\"); one running 3× past its usual time \
             gets a notice.",
            schema(
                json!({
                    "all": {"type": "boolean", "description": "Include ended records (kept 24 h unless dismissed); default false"},
                    "verbose": verbose
                }),
                &[],
            ),
        ),
        (
            "read",
            "Read output of an item written since your last read of it (never blocks). An \
             empty `output` with `running: true` means 'not done yet' — do not call read in a \
             loop to wait; use `wait`, or just carry on: its end will arrive as a notice. \
             `tail` gives the last N lines, `screen` a pane's visible screen, `grep` the \
             matching lines of the whole output.",
            schema(
                json!({
                    "id": id("The item to read: bg-N, mon-N or sub-N"),
                    "tail": {"type": "integer", "minimum": 0, "description": "Only the last N lines (does not move your read position)"},
                    "from": {"type": "integer", "minimum": 0, "description": "From this byte offset of the log (does not move your read position)"},
                    "all": {"type": "boolean", "description": "The whole output from the start (does not move your read position); default false"},
                    "raw": {"type": "boolean", "description": "The exact bytes, base64-encoded in `output_base64`, escapes and all, with secrets and token shapes masked in what they show (default false)"},
                    "max_bytes": {"type": "integer", "minimum": 64, "description": "Clip the reply to about this many bytes, keeping head and tail (default 32768)"},
                    "screen": {"type": "boolean", "description": "A pane's visible screen as text, instead of its output stream (default false)"},
                    "grep": {"type": "string", "description": "Search the whole kept log for lines matching this regex (Rust syntax) instead of reading: returns `matches` with `line` (1-based), `offset` (byte) and `text`, without moving your read position; `truncated` with `next_from` when there were more (pass it as `from`)"},
                    "context": {"type": "integer", "minimum": 0, "maximum": 100, "description": "With grep: lines of context before and after each match (default 0)"},
                    "max_matches": {"type": "integer", "minimum": 1, "maximum": 10000, "description": "With grep: the most matches returned (default 100)"}
                }),
                &["id"],
            ),
        ),
        (
            "send",
            "Send input to a job's stdin or keystrokes to a pane. `text` understands \\n, \\t \
             and \\xHH; `keys` are named keys such as C-c, C-d, Enter, Tab, Esc, Up, Down.",
            schema(
                json!({
                    "id": id("The job or pane (bg-N)"),
                    "text": {"type": "string", "description": "Text to write; \\n is Enter, \\t Tab, \\xHH any byte"},
                    "keys": {"type": "array", "items": {"type": "string"}, "description": "Named keys sent after the text, in order: C-c, C-d, Enter, Tab, Esc, Up, Down, Left, Right, ..."}
                }),
                &["id"],
            ),
        ),
        (
            "stop",
            "Stop an item and everything it started: TERM, then KILL after `grace_s` \
             (default 5). Returns its end (also for an item that had already ended: \
             `already_ended` is then true).",
            schema(
                json!({
                    "id": id("The item to stop: bg-N, mon-N or sub-N"),
                    "grace_s": {"type": "number", "minimum": 0, "description": "Seconds between TERM and KILL (default 5)"},
                    "as": {"type": "string", "enum": ["agent", "person"], "description": "Who stops it (default agent); a stop by a person fires a notice"},
                    "verbose": verbose
                }),
                &["id"],
            ),
        ),
        (
            "wait",
            "Block until the items end (`all`, or the first by default), or `until` (a regex) \
             matches a line of their unread output, or `timeout_s` (default 50) passes. Returns \
             which happened, the ends and the last lines. Prefer one wait to repeated reads.",
            schema(
                json!({
                    "ids": {"type": "array", "items": {"type": "string"}, "description": "The items to wait for"},
                    "id": id("One item to wait for (instead of or besides `ids`)"),
                    "any": {"type": "boolean", "description": "Return when the first item ends (the default)"},
                    "all": {"type": "boolean", "description": "Return only when every item has ended (default false)"},
                    "until": {"type": "string", "description": "A regular expression: return when a line of new output matches it"},
                    "timeout_s": {"type": "number", "minimum": 0, "description": "Seconds to wait at most (default 50, at most 86400)"},
                    "verbose": verbose
                }),
                &[],
            ),
        ),
        (
            "monitor",
            "Create a monitor (mon-N). mode `wait`: one notice when a condition holds — \
             `until_output` (an id, with `regex`), `until_port` (HOST:PORT accepts connections), \
             `until_port_of` (an id listens on a port), \
             `until_file` (exists), `until_end` (an id ended); fails after `timeout_s`. mode \
             `watch`: every line of `output` (an id) or `file` matching `regex` goes to its log \
             (read it with `read`), with notices in batches.",
            schema(
                json!({
                    "mode": {"type": "string", "enum": ["wait", "watch"], "description": "`wait`: once, when a condition holds; `watch`: every matching line"},
                    "until_output": id("wait: the item whose output a line must match `regex`"),
                    "until_port": {"type": "string", "description": "wait: HOST:PORT that must accept connections"},
                    "until_port_of": id("wait: the item whose processes must listen on a TCP port (whichever it opens)"),
                    "until_file": {"type": "string", "description": "wait: a path that must exist; a relative one is taken from the server's working directory"},
                    "until_end": id("wait: the item that must end"),
                    "output": id("watch: the item whose output lines are watched"),
                    "file": {"type": "string", "description": "watch: a file whose appended lines are watched; a relative path is taken from the server's working directory"},
                    "regex": {"type": "string", "description": "The regular expression a line must match (default for a watch: every line)"},
                    "timeout_s": {"type": "number", "minimum": 0, "description": "wait: fail after this many seconds if the condition has not held (default: no limit)"},
                    "no_notify": {"type": "boolean", "description": "wait: fire no notice when the condition holds (by default it does; a watch always notifies)"},
                    "name": name,
                    "verbose": verbose
                }),
                &["mode"],
            ),
        ),
        (
            "notices",
            "Notices of work that ended, each delivered once. Every other tool's result \
             already carries them, so call this only when you have nothing else to do.",
            schema(
                json!({"peek": {"type": "boolean", "description": "Show them without marking them delivered (default false)"}}),
                &[],
            ),
        ),
        (
            "resize",
            "Resize a pane's terminal (a job started with `pty`): the program in it sees the \
             new size (SIGWINCH), and `read` with `screen` shows the new screen.",
            schema(
                json!({
                    "id": id("The pane (bg-N)"),
                    "cols": {"type": "integer", "minimum": 2, "maximum": 1000, "description": "Width in columns"},
                    "rows": {"type": "integer", "minimum": 2, "maximum": 1000, "description": "Height in rows"}
                }),
                &["id", "cols", "rows"],
            ),
        ),
        (
            "dismiss",
            "Drop ended items from `list` with `all` (their records stay readable until \
             collected). All or none: a running item is refused.",
            schema(
                json!({
                    "ids": {"type": "array", "items": {"type": "string"}, "description": "The ended items to drop"},
                    "id": id("One ended item to drop (instead of or besides `ids`)")
                }),
                &[],
            ),
        ),
        (
            "restart",
            "Start an item again with the same command, folder, name and options: a new id; \
             the old record keeps its end. A running item is stopped first.",
            schema(
                json!({
                    "id": id("The item to start again (bg-N or sub-N)"),
                    "env": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "Values for variables it was started with (never recorded); default: the server's environment"},
                    "window_ms": {"type": "integer", "minimum": 0, "description": "Milliseconds to wait for first output (default 1000)"},
                    "verbose": verbose
                }),
                &["id"],
            ),
        ),
        (
            "history",
            "How long commands took in a folder before: for each, its runs, median and p90 \
             duration, and its newest 5 ends in `last` (`expected` says it in one line, as \
             `start` and `list` show it for running work). Use it to decide whether to wait for a command or \
             start it in the background.",
            schema(
                json!({
                    "command": {"type": "string", "description": "Only this command (blanks and surrounding spaces do not matter; an empty one is refused); default: every command run in the folder, the most recent first, as many as fit in 32 KiB (`left_out` says how many more)"},
                    "cwd": cwd
                }),
                &[],
            ),
        ),
        (
            "agent_start",
            "Start a sub-agent (sub-N): a child agent command run in the background. Its own \
             work is filed under this session (BGWORK_SESSION is set for it), and the text it \
             writes to the file named by $BGWORK_REPORT comes back as the notice of its end.",
            schema(
                json!({
                    "command": {"type": "string", "description": "The agent's command line, run by `bash -c`, e.g. claude -p '...'"},
                    "name": name,
                    "cwd": cwd,
                    "env": env,
                    "verbose": verbose
                }),
                &["command"],
            ),
        ),
    ]
}

/// The MCP annotations of a tool: which only look, which may destroy.
pub fn annotations(name: &str) -> ToolAnnotations {
    let base = ToolAnnotations::new().open_world(false);
    match name {
        "list" | "read" | "wait" | "notices" | "history" => base.read_only(true),
        "stop" => base.read_only(false).destructive(true),
        "resize" | "dismiss" => base.read_only(false).destructive(false).idempotent(true),
        "send" | "monitor" => base.read_only(false).destructive(false),
        // A shell command may do anything.
        _ => base.read_only(false).destructive(true),
    }
}

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false
    })
}

/// `read` with `grep` for a model: at most this many matches and bytes of text unless
/// it asks for more.
const MCP_GREP_MATCHES: usize = 100;
const MCP_GREP_BYTES: usize = 32 << 10;

/// Turns a tool call into a request (`cwd` and `env` default to the server's own).
pub fn request(name: &str, args: &Map<String, Value>) -> Result<Request, WireError> {
    let known: Vec<String> = definitions()
        .into_iter()
        .find(|(tool, _, _)| *tool == name)
        .and_then(|(_, _, schema)| {
            Some(schema["properties"].as_object()?.keys().cloned().collect())
        })
        .ok_or_else(|| WireError::bad_request(format!("no tool {name}: see tools/list")))?;
    let args = &with_tool_names(name, args, &known)?;
    let a = Args(args);
    if known.iter().any(|k| k == "verbose") {
        a.flag("verbose")?;
    }
    let request = match name {
        "start" => Request::Start(start_args(&a)?),
        "run" => Request::Run(RunArgs {
            start: run_start(&a)?,
            timeout_s: match (a.number("timeout_s")?, args.get("timeout")) {
                // The CLI's `--timeout 30` given as `timeout: 30`.
                (None, Some(Value::Number(n))) => n.as_f64(),
                (seconds, _) => seconds,
            },
            timeout: match (match args.get("timeout") {
                Some(Value::Number(_)) => None,
                _ => a.text("timeout")?,
            })
            .as_deref()
            {
                None => None,
                Some("auto") => Some(wire::TimeoutMode::Auto),
                Some(other) => {
                    return Err(WireError::bad_request(format!(
                        "timeout takes \"auto\", not {other:?}; give seconds as timeout_s"
                    )))
                }
            },
            stream: false,
            // Its job named first: a daemon gone during the wait names the job that goes on.
            announce: true,
            // The model has no stdin to give: the command reads end-of-input.
            stdin: wire::RunStdin::Closed,
        }),
        "history" => Request::History {
            cwd: absolute("cwd", a.text("cwd")?.as_deref().unwrap_or("."))?,
            command: a.text("command")?,
        },
        "list" => Request::List {
            all: a.flag("all")?,
            all_sessions: false,
        },
        "read" => Request::Read(ReadArgs {
            id: a.required("id")?,
            tail: a.count("tail")?,
            from: a.count("from")?.map(|n| n as u64),
            all: a.flag("all")?,
            raw: a.flag("raw")?,
            screen: a.flag("screen")?,
            // A search's reply goes into the model's context: a smaller one by default.
            max_bytes: match a.text("grep")? {
                Some(_) => Some(a.count("max_bytes")?.unwrap_or(MCP_GREP_BYTES)),
                None => a.count("max_bytes")?,
            },
            max_matches: match a.text("grep")? {
                Some(_) => Some(a.count("max_matches")?.unwrap_or(MCP_GREP_MATCHES)),
                None => a.count("max_matches")?,
            },
            grep: a.text("grep")?,
            context: a.count("context")?,
            // Token shapes stay masked for a model: `--no-redact` is the person's.
            no_redact: false,
            output_frame: false,
        }),
        "send" => Request::Send(SendArgs {
            id: a.required("id")?,
            text: a.text("text")?.unwrap_or_default(),
            keys: a.texts("keys")?,
        }),
        "stop" => Request::Stop(StopArgs {
            id: a.required("id")?,
            grace_s: a.number("grace_s")?,
            actor: match a.text("as")?.as_deref() {
                None | Some("agent") => Actor::Agent,
                Some("person") => Actor::Person,
                Some(other) => {
                    return Err(WireError::bad_request(format!(
                        "as: {other}? use agent or person"
                    )))
                }
            },
        }),
        "wait" => {
            let mut ids = a.texts("ids")?;
            ids.extend(a.text("id")?);
            Request::Wait(WaitArgs {
                ids,
                all: a.flag("all")?,
                until: a.text("until")?,
                timeout_s: a.number("timeout_s")?,
            })
        }
        "monitor" => Request::Monitor(monitor_args(&a)?),
        "notices" => Request::Notices {
            peek: a.flag("peek")?,
            follow: false,
            wait_s: None,
            ack: false,
            limit: None,
            bind_harness: None,
        },
        "resize" => Request::Resize {
            id: a.required("id")?,
            cols: a.size("cols")?,
            rows: a.size("rows")?,
        },
        "dismiss" => Request::Dismiss {
            id: a.text("id")?,
            ids: a.texts("ids")?,
        },
        "restart" => {
            let caller = CallerEnv::of_this_process();
            Request::Restart(RestartArgs {
                id: a.required("id")?,
                env: env_arg(&a)?,
                inherit_env: Some(caller.text),
                inherit_env_bytes: caller.bytes,
                plain_env: false,
                window_ms: a.count("window_ms")?.map(|n| n as u64),
            })
        }
        "agent_start" => Request::AgentStart(local(start_args(&a)?)),
        _ => unreachable!("checked against the definitions"),
    };
    Ok(request)
}
