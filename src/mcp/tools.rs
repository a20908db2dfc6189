//! The MCP tools: their schemas and descriptions (written for a model), and turning a
//! tool call's arguments into the one request type every front end sends.

use crate::environ::CallerEnv;
use crate::wire::{
    self, Actor, Condition, MonitorArgs, MonitorMode, ReadArgs, Request, RunArgs, SendArgs,
    StartArgs, StopArgs, WaitArgs, WireError,
};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Said once, in the server's instructions, and echoed by the tools.
pub const INSTRUCTIONS: &str = "bgwork runs shell work in the background. Start long work \
(builds, test suites, dev servers, watches) with `start` and keep working: the call returns \
an id at once. You never need to poll: every tool result carries a `notices` array with the \
end and last lines of any work that ended since your last call. Use `wait` (it blocks, with a \
bound) only when your next step needs the result. A command that ends in a few seconds should \
just run with `run`.";

/// Every tool, in the order `tools/list` gives them.
pub fn definitions() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "start",
            "Start a shell command in the background and return its id (bg-N) at once, with \
             what it printed in the first `window_ms` (default 1000). Use it for work that \
             takes longer than ~30 s or never ends (dev servers, watches). Set `notify` to \
             hear of its end in the `notices` of a later result, with no polling. Do not start \
             work whose result you need for your very next step: use `run` or `wait`.",
            schema(
                json!({
                    "command": {"type": "string", "description": "Shell command, run by bash -c"},
                    "notify": {"type": "boolean", "description": "Fire one notice when it ends"},
                    "name": {"type": "string"},
                    "cwd": {"type": "string", "description": "Working directory (default: the server's; a relative path is taken from the server's, ~ is the home folder)"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "Extra variables; their values are never recorded"},
                    "window_ms": {"type": "integer", "minimum": 0},
                    "pty": {"type": "boolean", "description": "Run on a terminal (a pane): keystrokes and a screen"},
                    "cols": {"type": "integer"}, "rows": {"type": "integer"}
                }),
                &["command"],
            ),
        ),
        (
            "run",
            "Run a command in the foreground and return its output and exit status. If it is \
             still running after `timeout_s` (default 60) it moves to the background and you \
             get its id instead (outcome `promoted`), so a slow command never blocks you for \
             longer than the timeout.",
            schema(
                json!({
                    "command": {"type": "string"},
                    "timeout_s": {"type": "number", "minimum": 0},
                    "notify": {"type": "boolean", "description": "Notice when a promoted run ends"},
                    "name": {"type": "string"},
                    "cwd": {"type": "string", "description": "Working directory (default: the server's; a relative path is taken from the server's)"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}}
                }),
                &["command"],
            ),
        ),
        (
            "list",
            "List this session's running work (jobs, panes, monitors, sub-agents); `all` adds \
             ended records.",
            schema(json!({"all": {"type": "boolean"}}), &[]),
        ),
        (
            "read",
            "Read output of an item written since your last read of it (never blocks). An \
             empty `output` with `running: true` means 'not done yet' — do not call read in a \
             loop to wait; use `wait`, or just carry on: its end will arrive as a notice. \
             `tail` gives the last N lines, `screen` a pane's visible screen.",
            schema(
                json!({
                    "id": {"type": "string"},
                    "tail": {"type": "integer", "minimum": 0},
                    "from": {"type": "integer", "minimum": 0},
                    "all": {"type": "boolean"},
                    "raw": {"type": "boolean"},
                    "max_bytes": {"type": "integer", "minimum": 64},
                    "screen": {"type": "boolean"}
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
                    "id": {"type": "string"},
                    "text": {"type": "string"},
                    "keys": {"type": "array", "items": {"type": "string"}}
                }),
                &["id"],
            ),
        ),
        (
            "stop",
            "Stop an item and everything it started: TERM, then KILL after `grace_s` \
             (default 5). Returns its end.",
            schema(
                json!({
                    "id": {"type": "string"},
                    "grace_s": {"type": "number", "minimum": 0},
                    "as": {"type": "string", "enum": ["agent", "person"]}
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
                    "ids": {"type": "array", "items": {"type": "string"}},
                    "id": {"type": "string"},
                    "any": {"type": "boolean"},
                    "all": {"type": "boolean"},
                    "until": {"type": "string"},
                    "timeout_s": {"type": "number", "minimum": 0}
                }),
                &[],
            ),
        ),
        (
            "monitor",
            "Create a monitor (mon-N). mode `wait`: one notice when a condition holds — \
             `until_output` (an id, with `regex`), `until_port` (HOST:PORT accepts connections), \
             `until_file` (exists), `until_end` (an id ended); fails after `timeout_s`. mode \
             `watch`: every line of `output` (an id) or `file` matching `regex` goes to its log \
             (read it with `read`), with notices in batches.",
            schema(
                json!({
                    "mode": {"type": "string", "enum": ["wait", "watch"]},
                    "until_output": {"type": "string"},
                    "until_port": {"type": "string"},
                    "until_file": {"type": "string", "description": "A path; a relative one is taken from the server's working directory"},
                    "until_end": {"type": "string"},
                    "output": {"type": "string"},
                    "file": {"type": "string", "description": "A path; a relative one is taken from the server's working directory"},
                    "regex": {"type": "string"},
                    "timeout_s": {"type": "number", "minimum": 0},
                    "notify": {"type": "boolean"},
                    "name": {"type": "string"}
                }),
                &["mode"],
            ),
        ),
        (
            "notices",
            "Notices of work that ended, each delivered once. Every other tool's result \
             already carries them, so call this only when you have nothing else to do.",
            schema(json!({"peek": {"type": "boolean"}}), &[]),
        ),
    ]
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
    if let Some(unknown) = args.keys().find(|k| !known.contains(k)) {
        return Err(WireError::bad_request(format!(
            "{name} takes no argument {unknown}; it takes {}",
            known.join(", ")
        )));
    }
    let a = Args(args);
    let request = match name {
        "start" => Request::Start(start_args(&a)?),
        "run" => Request::Run(RunArgs {
            start: start_args(&a)?,
            timeout_s: a.number("timeout_s")?,
            stream: false,
        }),
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
            max_bytes: a.count("max_bytes")?,
            screen: a.flag("screen")?,
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
        },
        _ => unreachable!("checked against the definitions"),
    };
    Ok(request)
}

fn start_args(a: &Args) -> Result<StartArgs, WireError> {
    let cwd = absolute("cwd", a.text("cwd")?.as_deref().unwrap_or("."))?;
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
    let caller = CallerEnv::of_this_process();
    Ok(StartArgs {
        command: a.required("command")?,
        cwd: Some(cwd),
        env,
        inherit_env: Some(caller.text),
        inherit_env_bytes: caller.bytes,
        name: a.text("name")?,
        notify: a.flag("notify")?,
        window_ms: a.count("window_ms")?.map(|n| n as u64),
        pty: a.flag("pty")?,
        cols: a.count("cols")?.map(|n| n.min(u16::MAX as usize) as u16),
        rows: a.count("rows")?.map(|n| n.min(u16::MAX as usize) as u16),
    })
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
            "give exactly one of until_output, until_port, until_file, until_end (wait) or output, file (watch)",
        ));
    }
    Ok(MonitorArgs {
        mode,
        condition: conditions.remove(0),
        regex: a.text("regex")?,
        timeout_s: a.number("timeout_s")?,
        notify: a.flag("notify")? || mode == MonitorMode::Watch,
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

/// An error as the object of SPEC §10.
pub fn error_object(error: &WireError) -> Value {
    serde_json::to_value(wire::ErrorReply {
        error: error.clone(),
    })
    .unwrap_or_default()
}
