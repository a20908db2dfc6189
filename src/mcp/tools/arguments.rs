//! A tool call's arguments read: under the tool's names or the command line's, each of
//! its type, and the start and monitor arguments they make.

use crate::environ::CallerEnv;
use crate::wire::{Condition, MonitorArgs, MonitorMode, StartArgs, WireError};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A start on this machine whatever `BGWORK_EXECUTOR` says: a foreground `run`, a
/// sub-agent.
pub(super) fn local(mut args: StartArgs) -> StartArgs {
    args.slurm = None;
    args.ssh = None;
    args.after.clear();
    args
}

/// A `run`'s start: on this machine unless `on` names a host (a default from
/// `BGWORK_EXECUTOR` does not send a foreground run away).
pub(super) fn run_start(a: &Args) -> Result<StartArgs, WireError> {
    let asked = a.text("on")?.filter(|on| on != "local");
    let mut args = start_args(a)?;
    args.after.clear();
    if asked.is_none() {
        return Ok(local(args));
    }
    Ok(args)
}

pub(super) fn start_args(a: &Args) -> Result<StartArgs, WireError> {
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
pub(super) fn restart_policy(
    a: &Args,
) -> Result<Option<crate::wire::RestartPolicyArgs>, WireError> {
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
pub(super) fn env_arg(a: &Args) -> Result<BTreeMap<String, String>, WireError> {
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

pub(super) fn monitor_args(a: &Args) -> Result<MonitorArgs, WireError> {
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
        inherit_env: Some(CallerEnv::of_this_process().text),
    })
}

/// A path argument as the daemon needs it: absolute. A relative path is taken from the
/// server's own working directory (as a shell would take it from the caller's), and a
/// leading `~` is the home folder (a model writes `~/src` with no shell to expand it).
pub(super) fn absolute(name: &str, path: &str) -> Result<String, WireError> {
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
pub(super) struct Args<'a>(pub(super) &'a Map<String, Value>);

impl Args<'_> {
    fn wrong(name: &str, what: &str) -> WireError {
        WireError::bad_request(format!("{name} must be {what}"))
    }
    pub(super) fn text(&self, name: &str) -> Result<Option<String>, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Self::wrong(name, "a string")),
        }
    }
    pub(super) fn required(&self, name: &str) -> Result<String, WireError> {
        self.text(name)?
            .ok_or_else(|| WireError::bad_request(format!("{name} is required")))
    }
    pub(super) fn flag(&self, name: &str) -> Result<bool, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(Self::wrong(name, "true or false")),
        }
    }
    pub(super) fn number(&self, name: &str) -> Result<Option<f64>, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(_) => Err(Self::wrong(name, "a number")),
        }
    }
    pub(super) fn count(&self, name: &str) -> Result<Option<usize>, WireError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| Self::wrong(name, "a whole number, 0 or more")),
            Some(_) => Err(Self::wrong(name, "a whole number")),
        }
    }
    pub(super) fn size(&self, name: &str) -> Result<u16, WireError> {
        let n = self
            .count(name)?
            .ok_or_else(|| WireError::bad_request(format!("{name} is required")))?;
        u16::try_from(n).map_err(|_| Self::wrong(name, "a whole number up to 1000"))
    }
    pub(super) fn texts(&self, name: &str) -> Result<Vec<String>, WireError> {
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

/// The arguments under the tools' own names: the CLI's names are taken too (`timeout`
/// for `timeout_s`, `grace` for `grace_s`, `window` for `window_ms`, `max-bytes` for
/// `max_bytes`, `secret` for `secrets`). An argument the tool does not take is refused,
/// naming the one meant: a call that did nothing must not look like one that did.
pub(super) fn with_tool_names(
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
pub(super) fn option_name(option: &str) -> String {
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
