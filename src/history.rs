//! Run history: how long a command usually takes in a folder, from the ends bgwork
//! recorded (contract §13). The store keeps the runs, this reads them (its only I/O:
//! a folder's canonical path, in [`normalise_folder`]).
//!
//! How it works: every ended job or pane adds one [`Run`] under its key, the job's
//! folder and its command's [`key`], in the transaction that records its end. The
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
/// The longest command kept whole as a key: a longer one is kept as its first part, cut
/// with "…", and a digest of the whole, so two long commands never merge.
pub const COMMAND_MAX: usize = 4096;
/// How much of a long command its key shows.
const COMMAND_SHOWN: usize = 4000;

/// The blanks folded: what bash splits words on (a space, a tab). A `\r`, a no-break
/// space or another Unicode space is part of a word to bash, so it is kept.
fn blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The command as its runs are filed: blanks (spaces, tabs) collapsed to one space, each
/// line (ended by `\n`) trimmed, empty lines dropped, so `pytest -q` and ` pytest  -q `
/// are one command.
pub fn normalise(command: &str) -> String {
    command
        .split('\n')
        .map(|line| {
            line.split(blank)
                .filter(|word| !word.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The key a command's runs are kept under: [`normalise`]d, token shapes masked (as
/// every reader masks them, so no key holds a token), and one over [`COMMAND_MAX`]
/// bytes cut with "…" and told apart by a digest of the whole.
pub fn key(command: &str) -> String {
    let key = crate::redact::mask_shapes(normalise(command));
    if key.len() <= COMMAND_MAX {
        return key;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let mut end = COMMAND_SHOWN;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes, sha256 {hex})", &key[..end], key.len())
}

/// The key of a folder: its canonical path when it exists here (`..` and symbolic
/// links resolved, so one folder has one history however it is named); otherwise the
/// path with `.`, `..`, repeated and trailing slashes resolved as text (`/a/./b/../c/`
/// is `/a/c`).
pub fn normalise_folder(cwd: &str) -> String {
    if cwd.starts_with('/') {
        if let Some(real) = std::fs::canonicalize(cwd)
            .ok()
            .and_then(|p| p.to_str().map(str::to_string))
        {
            return real;
        }
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in cwd.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            // Above the root is the root.
            ".." if cwd.starts_with('/') => {}
            part => parts.push(part),
        }
    }
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
    /// How many runs ended by themselves: the basis of the usual time.
    pub own_ends: usize,
    /// The newest runs that ended by themselves looked at for failures (at most
    /// [`RECENT`]), and how many of them failed.
    pub recent: usize,
    pub recent_failed: usize,
}

impl Expectation {
    /// The expectation of `runs` (newest first); none when there are none.
    pub fn of(runs: &[Run]) -> Option<Expectation> {
        if runs.is_empty() {
            return None;
        }
        let own: Vec<&Run> = runs.iter().filter(|r| r.ended_by_itself()).collect();
        let mut durations: Vec<u64> = own.iter().filter_map(|r| r.duration_ms).collect();
        durations.sort_unstable();
        let recent = own.len().min(RECENT);
        Some(Expectation {
            runs: runs.len(),
            usual_ms: median(&durations),
            p90_ms: rank(&durations, 90),
            own_ends: durations.len(),
            recent,
            recent_failed: own[..recent]
                .iter()
                .filter(|r| r.end == End::Failed)
                .count(),
        })
    }

    /// The runs the usual time comes from, in words: "5 runs", or "3 of 7 runs ended by
    /// themselves" when others were stopped, signaled or lost.
    pub fn basis(&self) -> String {
        match self.own_ends == self.runs {
            true => plural(self.runs, "run"),
            false => format!(
                "{} of {} ended by themselves",
                self.own_ends,
                plural(self.runs, "run")
            ),
        }
    }

    /// One short line: "usually 41 s (5 runs; 2 of the last 5 failed)". The count is
    /// of the runs the usual time comes from (those that ended by themselves), and so
    /// are the failures.
    pub fn line(&self) -> String {
        let Some(usual) = self.usual_ms else {
            return format!(
                "no usual time: {}, none ended by itself (stopped, signaled or lost)",
                plural(self.runs, "run")
            );
        };
        format!("usually {} ({})", human_ms(usual), self.counted())
    }

    /// What the usual time comes from and how the last runs ended, the words in the
    /// brackets of [`Expectation::line`]: "5 runs; 2 of the last 5 failed".
    pub fn counted(&self) -> String {
        let failed = match (self.recent_failed, self.recent) {
            (0, _) => String::new(),
            (_, 1) => "; it failed".to_string(),
            (failed, recent) if failed == recent => format!("; the last {recent} failed"),
            (failed, recent) => format!("; {failed} of the last {recent} failed"),
        };
        format!("{}{failed}", self.basis())
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
    ///
    /// 3× is of the usual time as shown ([`shown_ms`]), and the whole is a figure a
    /// shown duration reaches: the notice's "has run 1.8 s, 3.0× its usual 0.6 s"
    /// holds for the numbers it shows.
    pub fn overrun_after(&self, margin: Duration) -> Option<Duration> {
        let usual = self.usual_ms?;
        let margin = margin.as_millis().min(u64::MAX as u128) as u64;
        let after = shown_ms(usual)
            .saturating_mul(3)
            .max(usual.saturating_add(margin));
        Some(Duration::from_millis(shown_ceil_ms(after)))
    }
}

/// The median of sorted `values`: the middle one, or the mean of the two middle ones of
/// an even count.
fn median(values: &[u64]) -> Option<u64> {
    let n = values.len();
    match n {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2]),
        n => {
            let (a, b) = (values[n / 2 - 1], values[n / 2]);
            // No sum that could overflow.
            Some(a / 2 + b / 2 + (a % 2 + b % 2) / 2)
        }
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

/// `1 run`, `2 runs`: a count of things in replies, never `1 items`.
pub fn plural(n: usize, word: &str) -> String {
    match n {
        1 => format!("1 {word}"),
        n => format!("{n} {word}s"),
    }
}

/// A duration for a person: `0.4 s`, `4.2 s`, `12.3 s`, `41 s`, `60 s`, `1m20s`, `2h05m`:
/// tenths of a second below a minute (no `.0` from 10 s to 60 s), seconds below an hour,
/// minutes past it. The one formatter of durations in replies and notices.
pub fn human_ms(ms: u64) -> String {
    let ms = shown_ms(ms);
    let seconds = ms / 1000;
    match ms {
        0..=9_999 => format!("{:.1} s", ms as f64 / 1000.0),
        10_000..=59_999 if ms.is_multiple_of(1000) => format!("{seconds} s"),
        10_000..=59_999 => format!("{seconds}.{} s", (ms % 1000) / 100),
        // A whole minute is still seconds: the plain deadline is `60 s`.
        60_000 => "60 s".to_string(),
        60_001..=3_599_999 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60),
    }
}

/// `ms` rounded as [`human_ms`] shows it: to a tenth of a second below a minute, a
/// second below an hour, a minute past it. A figure computed from a shown one (3× the
/// usual time) is computed from this, so the words agree with their numbers.
pub fn shown_ms(ms: u64) -> u64 {
    let grain = match ms {
        0..=59_949 => 100,
        59_950..=3_599_499 => 1000,
        _ => 60_000,
    };
    round_to(ms, grain)
}

/// The smallest shown figure at or past `ms` (a threshold a shown duration reaches).
pub fn shown_ceil_ms(ms: u64) -> u64 {
    let shown = shown_ms(ms);
    if shown >= ms {
        return shown;
    }
    let grain = match shown {
        0..=59_949 => 100,
        59_950..=3_599_499 => 1000,
        _ => 60_000,
    };
    shown.saturating_add(grain)
}

fn round_to(ms: u64, grain: u64) -> u64 {
    (ms / grain)
        .saturating_mul(grain)
        .saturating_add(if ms % grain >= grain / 2 { grain } else { 0 })
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
        assert_eq!(
            normalise_folder("/nonexistent-bgwork/a/../b/."),
            "/nonexistent-bgwork/b"
        );
        assert_eq!(normalise_folder("/../x-bgwork-none"), "/x-bgwork-none");
        assert_eq!(normalise("a\u{a0}b  c\r\n d"), "a\u{a0}b c\r\nd");
        let long = "x".repeat(5000);
        assert_ne!(key(&format!("{long} 1")), key(&format!("{long} 2")));
        assert!(key(&long).contains("… (5000 bytes, sha256 "));
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
        assert_eq!(human_ms(59_449), "59.4 s");
        assert_eq!(human_ms(41_000), "41 s");
        assert_eq!(human_ms(10_200), "10.2 s");
        assert_eq!(human_ms(59_950), "60 s");
        assert_eq!(human_ms(61_000), "1m01s");
        assert_eq!(shown_ms(569), 600);
        assert_eq!(shown_ceil_ms(10_201), 10_300);
        assert_eq!(human_ms(3_599_400), "59m59s");
        assert_eq!(human_ms(3_599_500), "1h00m");
        assert!(!human_ms(u64::MAX).is_empty());
        let one = Expectation::of(&[run(End::Succeeded, 2_000)]).unwrap();
        assert_eq!(one.line(), "usually 2.0 s (1 run)");
        assert_eq!(one.overrun_after(minute), Some(Duration::from_secs(62)));
        assert_eq!(median(&[1, 1, 1, 8, 30, 30]), Some(4));
        assert_eq!(median(&[u64::MAX, u64::MAX]), Some(u64::MAX));
        let mixed = vec![
            run(End::StoppedByAgent, 9_000),
            run(End::Failed, 1_000),
            run(End::Succeeded, 1_000),
            run(End::Failed, 1_000),
        ];
        let e = Expectation::of(&mixed).unwrap();
        assert_eq!(
            e.line(),
            "usually 1.0 s (3 of 4 runs ended by themselves; 2 of the last 3 failed)"
        );
    }
}
