//! What a `start` asks of Slurm, checked before anything is submitted: where it runs
//! (`--on`, `BGWORK_EXECUTOR`) and the `sbatch` options bgwork leaves to the caller.

use crate::wire::SlurmArgs;

/// Where a `start` runs: `on` (`local` or `slurm`), else `BGWORK_EXECUTOR` of this
/// process, else this machine; with Slurm, what it asks of the cluster, checked.
/// `prefix`: how options are named to the caller (`--` on the command line, none in
/// MCP).
pub fn choose(
    on: Option<&str>,
    asked: SlurmArgs,
    pty: bool,
    prefix: &str,
) -> Result<Option<SlurmArgs>, crate::wire::WireError> {
    use crate::wire::WireError;
    let from_env = std::env::var("BGWORK_EXECUTOR")
        .ok()
        .filter(|v| !v.is_empty());
    let executor = on
        .map(str::to_string)
        .or(from_env)
        .unwrap_or_else(|| "local".into());
    let any = asked != SlurmArgs::default();
    match executor.as_str() {
        "local" if any && on.is_some() => Err(WireError::bad_request(format!(
            "{prefix}partition, {prefix}time, {prefix}cpus and {prefix}mem are for a job on \
             Slurm: add {prefix}on slurm"
        ))),
        // A default of slurm from the environment does not send a pane there.
        "local" => Ok(None),
        "slurm" if pty && on.is_some() => Err(WireError::bad_request(format!(
            "a pane cannot run on Slurm: start it with {prefix}on local"
        ))),
        "slurm" if pty => Ok(None),
        "slurm" => {
            for (flag, value) in [
                ("partition", &asked.partition),
                ("time", &asked.time),
                ("mem", &asked.mem),
            ] {
                if let Some(v) = value {
                    let bad = v.is_empty()
                        || v.starts_with('-')
                        || v.chars().any(|c| c.is_whitespace() || c.is_control());
                    if bad {
                        return Err(WireError::bad_request(format!(
                            "{prefix}{flag} {v:?} is no Slurm value: e.g. {prefix}time 1:00:00, \
                             {prefix}mem 4G, {prefix}partition gpu"
                        )));
                    }
                }
            }
            for (flag, value) in [
                ("cpus", asked.cpus),
                ("gpus", asked.gpus),
                ("nodes", asked.nodes),
            ] {
                if value == Some(0) {
                    return Err(WireError::bad_request(format!(
                        "{prefix}{flag} takes 1 or more"
                    )));
                }
            }
            for arg in &asked.sbatch_args {
                check_sbatch_arg(arg).map_err(|why| {
                    WireError::bad_request(format!("{prefix}sbatch-arg {arg:?}: {why}"))
                })?;
            }
            Ok(Some(asked))
        }
        other if other.starts_with("ssh:") && any => Err(WireError::bad_request(format!(
            "{prefix}partition, {prefix}time, {prefix}cpus and {prefix}mem are for a job on \
             Slurm, not on an ssh host"
        ))),
        // An ssh host: see `executor::ssh::choose`.
        other if other.starts_with("ssh:") => Ok(None),
        other => Err(WireError::bad_request(format!(
            "{prefix}on {other:?}: bgwork runs work on `local` (this machine), `slurm` or \
             `ssh:HOST`"
        ))),
    }
}

/// The `sbatch` options bgwork sets itself, which `--sbatch-arg` may not change: the
/// job's name (how a restarted daemon finds it), its output, folder and requeueing (a
/// requeued job would run its spec, already taken, again), and the output format.
const OWN_OPTIONS: [&str; 13] = [
    "--job-name",
    "-J",
    "--output",
    "-o",
    "--error",
    "-e",
    "--chdir",
    "-D",
    "--parsable",
    "--requeue",
    "--no-requeue",
    "--wrap",
    "--array",
];

/// Why an extra `sbatch` option is refused, if it is.
fn check_sbatch_arg(arg: &str) -> Result<(), String> {
    if !arg.starts_with('-') || arg.chars().any(char::is_control) {
        return Err("give one sbatch option as one argument, e.g. --constraint=a100".into());
    }
    let name = arg.split('=').next().unwrap_or(arg);
    let short = OWN_OPTIONS
        .iter()
        .any(|own| own.len() == 2 && arg.starts_with(own) && !arg.starts_with("--"));
    if OWN_OPTIONS.contains(&name) || short {
        return Err(format!(
            "bgwork sets {name} itself (the job's name, output, folder and requeueing are \
             how it finds and reads the job)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbatch_args_may_not_change_what_bgwork_relies_on() {
        assert!(check_sbatch_arg("--constraint=a100").is_ok());
        assert!(check_sbatch_arg("--qos=high").is_ok());
        for bad in [
            "--job-name=x",
            "-Jx",
            "--output=/tmp/x",
            "--requeue",
            "constraint",
            "-D/",
        ] {
            assert!(check_sbatch_arg(bad).is_err(), "{bad}");
        }
    }
}
