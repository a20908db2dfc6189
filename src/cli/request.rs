//! The wire arguments a command's options make: a start's environment and secrets
//! (their values from the caller's environment), its `StartArgs`, where it runs, paths
//! made absolute, timeouts, and a monitor's arguments.

use super::options::{MonitorCmd, OnCmd, StartCmd};
use super::shell;
use crate::wire::{self, WireError};
use std::collections::BTreeMap;

/// `--env K=V` pairs, as UTF-8 text.
pub(super) fn env_pairs(
    pairs: &[std::ffi::OsString],
) -> Result<BTreeMap<String, String>, WireError> {
    let mut env = BTreeMap::new();
    for pair in pairs {
        let pair = pair.to_str().ok_or_else(|| {
            WireError::bad_request(format!(
                "--env {}: not UTF-8, which --env cannot carry; set the variable in bgwork's own \
                 environment instead (inherited variables reach the job as they are)",
                pair.to_string_lossy()
            ))
        })?;
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            WireError::bad_request("--env takes NAME=VALUE and one was given without '='")
        })?;
        env.insert(key.to_string(), value.to_string());
    }
    Ok(env)
}

/// Adds the value of each `--secret NAME` from this process's environment to `env`
/// (a value given with `--env NAME=…` is taken as it is).
pub(super) fn secret_values(
    names: &[String],
    env: &mut BTreeMap<String, String>,
) -> Result<(), WireError> {
    for name in names {
        if env.contains_key(name) {
            continue;
        }
        let value = match std::env::var(name) {
            Ok(value) => value,
            Err(std::env::VarError::NotPresent) => {
                return Err(WireError::bad_request(format!(
                    "--secret {name}: no such variable in your environment; export it first \
                     (or give its value with --env {name}=VALUE)"
                )))
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(WireError::bad_request(format!(
                    "--secret {name}: its value is not UTF-8, which bgwork cannot mask; \
                     the job still inherits it, unmasked, if you leave out --secret"
                )))
            }
        };
        env.insert(name.clone(), value);
    }
    Ok(())
}

pub(super) fn start_args(start: StartCmd) -> Result<wire::StartArgs, WireError> {
    let job = start.job;
    let mut env = env_pairs(&job.env)?;
    secret_values(&job.secrets, &mut env)?;
    let ssh = crate::executor::ssh::choose(start.on.on.as_deref(), "--")?;
    let cwd = match &ssh {
        // A folder on the host, as it is there (none: the remote user's home).
        Some(_) => match job.cwd {
            Some(cwd) => {
                crate::executor::ssh::check_cwd(&cwd, "--cwd")?;
                Some(cwd)
            }
            None => None,
        },
        None => Some(crate::paths::resolve(
            job.cwd.as_deref().unwrap_or("."),
            "--cwd",
        )?),
    };
    let caller = crate::environ::CallerEnv::of_this_process();
    let slurm = slurm_args(start.on, start.pty)?;
    Ok(wire::StartArgs {
        command: shell::command_line(&job.command),
        cwd,
        env,
        inherit_env: Some(caller.text),
        inherit_env_bytes: caller.bytes,
        name: job.name,
        notify: job.notify,
        window_ms: start.window,
        pty: start.pty,
        cols: start.cols,
        rows: start.rows,
        allow_duplicate: start.allow_duplicate,
        quiet_after_s: start.quiet_after,
        max_runtime_s: start.max_runtime,
        secrets: job.secrets,
        keep_raw_log: job.keep_raw_log,
        slurm,
        ssh,
        restart: start.restart.restart.map(|on| wire::RestartPolicyArgs {
            on,
            max_restarts: start.restart.max_restarts,
            backoff: start.restart.backoff,
        }),
        after: start
            .after
            .iter()
            .map(|text| wire::after::After::parse(text))
            .collect::<Result<_, _>>()
            .map_err(WireError::bad_request)?,
    })
}

impl OnCmd {
    /// This machine, whatever `BGWORK_EXECUTOR` says (sub-agents, and `run` without
    /// `--on`).
    pub(super) fn local() -> OnCmd {
        OnCmd {
            on: Some("local".into()),
            ..OnCmd::default()
        }
    }
}

/// Where a `start` runs: `--on`, else `BGWORK_EXECUTOR`, else this machine.
pub(super) fn slurm_args(on: OnCmd, pty: bool) -> Result<Option<wire::SlurmArgs>, WireError> {
    let asked = wire::SlurmArgs {
        partition: on.partition,
        time: on.time,
        cpus: on.cpus,
        mem: on.mem,
        gpus: on.gpus,
        nodes: on.nodes,
        sbatch_args: on.sbatch_args,
    };
    crate::executor::slurm::choose(on.on.as_deref(), asked, pty, "--")
}

/// A path as the caller means it: a relative one is resolved against the caller's
/// directory here, because the daemon's directory means nothing to the caller.
pub(super) fn absolute(path: &str, flag: &str) -> Result<String, WireError> {
    if path.is_empty() {
        return Err(WireError::bad_request(format!(
            "{flag} takes a path to a file"
        )));
    }
    let path = std::path::Path::new(path);
    if path.is_absolute() {
        return Ok(path.display().to_string());
    }
    let here = std::env::current_dir().map_err(|e| {
        WireError::bad_request(format!(
            "{flag} {}: a relative path needs the current directory, which cannot be read ({e}); give an absolute path",
            path.display()
        ))
    })?;
    let joined = here.join(path);
    joined.to_str().map(String::from).ok_or_else(|| {
        WireError::bad_request(format!(
            "{flag} {}: the path is not valid UTF-8",
            joined.display()
        ))
    })
}

pub(super) fn monitor_args(monitor: MonitorCmd) -> Result<wire::MonitorArgs, WireError> {
    use wire::{Condition, MonitorMode};
    let one_of = "give exactly one condition";
    match monitor {
        MonitorCmd::Wait {
            until_output,
            until_port,
            of,
            until_file,
            until_end,
            timeout,
            no_notify,
            name,
            ..
        } => {
            let mut regex = None;
            let mut conditions = Vec::new();
            if let Some(pair) = until_output {
                regex = pair.get(1).cloned();
                conditions.push(Condition::Output {
                    id: pair[0].clone(),
                });
            }
            match (until_port, of) {
                (Some(_), Some(id)) => conditions.push(Condition::PortOf { id }),
                (Some(Some(address)), None) => conditions.push(Condition::Port { address }),
                (Some(None), None) => {
                    return Err(WireError::bad_request(
                        "--until-port takes HOST:PORT, or --of ID for the port an item opens",
                    ))
                }
                (None, _) => {}
            }
            if let Some(path) = until_file {
                conditions.push(Condition::File {
                    path: absolute(&path, "--until-file")?,
                });
            }
            conditions.extend(until_end.map(|id| Condition::End { id }));
            if conditions.len() != 1 {
                return Err(WireError::bad_request(format!(
                    "monitor wait: {one_of} of --until-output, --until-port, --until-file, --until-end"
                )));
            }
            Ok(wire::MonitorArgs {
                mode: MonitorMode::Wait,
                condition: conditions.remove(0),
                regex,
                timeout_s: timeout,
                notify: !no_notify,
                name,
                inherit_env: Some(crate::environ::CallerEnv::of_this_process().text),
            })
        }
        MonitorCmd::Watch {
            output,
            file,
            regex,
            name,
        } => {
            let condition = match (output, file) {
                (Some(id), None) => Condition::Output { id },
                (None, Some(path)) => Condition::File {
                    path: absolute(&path, "--file")?,
                },
                _ => {
                    return Err(WireError::bad_request(format!(
                        "monitor watch: {one_of} of --output ID, --file PATH"
                    )))
                }
            };
            Ok(wire::MonitorArgs {
                mode: MonitorMode::Watch,
                condition,
                regex,
                timeout_s: None,
                notify: true,
                name,
                inherit_env: Some(crate::environ::CallerEnv::of_this_process().text),
            })
        }
    }
}
