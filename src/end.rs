//! Classifying how an item ended (contract §2) and writing its one-line report.
//!
//! Every end goes through [`classify`]: the exit code, the killing signal and who asked
//! for a stop, in one function, so no caller invents an end or an exit code.

use crate::wire::control::ExitStatus;
use crate::wire::{Actor, End};

/// Exit codes a shell reports for a job killed by a stop signal (HUP, INT, KILL, TERM).
const STOP_SIGNAL_CODES: [i32; 4] = [129, 130, 137, 143];

/// The end of a job from what its supervisor saw. A pane whose terminal hung up
/// (SIGHUP, or a shell's exit 129) was cancelled.
pub fn classify(status: &ExitStatus, pane: bool) -> End {
    if status.spawn_error.is_some() {
        return End::SpawnFailed;
    }
    match status.stop_actor {
        Some(Actor::Agent) => return End::StoppedByAgent,
        Some(Actor::Person) => return End::StoppedByPerson,
        None => {}
    }
    if let (None, None, Some(end)) = (status.exit_code, status.signal, status.scheduler_end) {
        return end;
    }
    let hung_up =
        status.signal == Some(1) || (status.signal.is_none() && status.exit_code == Some(129));
    if pane && hung_up {
        return End::Cancelled;
    }
    match (status.exit_code, status.signal) {
        (_, Some(_)) => End::Signaled,
        (Some(0), None) => End::Succeeded,
        (Some(code), None) if STOP_SIGNAL_CODES.contains(&code) => End::Signaled,
        (Some(_), None) => End::Failed,
        (None, None) => End::Lost,
    }
}

/// The one-line report of an end, e.g. `bg-3 FAILED (exit 2)`.
/// What an end's report adds when output was lost to a full disk.
pub fn unwritten_note(unwritten: u64) -> String {
    if unwritten == 0 {
        return String::new();
    }
    format!("; {unwritten} bytes of its output could not be written: disk full")
}

/// What an end's report adds about the job's cost: CPU time and peak memory, for a job
/// that used at least a second of CPU or 100 MiB (a quick command's report stays short).
pub fn cost_note(cpu_ms: Option<u64>, peak_rss: Option<u64>) -> String {
    let (cpu, peak) = (cpu_ms.unwrap_or(0), peak_rss.unwrap_or(0));
    if cpu < 1000 && peak < 100 << 20 {
        return String::new();
    }
    format!(
        "; cpu {}, peak memory {}",
        crate::observe::cpu_text(cpu),
        crate::observe::bytes_text(peak)
    )
}

pub fn report(id: &str, end: End, exit_code: Option<i32>, signal: Option<i32>) -> String {
    let how = match (exit_code, signal) {
        (_, Some(signal)) => format!("signal {signal}{}", signal_name(signal)),
        (Some(code), None) => format!("exit {code}"),
        (None, None) => String::new(),
    };
    let how = if how.is_empty() {
        how
    } else {
        format!(" ({how})")
    };
    match end {
        End::Succeeded => format!("{id} finished successfully{how}"),
        End::Failed => format!("{id} FAILED{how}"),
        End::StoppedByAgent => format!("{id} was stopped by the agent"),
        End::StoppedByPerson => format!("{id} was stopped by the person"),
        End::Signaled => format!("{id} was stopped by a signal{how}"),
        End::Cancelled => format!("{id} was cancelled (pane closed)"),
        End::SpawnFailed => format!("{id} could not start"),
        End::Lost => format!("{id} was lost (its end could not be known)"),
    }
}

/// Whether an end counts as a failure for exit codes (a stop is not a failure).
pub fn is_failure(end: End) -> bool {
    matches!(
        end,
        End::Failed | End::Signaled | End::SpawnFailed | End::Lost
    )
}

fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| format!(", {}", s.as_str()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify_job(status: &ExitStatus) -> End {
        classify(status, false)
    }

    fn status(code: Option<i32>, signal: Option<i32>, actor: Option<Actor>) -> ExitStatus {
        ExitStatus {
            exit_code: code,
            signal,
            stop_actor: actor,
            ..ExitStatus::default()
        }
    }

    #[test]
    fn each_row_of_the_end_table() {
        assert_eq!(classify_job(&status(Some(0), None, None)), End::Succeeded);
        assert_eq!(classify_job(&status(Some(2), None, None)), End::Failed);
        assert_eq!(classify_job(&status(Some(143), None, None)), End::Signaled);
        assert_eq!(classify_job(&status(Some(128), None, None)), End::Failed);
        assert_eq!(classify_job(&status(None, Some(9), None)), End::Signaled);
        assert_eq!(
            classify_job(&status(None, Some(15), Some(Actor::Agent))),
            End::StoppedByAgent
        );
        assert_eq!(
            classify_job(&status(Some(0), None, Some(Actor::Person))),
            End::StoppedByPerson
        );
        let spawn = ExitStatus {
            spawn_error: Some("no such directory".into()),
            ..ExitStatus::default()
        };
        assert_eq!(classify_job(&spawn), End::SpawnFailed);
        let hup = status(None, Some(1), None);
        assert_eq!(classify(&hup, true), End::Cancelled);
        assert_eq!(classify(&hup, false), End::Signaled);
    }

    #[test]
    fn reports_read_as_the_spec_says() {
        assert_eq!(
            report("bg-3", End::Succeeded, Some(0), None),
            "bg-3 finished successfully (exit 0)"
        );
        assert_eq!(
            report("bg-3", End::Failed, Some(2), None),
            "bg-3 FAILED (exit 2)"
        );
        assert_eq!(
            report("bg-3", End::Signaled, Some(143), None),
            "bg-3 was stopped by a signal (exit 143)"
        );
        assert_eq!(
            report("bg-3", End::Lost, None, None),
            "bg-3 was lost (its end could not be known)"
        );
    }
}
