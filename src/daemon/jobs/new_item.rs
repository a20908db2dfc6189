//! What every start makes of its arguments, a start now and a waiting item's start
//! alike (`requests/start.rs`, `jobs/after.rs`): the checks of its arguments (no value
//! that is masked may be in what is recorded and shown), where it runs (its folder, a
//! pane's size), its record, its folder, its description (`job.json`) and its
//! environment.

use crate::environ::{self, CallerEnv};
use crate::paths::now_ms;
use crate::redact;
use crate::store::{NewRecord, Record};
use crate::wire::control::{self, JobRecord, PaneSize};
use crate::wire::{Kind, StartArgs, WireError};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The longest `--name` (it is shown in every listing).
pub(crate) const MAX_NAME_BYTES: usize = 4096;

/// A pane's terminal size when the caller gives none.
const DEFAULT_COLS: u16 = 120;
const DEFAULT_ROWS: u16 = 40;

/// Makes a job's folder with a plain `mkdir`, which fails on any existing path (a
/// folder left by an earlier job, or a symbolic link planted to send the job's files
/// elsewhere): a job only ever starts in a folder made for it.
pub(crate) fn make_job_dir(jobs: &Path, job_dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(jobs);
    match std::fs::DirBuilder::new().mode(0o700).create(job_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(format!(
            "its folder {} already exists (a job starts only in a folder made for it): \
             remove it if no job of yours uses it",
            job_dir.display()
        )),
        Err(e) => Err(format!("could not make {}: {e}", job_dir.display())),
    }
}

/// Writes the job's own description into its folder, so that a daemon whose database
/// was lost can take the job back (`JobDir::RECORD`).
/// The environment a job is given before bgwork adds its own variables: the caller's
/// (as text, and as base64 pairs what is not UTF-8), with the `--env` variables over it.
pub(crate) fn job_env(args: &StartArgs) -> (BTreeMap<String, String>, Vec<[String; 2]>) {
    let (mut env, env_bytes) = match &args.inherit_env {
        // A job on an ssh host gets the host's login environment, not this one's.
        _ if args.ssh.is_some() => Default::default(),
        Some(env) => (env.clone(), args.inherit_env_bytes.clone()),
        None => {
            let own = CallerEnv::of_this_process();
            let mut text = own.text;
            // The daemon's own settings (a host's daemon is started with them), not the job's.
            text.remove("BGWORK_EXIT_WHEN_IDLE_MS");
            text.remove("BGWORK_PORTS");
            (text, own.bytes)
        }
    };
    env.extend(args.env.clone());
    let env_bytes = environ::without_names(&env_bytes, &env);
    (env, env_bytes)
}

pub(crate) fn write_job_record(
    job_dir: &Path,
    record: &Record,
    args: &StartArgs,
) -> Result<(), String> {
    let (env, env_bytes) = job_env(args);
    let description = JobRecord {
        session: record.session.clone(),
        id: record.id.clone(),
        kind: record.kind,
        name: record.name.clone(),
        command: record.command.clone(),
        cwd: record.cwd.clone(),
        notify: record.notify,
        env_names: record.env_names.clone(),
        started_at: record.started_at,
        cols: record.cols,
        rows: record.rows,
        secret_names: args.secrets.clone(),
        keep_raw_log: args.keep_raw_log,
        env_digest: Some(environ::digest(&env, &env_bytes)),
        restart: record.restart.as_ref().map(|state| control::RestartRule {
            max_restarts: state.max_restarts,
            backoff_min_ms: state.backoff_min_ms,
            backoff_max_ms: state.backoff_max_ms,
        }),
    };
    std::fs::write(
        crate::job_dir::JobDir(job_dir).record(),
        control::encode(&description),
    )
    .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))
}

pub(crate) fn check_start(args: &StartArgs) -> Result<(), WireError> {
    if args.command.trim().is_empty() {
        return Err(WireError::bad_request(
            "no command: give one after `--`, e.g. `bgwork start -- make test`",
        ));
    }
    let texts = [Some(&args.command), args.cwd.as_ref(), args.name.as_ref()];
    let env = args.env.iter().flat_map(|(k, v)| [k, v]);
    if texts
        .into_iter()
        .flatten()
        .chain(env)
        .any(|t| t.contains('\0'))
    {
        return Err(WireError::bad_request(
            "an argument holds a NUL byte, which no command can receive: remove it",
        ));
    }
    if args.env.keys().any(|k| k.is_empty() || k.contains('=')) {
        return Err(WireError::bad_request(
            "--env takes NAME=VALUE with a non-empty NAME",
        ));
    }
    environ::decode_pairs(&args.inherit_env_bytes).map_err(WireError::bad_request)?;
    if let Some(name) = args.name.as_ref().filter(|n| n.len() > MAX_NAME_BYTES) {
        return Err(WireError::bad_request(format!(
            "the --name is {} bytes long: at most {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    check_secrets(args)?;
    crate::executor::ssh::check(args)?;
    Ok(())
}

/// `--quiet-after` and `--max-runtime` in milliseconds, checked: a quiet spell of 1 s
/// to a week (shorter ones would make a notice of every pause), a run time of 1 ms to
/// a year.
pub(crate) fn limits_of(args: &StartArgs) -> Result<(Option<u64>, Option<u64>), WireError> {
    let check = |flag: &str, value: Option<f64>, min: f64, max_days: f64| match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= min && s <= max_days * 86_400.0 => {
            Ok(Some((s * 1000.0) as u64))
        }
        Some(s) => Err(WireError::bad_request(format!(
            "{flag} takes a duration from {} to {max_days} days, not {s} s: e.g. 30s, 10m, 2h",
            humantime::format_duration(Duration::from_secs_f64(min)),
        ))),
    };
    Ok((
        check("--quiet-after", args.quiet_after_s, 1.0, 7.0)?,
        check("--max-runtime", args.max_runtime_s, 0.001, 365.0)?,
    ))
}

/// The most values one job's log is masked for.
const MAX_SECRETS: usize = 10_000;

fn check_secrets(args: &StartArgs) -> Result<(), WireError> {
    let masked = secret_pairs(args).len();
    if masked > MAX_SECRETS {
        return Err(WireError::bad_request(format!(
            "{masked} values to mask (--secret, and --env values of {} bytes or more): at \
             most {MAX_SECRETS} can be masked for one job",
            redact::MIN_ENV_SECRET_LEN
        )));
    }
    for name in &args.secrets {
        let value = args.env.get(name).ok_or_else(|| {
            WireError::bad_request(format!(
                "secret {name} has no value: give it with --env {name}=VALUE or set it in \
                 the caller's environment"
            ))
        })?;
        if value.len() > redact::MAX_SECRET_LEN {
            return Err(WireError::bad_request(format!(
                "secret {name} is {} bytes long: bgwork masks values of up to {} bytes \
                 (pass a long one with --env: it is masked line by line)",
                value.len(),
                redact::MAX_SECRET_LEN
            )));
        }
        if value.trim().len() < redact::MIN_SECRET_LEN {
            return Err(WireError::bad_request(format!(
                "secret {name} is {} bytes long (without surrounding blanks): values shorter \
                 than {} bytes are refused, \
                 since masking them would mask ordinary text; pass it with --env instead \
                 (short --env values are not masked)",
                value.trim().len(),
                redact::MIN_SECRET_LEN
            )));
        }
    }
    super::held_values::check_held_values(
        args,
        &secret_pairs(args),
        &args.secrets,
        super::held_values::Checked::Start,
    )
}

/// `[name, value]` of each value the job's log is masked for: the `--secret` ones and
/// every `--env` value long enough to be one.
pub(crate) fn secret_pairs(args: &StartArgs) -> Vec<[String; 2]> {
    let named: std::collections::BTreeSet<&String> = args.secrets.iter().collect();
    args.env
        .iter()
        .filter(|(name, value)| {
            let len = value.trim().len();
            len >= redact::MIN_ENV_SECRET_LEN
                || (named.contains(name) && len >= redact::MIN_SECRET_LEN)
        })
        .map(|(name, value)| [name.clone(), value.clone()])
        .collect()
}

/// The record of a new job, pane or sub-agent, as `start` (and a waiting start) keeps it.
pub(crate) fn new_record(
    session: &str,
    kind: Kind,
    args: &StartArgs,
    cwd: &str,
    pane: Option<PaneSize>,
) -> NewRecord {
    NewRecord {
        session: session.to_string(),
        kind,
        name: args.name.clone(),
        command: args.command.clone(),
        cwd: cwd.to_string(),
        notify: args.notify,
        env_names: args.env.keys().cloned().collect(),
        started_at: now_ms(),
        cols: pane.map(|p| p.cols),
        rows: pane.map(|p| p.rows),
    }
}

/// Where a job runs: its working directory (a request with none runs in the daemon
/// user's home, never in the daemon's own folder; a relative one is refused, never
/// interpreted) and, for a pane, its terminal's size.
pub(crate) fn place(args: &StartArgs) -> Result<(String, Option<PaneSize>), WireError> {
    let cwd = match (&args.cwd, &args.ssh) {
        // On an ssh host: the remote user's home.
        (None, Some(_)) => "~".to_string(),
        (cwd, _) => cwd
            .clone()
            .unwrap_or_else(|| std::env::var("HOME").unwrap_or_else(|_| "/".to_string())),
    };
    if cwd != "~" || args.ssh.is_none() {
        crate::paths::require_absolute(&cwd, "cwd")?;
    }
    let pane = match args.pty {
        true => {
            let cols = args.cols.unwrap_or(DEFAULT_COLS);
            let rows = args.rows.unwrap_or(DEFAULT_ROWS);
            crate::daemon::output::pane::check_size(cols, rows)?;
            Some(PaneSize { cols, rows })
        }
        false => None,
    };
    Ok((cwd, pane))
}

/// The options of a job that only its description (`job.json`) keeps: which variables
/// were secrets, and whether its unmasked output was kept. Outside input (the job may
/// have rewritten it): what cannot be read means none.
pub(crate) fn described_options(job_dir: &str) -> (Vec<String>, bool) {
    use std::io::Read;
    let path = crate::job_dir::JobDir(std::path::Path::new(job_dir)).record();
    let mut text = Vec::new();
    let read = crate::paths::open_untrusted(&path)
        .and_then(|file| file.take(1 << 20).read_to_end(&mut text));
    match read
        .ok()
        .and_then(|_| control::decode::<JobRecord>(&text).ok())
    {
        Some(described) => (described.secret_names, described.keep_raw_log),
        None => (Vec::new(), false),
    }
}
