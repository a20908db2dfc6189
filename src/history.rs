//! Run history: how long a command usually takes in a folder, from the ends bgwork
//! recorded (contract §13). No I/O: the store keeps the runs, this reads them.
//!
//! How it works: every ended job or pane adds one [`Run`] under its key, the job's
//! folder and its command [`normalise`]d, in the transaction that records its end. The
//! runs of a key, newest first, give an [`Expectation`]: the median and p90 of the
//! durations of the runs that ended by themselves (`succeeded` or `failed`; a stop, a
//! signal or a loss says nothing of how long the work takes), and how many of the
//! newest [`RECENT`] failed.

use crate::wire::End;
use std::time::Duration;

/// Runs kept per (folder, command): the newest.
pub const RUNS_KEPT: usize = 20;
/// Runs kept in a home: none older than the newest this many.
pub const RUNS_TOTAL: i64 = 20_000;
/// How many of the newest runs "failed" is counted over.
pub const RECENT: usize = 5;
/// The largest command text kept as a key (longer ones are cut, on a char boundary).
pub const COMMAND_MAX: usize = 4096;

/// The key of a command: blanks (spaces, tabs) collapsed to one space, each line
/// trimmed, empty lines dropped, so `pytest -q` and ` pytest  -q ` are one command.
pub fn normalise(command: &str) -> String {
    let mut key = command
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    if key.len() > COMMAND_MAX {
        let mut end = COMMAND_MAX;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key.truncate(end);
    }
    key
}

/// The key of a folder: the path with `.` components, repeated and trailing slashes
/// dropped (`/a/./b/` is `/a/b`); `..` and links are left as they are (the job's `cwd`
/// was taken as given).
pub fn normalise_folder(cwd: &str) -> String {
    let parts: Vec<&str> = cwd
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    match cwd.starts_with('/') {
        true => format!("/{}", parts.join("/")),
        false => parts.join("/"),
    }
}

/// One ended run of a command, as kept.
#[derive(Debug, Clone)]
pub struct Run {
    pub session: String,
    pub item: String,
    pub started_at: i64,
    pub ended_at: i64,
    /// None when the end's moment is not the work's (`lost`).
    pub duration_ms: Option<u64>,
    pub end: End,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

impl Run {
    /// Whether the work ended by itself, so that its duration says how long it takes.
    pub fn ended_by_itself(&self) -> bool {
        matches!(self.end, End::Succeeded | End::Failed) && self.duration_ms.is_some()
    }
}

/// What the runs of one command say of its next run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expectation {
    /// Runs kept (at most [`RUNS_KEPT`]).
    pub runs: usize,
    /// The median and p90 duration of the runs that ended by themselves; none when no
    /// run did (a server stopped every time has no usual time).
    pub usual_ms: Option<u64>,
    pub p90_ms: Option<u64>,
    /// How many runs ended by themselves.
    pub own_ends: usize,
    /// The newest runs looked at for failures (at most [`RECENT`]), and how many failed.
    pub recent: usize,
    pub recent_failed: usize,
}

impl Expectation {
    /// The expectation of `runs` (newest first); none when there are none.
    pub fn of(runs: &[Run]) -> Option<Expectation> {
        if runs.is_empty() {
            return None;
        }
        let mut durations: Vec<u64> = runs
            .iter()
            .filter(|r| r.ended_by_itself())
            .filter_map(|r| r.duration_ms)
            .collect();
        durations.sort_unstable();
        let recent = runs.len().min(RECENT);
        Some(Expectation {
            runs: runs.len(),
            usual_ms: rank(&durations, 50),
            p90_ms: rank(&durations, 90),
            own_ends: durations.len(),
            recent,
            recent_failed: runs[..recent]
                .iter()
                .filter(|r| r.end == End::Failed)
                .count(),
        })
    }

    /// One short line: "usually 41 s (5 runs; 2 of the last 5 failed)".
    pub fn line(&self) -> String {
        let runs = plural(self.runs, "run");
        let Some(usual) = self.usual_ms else {
            return format!(
                "no usual time: {runs}, none ended by itself (stopped, signaled or lost)"
            );
        };
        let failed = match (self.recent_failed, self.recent) {
            (0, _) => String::new(),
            (_, 1) => "; it failed".to_string(),
            (failed, recent) if failed == recent => format!("; the last {recent} failed"),
            (failed, recent) => format!("; {failed} of the last {recent} failed"),
        };
        format!("usually {} ({runs}{failed})", human_ms(usual))
    }

    /// A running item's progress against its usual time: "running 1m20s, usually 41 s".
    pub fn progress(&self, running_ms: u64) -> Option<String> {
        let usual = self.usual_ms?;
        Some(format!(
            "running {}, usually {}",
            human_ms(running_ms),
            human_ms(usual)
        ))
    }

    /// How long a run may go before it counts as running long: 3× its usual time and at
    /// least `margin` (a minute, unless configured) more than it. None without a usual
    /// time.
    pub fn overrun_after(&self, margin: Duration) -> Option<Duration> {
        let usual = self.usual_ms?;
        let margin = margin.as_millis().min(u64::MAX as u128) as u64;
        Some(Duration::from_millis(
            usual.saturating_mul(3).max(usual.saturating_add(margin)),
        ))
    }
}

/// The nearest-rank percentile of sorted `values`.
fn rank(values: &[u64], percent: usize) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    let index = (values.len() * percent).div_ceil(100).max(1) - 1;
    values.get(index).copied()
}

fn plural(n: usize, word: &str) -> String {
    match n {
        1 => format!("1 {word}"),
        n => format!("{n} {word}s"),
    }
}

/// A duration for a person: `0.4 s`, `4.2 s`, `41 s`, `1m20s`, `2h05m`.
pub fn human_ms(ms: u64) -> String {
    let seconds = ms.saturating_add(500) / 1000;
    match ms {
        0..=9_949 => format!("{:.1} s", ms as f64 / 1000.0),
        9_950..=59_499 => format!("{seconds} s"),
        59_500..=3_599_499 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(end: End, ms: u64) -> Run {
        Run {
            session: "s".into(),
            item: "bg-1".into(),
            started_at: 0,
            ended_at: ms as i64,
            duration_ms: Some(ms),
            end,
            exit_code: None,
            signal: None,
        }
    }

    #[test]
    fn normalised_commands() {
        assert_eq!(normalise("pytest -q "), normalise("pytest -q"));
        assert_eq!(normalise("  pytest\t -q"), "pytest -q");
        assert_eq!(normalise("cd x\n\n  make  all \n"), "cd x\nmake all");
        assert_ne!(normalise("cd x\nmake"), normalise("cd x make"));
        assert_eq!(normalise_folder("/a/./b//c/"), "/a/b/c");
        assert_eq!(normalise_folder("/"), "/");
        assert_eq!(normalise_folder("/a/../b"), "/a/../b");
    }

    #[test]
    fn lines() {
        let runs = vec![
            run(End::Failed, 40_000),
            run(End::Succeeded, 41_000),
            run(End::Failed, 42_000),
            run(End::Succeeded, 39_000),
            run(End::Succeeded, 45_000),
        ];
        let e = Expectation::of(&runs).unwrap();
        assert_eq!(e.line(), "usually 41 s (5 runs; 2 of the last 5 failed)");
        assert_eq!(e.p90_ms, Some(45_000));
        assert_eq!(e.progress(80_000).unwrap(), "running 1m20s, usually 41 s");
        let minute = Duration::from_secs(60);
        assert_eq!(e.overrun_after(minute), Some(Duration::from_secs(123)));
        let stopped = vec![run(End::StoppedByAgent, 5_000)];
        let e = Expectation::of(&stopped).unwrap();
        assert_eq!(e.usual_ms, None);
        assert_eq!(e.overrun_after(minute), None);
        assert_eq!(human_ms(400), "0.4 s");
        assert_eq!(human_ms(59_499), "59 s");
        assert_eq!(human_ms(59_500), "1m00s");
        assert_eq!(human_ms(3_599_400), "59m59s");
        assert_eq!(human_ms(3_599_500), "1h00m");
        assert!(!human_ms(u64::MAX).is_empty());
        let one = Expectation::of(&[run(End::Succeeded, 2_000)]).unwrap();
        assert_eq!(one.line(), "usually 2.0 s (1 run)");
        assert_eq!(one.overrun_after(minute), Some(Duration::from_secs(62)));
    }
}
