//! The MCP tools: their schemas and descriptions (written for a model), and turning a
//! tool call's arguments into the one request type every front end sends.

use crate::environ::CallerEnv;
use crate::wire::{
    self, Actor, Condition, MonitorArgs, MonitorMode, ReadArgs, Request, RestartArgs, RunArgs,
    SendArgs, StartArgs, StopArgs, WaitArgs, WireError,
};
use rmcp::model::ToolAnnotations;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

/// Item fields a model rarely needs; `verbose` keeps them.
/// `read` with `grep` for a model: at most this many matches and bytes of text unless
/// it asks for more.
const MCP_GREP_MATCHES: usize = 100;
const MCP_GREP_BYTES: usize = 32 << 10;

const VERBOSE_FIELDS: [&str; 5] = ["log_path", "folder", "env_names", "cwd", "session"];

/// Adds what a model needs spelled out: the URL of each address an item listens on,
/// and, for a `start` answered with the running item, what happened.
pub fn annotate(reply: &mut Value) {
    fn annotate_item(item: &mut Value) {
        let Value::Object(fields) = item else {
            return;
        };
        let urls: Vec<Value> = match fields.get("listening") {
            Some(Value::Array(addresses)) => addresses
                .iter()
                .filter_map(Value::as_str)
                .map(|a| Value::String(crate::observe::url_of(a)))
                .collect(),
            _ => Vec::new(),
        };
        if !urls.is_empty() {
            fields.insert("urls".into(), Value::Array(urls));
        }
        if fields.get("already_running") == Some(&Value::Bool(true)) {
            let id = fields.get("id").and_then(Value::as_str).unwrap_or("?");
            let message = format!(
                "already running as {id}: no new job was started (`allow_duplicate: true` starts another)"
            );
            fields.insert("message".into(), Value::String(message));
        }
    }
    annotate_item(reply);
    if let Some(Value::Array(items)) = reply.get_mut("items") {
        items.iter_mut().for_each(annotate_item);
    }
}

/// Adds to a `start` result of work that runs on, in one line, where its output is and
/// how its end will reach the model (a notice, or only a `wait`).
pub fn annotate_start(reply: &mut Value) {
    let Value::Object(fields) = reply else {
        return;
    };
    let state = fields.get("state").and_then(Value::as_str);
    let running = matches!(
        state,
        Some("running" | "starting" | "queued" | "restarting")
    );
    let id = fields.get("id").and_then(Value::as_str).unwrap_or("?");
    if state == Some("waiting") {
        let next = format!(
            "{id} runs nothing until then (`waiting_for`); it starts by itself, and if it can \
             no longer start it ends cancelled with a notice saying why; `stop` {id} cancels it"
        );
        fields.insert("next".into(), Value::String(next));
        return;
    }
    if !running || fields.contains_key("message") {
        return;
    }
    let restarts = fields.contains_key("restart");
    let next = if fields.get("notify") == Some(&Value::Bool(true)) {
        format!("{id} runs on: `read` {id} shows its output; its end will come once as a notice, with no polling")
    } else if restarts {
        format!("{id} runs on, started again when it fails: `read` {id} shows its output, `list` its restarts; a notice comes only if it gives up (notify was not set)")
    } else {
        format!("{id} runs on: `read` {id} shows its output, `wait` {id} waits for its end (notify was not set: no notice of its end will come; one still comes if it runs far past its usual time)")
    };
    fields.insert("next".into(), Value::String(next));
}

/// Makes a reply short for a model: each item (a reply that is one, or the `items` of
/// one) loses [`VERBOSE_FIELDS`] and its empty fields.
pub fn slim(reply: &mut Value) {
    fn slim_item(item: &mut Value) {
        if let Value::Object(fields) = item {
            if fields.contains_key("id") && fields.contains_key("state") {
                for key in VERBOSE_FIELDS {
                    fields.remove(key);
                }
                fields.retain(|_, value| !value.is_null());
            }
        }
    }
    slim_item(reply);
    if let Some(Value::Array(items)) = reply.get_mut("items") {
        items.iter_mut().for_each(slim_item);
    }
    // A history names the newest few ends of each command.
    if let Some(Value::Array(commands)) = reply.get_mut("commands") {
        for command in commands {
            if let Some(Value::Array(last)) = command.get_mut("last") {
                last.truncate(crate::history::RECENT);
            }
        }
    }
}

/// The most bytes of commands a `history` result carries: a model's context is no place
/// for a whole folder's history.
pub const MCP_HISTORY_BYTES: usize = 32 << 10;

/// Keeps a `history` result within [`MCP_HISTORY_BYTES`]: the most recently run
/// commands first, as many as fit (always one), and how many were left out and how to
/// ask for one of them.
pub fn bound_history(reply: &mut Value) {
    let Some(Value::Array(commands)) = reply.get_mut("commands") else {
        return;
    };
    let left_out = keep_within(commands, MCP_HISTORY_BYTES);
    if left_out == 0 {
        return;
    }
    reply["left_out"] = left_out.into();
    reply["more"] = format!(
        "{left_out} less recently run commands were left out to keep this short: ask for one \
         with \"command\""
    )
    .into();
}

/// Keeps the first entries of a result whose JSON fits in `bytes` (always one); says
/// how many were left out.
fn keep_within(entries: &mut Vec<Value>, bytes: usize) -> usize {
    let mut used = 0;
    let mut kept = 0;
    for entry in entries.iter() {
        used += serde_json::to_string(entry).map_or(0, |text| text.len() + 1);
        if kept > 0 && used > bytes {
            break;
        }
        kept += 1;
    }
    let left_out = entries.len() - kept;
    entries.truncate(kept);
    left_out
}

/// The most bytes of one text field of a listed item (its command, name, what it
/// waits for) an MCP `list` shows.
pub const MCP_LIST_FIELD_BYTES: usize = 1 << 10;
/// The most bytes of items an MCP `list` result carries.
pub const MCP_LIST_BYTES: usize = 32 << 10;

/// Keeps a `list` result short: each item's long text fields cut at
/// [`MCP_LIST_FIELD_BYTES`] (saying how much was left out), then as many items as fit
/// in [`MCP_LIST_BYTES`] (always one), with `left_out` and `more` saying the rest.
pub fn bound_list(reply: &mut Value) {
    let Some(Value::Array(items)) = reply.get_mut("items") else {
        return;
    };
    for item in items.iter_mut() {
        for field in ["command", "name", "waiting_for", "report", "expected"] {
            let Some(Value::String(text)) = item.get_mut(field) else {
                continue;
            };
            if text.len() <= MCP_LIST_FIELD_BYTES {
                continue;
            }
            let mut cut = MCP_LIST_FIELD_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let left = text.len() - cut;
            text.truncate(cut);
            text.push_str(&format!(
                "… ({left} more bytes left out: `bgwork list --json` shows it whole)"
            ));
        }
    }
    let left_out = keep_within(items, MCP_LIST_BYTES);
    if left_out == 0 {
        return;
    }
    reply["left_out"] = left_out.into();
    reply["more"] = format!(
        "{left_out} more items were left out to keep this short: `bgwork list --json` has \
         them all"
    )
    .into();
}

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false
    })
}

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

/// A start on this machine whatever `BGWORK_EXECUTOR` says: a foreground `run`, a
/// sub-agent.
fn local(mut args: StartArgs) -> StartArgs {
    args.slurm = None;
    args.ssh = None;
    args.after.clear();
    args
}

/// A `run`'s start: on this machine unless `on` names a host (a default from
/// `BGWORK_EXECUTOR` does not send a foreground run away).
fn run_start(a: &Args) -> Result<StartArgs, WireError> {
    let asked = a.text("on")?.filter(|on| on != "local");
    let mut args = start_args(a)?;
    args.after.clear();
    if asked.is_none() {
        return Ok(local(args));
    }
    Ok(args)
}

fn start_args(a: &Args) -> Result<StartArgs, WireError> {
    let ssh = crate::executor::ssh::choose(a.text("on")?.as_deref(), "")?;
    let cwd = match (&ssh, a.text("cwd")?) {
        (Some(_), Some(cwd)) => {
            crate::executor::ssh::check_cwd(&cwd, "cwd")?;
            cwd
        }
        (Some(_), None) => String::new(),
        (None, cwd) => absolute("cwd", cwd.as_deref().unwrap_or("."))?,
    };
    let cwd = (!cwd.is_empty()).then_some(cwd);
    let mut env = env_arg(a)?;
    let secrets = a.texts("secrets")?;
    for name in &secrets {
        if env.contains_key(name) {
            continue;
        }
        let value = std::env::var(name).map_err(|_| {
            WireError::bad_request(format!(
                "secrets: {name} is not set (as UTF-8) in the MCP server's environment; \
                 set it where the server is configured, or pass it in `env`"
            ))
        })?;
        env.insert(name.clone(), value);
    }
    let caller = CallerEnv::of_this_process();
    Ok(StartArgs {
        command: a.required("command")?,
        cwd,
        ssh,
        env,
        inherit_env: Some(caller.text),
        inherit_env_bytes: caller.bytes,
        name: a.text("name")?,
        notify: a.flag("notify")?,
        window_ms: a.count("window_ms")?.map(|n| n as u64),
        pty: a.flag("pty")?,
        cols: a.count("cols")?.map(|n| n.min(u16::MAX as usize) as u16),
        rows: a.count("rows")?.map(|n| n.min(u16::MAX as usize) as u16),
        allow_duplicate: a.flag("allow_duplicate")?,
        quiet_after_s: a.number("quiet_after_s")?,
        max_runtime_s: a.number("max_runtime_s")?,
        secrets,
        keep_raw_log: false,
        restart: restart_policy(a)?,
        slurm: crate::executor::slurm::choose(
            a.text("on")?.as_deref(),
            crate::wire::SlurmArgs {
                partition: a.text("partition")?,
                time: a.text("time")?,
                cpus: a.count("cpus")?.map(|n| n.min(u32::MAX as usize) as u32),
                mem: a.text("mem")?,
                gpus: a.count("gpus")?.map(|n| n.min(u32::MAX as usize) as u32),
                nodes: a.count("nodes")?.map(|n| n.min(u32::MAX as usize) as u32),
                sbatch_args: a.texts("sbatch_args")?,
            },
            a.flag("pty")?,
            "",
        )?,
        after: match a.0.get("after") {
            Some(Value::String(one)) => vec![one.clone()],
            _ => a.texts("after")?,
        }
        .iter()
        .map(|text| crate::wire::after::After::parse(text))
        .collect::<Result<_, _>>()
        .map_err(WireError::bad_request)?,
    })
}

/// The `restart`, `max_restarts` and `backoff` arguments of `start` (the daemon checks
/// them).
fn restart_policy(a: &Args) -> Result<Option<crate::wire::RestartPolicyArgs>, WireError> {
    let max_restarts = a.count("max_restarts")?;
    let backoff = a.text("backoff")?;
    let Some(on) = a.text("restart")? else {
        if max_restarts.is_some() || backoff.is_some() {
            return Err(WireError::bad_request(
                "max_restarts and backoff go with restart: \"on-failure\"; nothing was started",
            ));
        }
        return Ok(None);
    };
    Ok(Some(crate::wire::RestartPolicyArgs {
        on,
        max_restarts: max_restarts.map(|n| n.min(u32::MAX as usize) as u32),
        backoff,
    }))
}

/// The `env` argument: an object of NAME: value strings.
fn env_arg(a: &Args) -> Result<BTreeMap<String, String>, WireError> {
    let mut env = BTreeMap::new();
    if let Some(value) = a.0.get("env") {
        let object = value
            .as_object()
            .ok_or_else(|| WireError::bad_request("env is an object of NAME: value strings"))?;
        for (key, value) in object {
            let value = value
                .as_str()
                .ok_or_else(|| WireError::bad_request(format!("env.{key} must be a string")))?;
            env.insert(key.clone(), value.to_string());
        }
    }
    Ok(env)
}

fn monitor_args(a: &Args) -> Result<MonitorArgs, WireError> {
    let mode = match a.required("mode")?.as_str() {
        "wait" => MonitorMode::Wait,
        "watch" => MonitorMode::Watch,
        other => {
            return Err(WireError::bad_request(format!(
                "mode {other}? use wait or watch"
            )))
        }
    };
    let mut conditions = Vec::new();
    conditions.extend(a.text("until_output")?.map(|id| Condition::Output { id }));
    conditions.extend(
        a.text("until_port")?
            .map(|address| Condition::Port { address }),
    );
    conditions.extend(a.text("until_port_of")?.map(|id| Condition::PortOf { id }));
    for name in ["until_file", "file"] {
        if let Some(path) = a.text(name)? {
            let path = absolute(name, &path)?;
            conditions.push(Condition::File { path });
        }
    }
    conditions.extend(a.text("until_end")?.map(|id| Condition::End { id }));
    conditions.extend(a.text("output")?.map(|id| Condition::Output { id }));
    if conditions.len() != 1 {
        return Err(WireError::bad_request(
            "give exactly one of until_output, until_port, until_port_of, until_file, until_end (wait) or output, file (watch)",
        ));
    }
    Ok(MonitorArgs {
        mode,
        condition: conditions.remove(0),
        regex: a.text("regex")?,
        timeout_s: a.number("timeout_s")?,
        // A monitor exists to notify: a wait does unless asked not to, a watch always.
        notify: !a.flag("no_notify")? || mode == MonitorMode::Watch,
        name: a.text("name")?,
    })
}

/// A path argument as the daemon needs it: absolute. A relative path is taken from the
/// server's own working directory (as a shell would take it from the caller's), and a
/// leading `~` is the home folder (a model writes `~/src` with no shell to expand it).
fn absolute(name: &str, path: &str) -> Result<String, WireError> {
    let home = || {
        std::env::var_os("HOME")
            .filter(|h| Path::new(h).is_absolute())
            .map(PathBuf::from)
            .ok_or_else(|| {
                WireError::bad_request(format!(
                    "{name}: {path} starts with ~ and this server has no HOME: give an absolute path"
                ))
            })
    };
    let full = if path == "~" {
        home()?
    } else if let Some(rest) = path.strip_prefix("~/") {
        home()?.join(rest)
    } else if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        let here = std::env::current_dir().map_err(|e| {
            WireError::bad_request(format!(
                "{name}: {path:?} is relative to this server's working directory, which is \
                 gone ({e}): give an absolute path"
            ))
        })?;
        here.join(path)
    };
    // `Path::components` drops the `.` parts; `..` stays (symlinks make it unsafe to fold).
    let full: PathBuf = full.components().collect();
    full.into_os_string().into_string().map_err(|full| {
        WireError::bad_request(format!(
            "{name}: {} is not valid UTF-8, which a request cannot carry: give an absolute \
             path that is",
            full.to_string_lossy()
        ))
    })
}

/// Typed access to tool arguments, with errors that name the argument.
struct Args<'a>(&'a Map<String, Value>);

impl Args<'_> {
    fn wrong(name: &str, what: &str) -> WireError {
        WireError::bad_request(format!("{name} must be {what}"))
    }
    fn text(&self, name: &str) -> Result<Option<String>, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Self::wrong(name, "a string")),
        }
    }
    fn required(&self, name: &str) -> Result<String, WireError> {
        self.text(name)?
            .ok_or_else(|| WireError::bad_request(format!("{name} is required")))
    }
    fn flag(&self, name: &str) -> Result<bool, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(Self::wrong(name, "true or false")),
        }
    }
    fn number(&self, name: &str) -> Result<Option<f64>, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(_) => Err(Self::wrong(name, "a number")),
        }
    }
    fn count(&self, name: &str) -> Result<Option<usize>, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| Self::wrong(name, "a whole number, 0 or more")),
            Some(_) => Err(Self::wrong(name, "a whole number")),
        }
    }
    fn size(&self, name: &str) -> Result<u16, WireError> {
        let n = self
            .count(name)?
            .ok_or_else(|| WireError::bad_request(format!("{name} is required")))?;
        u16::try_from(n).map_err(|_| Self::wrong(name, "a whole number up to 1000"))
    }
    fn texts(&self, name: &str) -> Result<Vec<String>, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(String::from)
                        .ok_or_else(|| Self::wrong(name, "a list of strings"))
                })
                .collect(),
            Some(_) => Err(Self::wrong(name, "a list of strings")),
        }
    }
}

/// An error as the object of docs/contract.md §10, its message in terms of tools.
pub fn error_object(error: &WireError) -> Value {
    let mut error = error.clone();
    error.message = for_model(&error.message);
    serde_json::to_value(wire::ErrorReply { error }).unwrap_or_default()
}

/// A daemon message written for the command line, in terms of MCP tools: `` `bgwork
/// list --all` `` becomes "the `list` tool with `all: true`", `--grace` `grace_s`.
pub fn for_model(message: &str) -> String {
    use std::sync::OnceLock;
    static COMMAND: OnceLock<regex::Regex> = OnceLock::new();
    static OPTION: OnceLock<regex::Regex> = OnceLock::new();
    let command = COMMAND.get_or_init(|| {
        regex::Regex::new(r"`bgwork ([a-z]+)( start)?([^`]*)`").expect("a valid pattern")
    });
    // A quoted span first (one that gives options is said as arguments, its quotes
    // kept once), then an option named outside any quotes.
    let option = OPTION
        .get_or_init(|| regex::Regex::new(r"`([^`]*)`|--([a-z][a-z-]*)").expect("a valid pattern"));
    let text = command.replace_all(message, |caps: &regex::Captures| {
        let tool = match (&caps[1], caps.get(2).is_some()) {
            ("agent", true) => "agent_start".to_string(),
            (name, _) => name.to_string(),
        };
        let words: Vec<&str> = caps[3].split_whitespace().collect();
        let mut arguments = Vec::new();
        // Every `--env K=V` of the command goes into the one `env` object.
        let mut env = Vec::new();
        let mut index = 0;
        while index < words.len() {
            let word = words[index];
            index += 1;
            let value = words.get(index).filter(|next| !next.starts_with("--"));
            match word.strip_prefix("--") {
                Some("") => break,
                Some("env") => {
                    let (name, text) = value
                        .and_then(|v| v.split_once('='))
                        .unwrap_or(("NAME", "VALUE"));
                    if env.is_empty() {
                        // Its place among the arguments, filled in below.
                        arguments.push(String::new());
                    }
                    env.push(format!("\"{name}\": \"{text}\""));
                    index += 1;
                }
                Some(flag) => {
                    let flag = option_name(flag);
                    match value {
                        Some(value) => {
                            arguments.push(format!("{flag}: {value}"));
                            index += 1;
                        }
                        None => arguments.push(format!("{flag}: true")),
                    }
                }
                None if word.contains('-') && word.len() < 12 => {
                    arguments.push(format!("id: {word}"))
                }
                None => {}
            }
        }
        if let Some(place) = arguments.iter_mut().find(|a| a.is_empty()) {
            *place = format!("env: {{{}}}", env.join(", "));
        }
        match arguments.as_slice() {
            [] => format!("the `{tool}` tool"),
            args => format!("the `{tool}` tool with `{}`", args.join(", ")),
        }
    });
    option
        .replace_all(&text, |caps: &regex::Captures| match caps.get(1) {
            Some(span) if span.as_str().starts_with("--") => {
                format!("`{}`", options_as_arguments(span.as_str()))
            }
            Some(_) => caps[0].to_string(),
            None => format!("`{}`", option_name(&caps[2])),
        })
        .into_owned()
}

/// `--restart on-failure --max-restarts 3` as a tool's arguments:
/// `restart: on-failure, max_restarts: 3`.
fn options_as_arguments(span: &str) -> String {
    let mut arguments: Vec<String> = Vec::new();
    for word in span.split_whitespace() {
        match word.strip_prefix("--") {
            Some(flag) if !flag.is_empty() => {
                arguments.push(format!("{}: true", option_name(flag)))
            }
            _ => match arguments.last_mut() {
                Some(last) if last.ends_with(": true") => {
                    last.truncate(last.len() - "true".len());
                    last.push_str(word);
                }
                Some(last) => {
                    last.push(' ');
                    last.push_str(word);
                }
                None => arguments.push(word.to_string()),
            },
        }
    }
    arguments.join(", ")
}

/// The arguments under the tools' own names: the CLI's names are taken too (`timeout`
/// for `timeout_s`, `grace` for `grace_s`, `window` for `window_ms`, `max-bytes` for
/// `max_bytes`, `secret` for `secrets`). An argument the tool does not take is refused,
/// naming the one meant: a call that did nothing must not look like one that did.
fn with_tool_names(
    tool: &str,
    args: &Map<String, Value>,
    known: &[String],
) -> Result<Map<String, Value>, WireError> {
    let mut named = Map::new();
    for (given, value) in args {
        let Some(name) = tool_name_of(given, known) else {
            let meant = closest(given, known)
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            return Err(WireError::bad_request(format!(
                "{tool} takes no argument `{given}`{meant}, so nothing was done; it takes {}",
                known.join(", ")
            )));
        };
        if named.insert(name.clone(), value.clone()).is_some() {
            return Err(WireError::bad_request(format!(
                "{tool}: `{name}` was given twice (as `{given}` too): give it once, so nothing was done"
            )));
        }
    }
    Ok(named)
}

/// The tool's name for an argument named `given`, the tool's own or the CLI's.
fn tool_name_of(given: &str, known: &[String]) -> Option<String> {
    let snake = given.trim_start_matches('-').replace('-', "_");
    let candidates = [
        snake.clone(),
        option_name(&snake.replace('_', "-")),
        format!("{snake}_s"),
        format!("{snake}_ms"),
        format!("{snake}s"),
    ];
    candidates.into_iter().find(|c| known.contains(c))
}

/// The known argument nearest to `given` (at most 2 edits away, or one that holds it).
fn closest<'a>(given: &str, known: &'a [String]) -> Option<&'a String> {
    let given = given.to_lowercase();
    known
        .iter()
        .map(|k| (edits(&given, k), k))
        .filter(|(d, k)| *d <= 2 || (given.len() >= 3 && k.contains(given.as_str())))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance of two short names.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// The tool argument of a CLI option: `grace` → `grace_s`, `until-output` → `until_output`.
fn option_name(option: &str) -> String {
    match option {
        "grace" => "grace_s".into(),
        "timeout" => "timeout_s".into(),
        "window" => "window_ms".into(),
        "wait" => "wait_s".into(),
        "quiet-after" => "quiet_after_s".into(),
        "max-runtime" => "max_runtime_s".into(),
        other => other.replace('-', "_"),
    }
}

#[cfg(test)]
mod tests {
    use super::for_model;

    #[test]
    fn messages_for_the_command_line_speak_of_tools() {
        assert_eq!(
            for_model("no item bg-9 in this session: `bgwork list --all` shows the ids it has"),
            "no item bg-9 in this session: the `list` tool with `all: true` shows the ids it has"
        );
        assert_eq!(
            for_model("give it again (`bgwork restart bg-1 --env WHO=VALUE`)"),
            "give it again (the `restart` tool with `id: bg-1, env: {\"WHO\": \"VALUE\"}`)"
        );
        // Two values, one object: a second `env` key would replace the first.
        assert_eq!(
            for_model("(`bgwork restart bg-1 --env A=VALUE --env B=VALUE`)"),
            "(the `restart` tool with `id: bg-1, env: {\"A\": \"VALUE\", \"B\": \"VALUE\"}`)"
        );
        assert_eq!(
            for_model("--grace takes seconds; `bgwork stop bg-2` first"),
            "`grace_s` takes seconds; the `stop` tool with `id: bg-2` first"
        );
        assert_eq!(
            for_model("`bgwork agent start -- x`"),
            "the `agent_start` tool"
        );
        // A quoted option is said once, as the tool's argument (issue 26 item 9).
        assert_eq!(
            for_model("the one there is, is `--restart on-failure`; or --pty"),
            "the one there is, is `restart: on-failure`; or `pty`"
        );
        assert_eq!(
            for_model("use `--allow-duplicate` or `--max-restarts 3 --backoff 1s..5s`"),
            "use `allow_duplicate: true` or `max_restarts: 3, backoff: 1s..5s`"
        );
    }
}
