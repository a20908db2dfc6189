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

/// Whether an `sbatch` option takes a value (getopt's `has_arg`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Takes {
    No,
    Required,
    /// Only attached: `--nice=5`, never `--nice 5`.
    Optional,
}
use Takes::{No, Optional, Required};

/// Every long option of `sbatch` (Slurm 22.05, read from sbatch itself: its getopt
/// table names them when asked for an ambiguous prefix) and whether it takes a value.
/// An option that is not here is refused: bgwork cannot tell what it would do.
const LONG_OPTIONS: [(&str, Takes); 106] = [
    ("account", Required),
    ("acctg-freq", Required),
    ("array", Required),
    ("batch", Required),
    ("bb", Required),
    ("bbf", Required),
    ("begin", Required),
    ("chdir", Required),
    ("cluster", Required),
    ("cluster-constraint", Required),
    ("clusters", Required),
    ("comment", Required),
    ("constraint", Required),
    ("container", Required),
    ("context", Required),
    ("contiguous", No),
    ("core-spec", Required),
    ("cores-per-socket", Required),
    ("cpu-freq", Required),
    ("cpus-per-gpu", Required),
    ("cpus-per-task", Required),
    ("deadline", Required),
    ("delay-boot", Required),
    ("dependency", Required),
    ("distribution", Required),
    ("error", Required),
    ("exclude", Required),
    ("exclusive", Optional),
    ("export", Required),
    ("export-file", Required),
    ("extra-node-info", Required),
    ("get-user-env", Optional),
    ("gid", Required),
    ("gpu-bind", Required),
    ("gpu-freq", Required),
    ("gpus", Required),
    ("gpus-per-node", Required),
    ("gpus-per-socket", Required),
    ("gpus-per-task", Required),
    ("gres", Required),
    ("gres-flags", Required),
    ("help", No),
    ("hint", Required),
    ("hold", No),
    ("ignore-pbs", No),
    ("input", Required),
    ("job-name", Required),
    ("kill-on-invalid-dep", Required),
    ("licenses", Required),
    ("mail-type", Required),
    ("mail-user", Required),
    ("mcs-label", Required),
    ("mem", Required),
    ("mem-bind", Required),
    ("mem-per-cpu", Required),
    ("mem-per-gpu", Required),
    ("mincpus", Required),
    ("network", Required),
    ("nice", Optional),
    ("no-kill", Optional),
    ("no-requeue", No),
    ("nodefile", Required),
    ("nodelist", Required),
    ("nodes", Required),
    ("ntasks", Required),
    ("ntasks-per-core", Required),
    ("ntasks-per-gpu", Required),
    ("ntasks-per-node", Required),
    ("ntasks-per-socket", Required),
    ("ntasks-per-tres", Required),
    ("open-mode", Required),
    ("output", Required),
    ("overcommit", No),
    ("oversubscribe", No),
    ("parsable", No),
    ("partition", Required),
    ("power", Required),
    ("prefer", Required),
    ("priority", Required),
    ("profile", Required),
    ("propagate", Optional),
    ("qos", Required),
    ("quiet", No),
    ("reboot", No),
    ("requeue", No),
    ("reservation", Required),
    ("signal", Required),
    ("sockets-per-node", Required),
    ("spread-job", No),
    ("switches", Required),
    ("tasks-per-node", Required),
    ("test-only", No),
    ("thread-spec", Required),
    ("threads-per-core", Required),
    ("time", Required),
    ("time-min", Required),
    ("tmp", Required),
    ("uid", Required),
    ("usage", No),
    ("use-min-nodes", No),
    ("verbose", No),
    ("version", No),
    ("wait", No),
    ("wait-all-nodes", Required),
    ("wckey", Required),
    ("wrap", Required),
];

/// `sbatch`'s short options and the long option each one is.
const SHORT_OPTIONS: [(char, &str); 34] = [
    ('a', "array"),
    ('A', "account"),
    ('b', "begin"),
    ('B', "extra-node-info"),
    ('c', "cpus-per-task"),
    ('C', "constraint"),
    ('d', "dependency"),
    ('D', "chdir"),
    ('e', "error"),
    ('F', "nodefile"),
    ('G', "gpus"),
    ('h', "help"),
    ('H', "hold"),
    ('i', "input"),
    ('J', "job-name"),
    ('k', "no-kill"),
    ('L', "licenses"),
    ('m', "distribution"),
    ('M', "clusters"),
    ('n', "ntasks"),
    ('N', "nodes"),
    ('o', "output"),
    ('O', "overcommit"),
    ('p', "partition"),
    ('q', "qos"),
    ('Q', "quiet"),
    ('s', "oversubscribe"),
    ('S', "core-spec"),
    ('t', "time"),
    ('v', "verbose"),
    ('V', "version"),
    ('w', "nodelist"),
    ('W', "wait"),
    ('x', "exclude"),
];

/// The `sbatch` options bgwork sets itself or cannot follow, which `--sbatch-arg` may
/// not give, with why.
const OWN_OPTIONS: [(&str, &str); 19] = [
    ("job-name", NAME_AND_FILES),
    ("output", NAME_AND_FILES),
    ("error", NAME_AND_FILES),
    ("chdir", NAME_AND_FILES),
    ("parsable", NAME_AND_FILES),
    ("open-mode", NAME_AND_FILES),
    // A requeued job would run again a spec already taken.
    ("requeue", NAME_AND_FILES),
    ("no-requeue", NAME_AND_FILES),
    ("wrap", NAME_AND_FILES),
    (
        "array",
        "bgwork runs one job per start and cannot follow the tasks of an array: start \
         one job per task",
    ),
    ("export", ENVIRONMENT),
    ("export-file", ENVIRONMENT),
    ("get-user-env", ENVIRONMENT),
    (
        "clusters",
        "bgwork follows its jobs on the cluster of SLURM_CONF: set SLURM_CONF for another",
    ),
    (
        "cluster",
        "bgwork follows its jobs on the cluster of SLURM_CONF: set SLURM_CONF for another",
    ),
    (
        "wait",
        "sbatch would not answer until the job ends: bgwork waits itself",
    ),
    ("test-only", NO_JOB),
    ("help", NO_JOB),
    ("usage", NO_JOB),
];
const NAME_AND_FILES: &str =
    "the job's name, output, folder and requeueing are how bgwork finds and reads the job";
const ENVIRONMENT: &str = "bgwork gives the job its environment itself (the caller's, with \
     Slurm's own variables); give variables with --env";
const NO_JOB: &str = "it submits no job";

/// What one `--sbatch-arg` sets, read as `sbatch`'s getopt_long reads it: a long
/// option by its name or any unambiguous prefix of it (`--job` is `--job-name`), its
/// value after `=`; short options grouped (`-vJx` is `-v -J x`), a short option's value
/// attached (`-Jx`). The value must be in the same argument: one that would take the
/// next argument is refused, so no argument is ever read as another's value. Returns
/// the long names of the options it sets.
fn sbatch_options(arg: &str) -> Result<Vec<&'static str>, String> {
    if let Some(long) = arg.strip_prefix("--") {
        let (name, value) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (long, None),
        };
        if name.is_empty() {
            return Err("give one sbatch option as one argument, e.g. --constraint=a100".into());
        }
        let (full, takes) = long_option(name)?;
        match (takes, value) {
            (Required, None) => Err(format!(
                "give its value in the same argument: --sbatch-arg=--{full}=VALUE"
            )),
            (No, Some(_)) => Err(format!("sbatch's --{full} takes no value")),
            _ => Ok(vec![full]),
        }
    } else if let Some(group) = arg.strip_prefix('-').filter(|g| !g.is_empty()) {
        let mut names = Vec::new();
        for (at, letter) in group.char_indices() {
            let Some(&(_, full)) = SHORT_OPTIONS.iter().find(|(c, _)| *c == letter) else {
                return Err(format!("sbatch has no option -{letter}"));
            };
            names.push(full);
            if takes(full) == Required {
                // The rest of the argument is its value.
                if at + letter.len_utf8() == group.len() {
                    return Err(format!(
                        "give its value in the same argument: --sbatch-arg=-{letter}VALUE or \
                         --sbatch-arg=--{full}=VALUE"
                    ));
                }
                break;
            }
        }
        Ok(names)
    } else {
        Err("give one sbatch option as one argument, e.g. --constraint=a100".into())
    }
}

/// A long option by its name, or by a prefix of exactly one option's name.
fn long_option(name: &str) -> Result<(&'static str, Takes), String> {
    if let Some(&found) = LONG_OPTIONS.iter().find(|(full, _)| *full == name) {
        return Ok(found);
    }
    let matches: Vec<_> = LONG_OPTIONS
        .iter()
        .filter(|(full, _)| full.starts_with(name))
        .collect();
    match matches.as_slice() {
        [&found] => Ok(found),
        [] => Err(format!(
            "--{name} is no sbatch option bgwork knows (see sbatch --help)"
        )),
        many => Err(format!(
            "--{name} is ambiguous in sbatch: it may be {}",
            many.iter()
                .map(|(full, _)| format!("--{full}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn takes(full: &str) -> Takes {
    LONG_OPTIONS
        .iter()
        .find(|(name, _)| *name == full)
        .map_or(Required, |&(_, takes)| takes)
}

/// Why an extra `sbatch` option is refused, if it is.
fn check_sbatch_arg(arg: &str) -> Result<(), String> {
    if arg.chars().any(char::is_control) {
        return Err("give one sbatch option as one argument, e.g. --constraint=a100".into());
    }
    for name in sbatch_options(arg)? {
        if let Some((_, why)) = OWN_OPTIONS.iter().find(|(own, _)| *own == name) {
            return Err(match *why == NAME_AND_FILES || *why == ENVIRONMENT {
                true => format!("bgwork sets --{name} itself ({why})"),
                false => format!("bgwork does not take --{name}: {why}"),
            });
        }
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

    /// Issue 22, item 8: every form getopt_long reads as an option bgwork sets.
    #[test]
    fn issue22_8_abbreviated_and_grouped_forms_are_read_as_sbatch_reads_them() {
        for (arg, own) in [
            ("--job=evil", "job-name"),
            ("--j=evil", "job-name"),
            ("--job-n=evil", "job-name"),
            ("-vJevil2", "job-name"),
            ("-QvJevil", "job-name"),
            ("-Jevil", "job-name"),
            ("--arr=0-2", "array"),
            ("--ar=0-2", "array"),
            ("-a0-2", "array"),
            ("-va0-2", "array"),
            ("--outp=/tmp/x", "output"),
            ("-o/tmp/x", "output"),
            ("-vo/tmp/x", "output"),
            ("--err=/tmp/x", "error"),
            ("-e/tmp/x", "error"),
            ("--ch=/", "chdir"),
            ("-vD/", "chdir"),
            ("--req", "requeue"),
            ("--requeue", "requeue"),
            ("--no-r", "no-requeue"),
            ("--pars", "parsable"),
            ("--wr=true", "wrap"),
            ("--export=ALL", "export"),
            ("--export-f=/tmp/env", "export-file"),
            ("--get", "get-user-env"),
            ("--get-user-env=10L", "get-user-env"),
            ("-Mother", "clusters"),
            ("--clusters=other", "clusters"),
            ("--cluster=other", "cluster"),
            ("-W", "wait"),
            ("-vW", "wait"),
            ("--wait", "wait"),
            ("--te", "test-only"),
            ("--open=append", "open-mode"),
        ] {
            let why = check_sbatch_arg(arg).expect_err(arg);
            let named = why.contains(&format!("sets --{own} itself"))
                || why.contains(&format!("does not take --{own}:"));
            assert!(named, "{arg}: {why}");
        }
    }

    #[test]
    fn issue22_8_a_value_must_be_in_its_own_argument() {
        // The next argument would be read as the value: refused, whatever it is.
        for arg in ["-J", "-vJ", "--job-name", "--comment", "-p", "--partition"] {
            let why = check_sbatch_arg(arg).expect_err(arg);
            assert!(why.contains("in the same argument"), "{arg}: {why}");
        }
        // An option of no value given one, and what is no option at all.
        assert!(check_sbatch_arg("--hold=yes")
            .unwrap_err()
            .contains("takes no value"));
        for arg in [
            "evil.sh",
            "-",
            "--",
            "--=x",
            "-E",
            "-vE",
            "--no-such-option=1",
        ] {
            assert!(check_sbatch_arg(arg).is_err(), "{arg}");
        }
        // Ambiguous prefixes, which sbatch refuses too, are named.
        let why = check_sbatch_arg("--cpu=2").unwrap_err();
        assert!(
            why.contains("ambiguous") && why.contains("--cpus-per-task"),
            "{why}"
        );
    }

    #[test]
    fn issue22_8_options_bgwork_leaves_to_the_caller_pass_in_every_form() {
        for arg in [
            "--constraint=a100",
            "--cons=a100",
            "-Ca100",
            "-C=a100",
            "--comment=--job-name=x",
            "-vvQ",
            "-H",
            "--hold",
            "--nice",
            "--nice=5",
            "--exclusive",
            "--exclusive=user",
            "-kH",
            "-n4",
            "-vn4",
            "--account=lab",
            "-Alab",
            "--qos=high",
            "--mail-type=END",
            "--signal=USR1@60",
            "--gres=gpu:1",
            "-pdebug",
            "--begin=now+1",
            "--dependency=afterok:1",
            "-d=afterok:1",
            // The value of a short option is the rest, whatever it holds.
            "-pJ",
        ] {
            assert!(
                check_sbatch_arg(arg).is_ok(),
                "{arg}: {:?}",
                check_sbatch_arg(arg)
            );
        }
    }

    #[test]
    fn every_short_option_is_a_long_one_of_the_table() {
        for (letter, full) in SHORT_OPTIONS {
            assert!(
                LONG_OPTIONS.iter().any(|(name, _)| *name == full),
                "-{letter} is --{full}"
            );
        }
        for (own, _) in OWN_OPTIONS {
            assert!(LONG_OPTIONS.iter().any(|(name, _)| *name == own), "{own}");
        }
    }
}
