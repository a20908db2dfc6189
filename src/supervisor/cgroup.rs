//! A job's cgroup (v2), where the kernel lets this user make one: every process the
//! job ever starts is born inside it, whatever it does to its session, group or
//! environment, so what is left of a job whose supervisor died can be found whole and
//! killed with one write to `cgroup.kill`.
//!
//! How it works: the supervisor makes a child of its own cgroup, `bgwork-PID-START`,
//! and moves itself into it while it waits for its job (a move takes milliseconds, not
//! to be spent while a caller waits for the start); it leaves it and removes it when
//! the job is over, or when no job came. Empty ones whose supervisor is gone are
//! removed by the next supervisor (`remove_stale`). Everything here is best effort: where there is no writable cgroup v2
//! (no unified hierarchy, no delegation) the job runs without one and the sweep falls
//! back to the session, the group and the `BGWORK_JOB` marker.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Makes a cgroup for this process's job and moves this process into it.
pub fn enter(name: &str) -> Option<PathBuf> {
    let own = own_cgroup()?;
    let dir = own.join(name);
    std::fs::create_dir(&dir).ok()?;
    if std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).is_err() {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some(dir)
}

/// Removes the empty job cgroups beside this process's own whose supervisor is gone (one
/// killed before its job, say, leaves its cgroup behind): a cgroup with a process in it
/// cannot be removed, and one whose supervisor lives (`lives(pid, start)`) is left alone.
pub fn remove_stale(lives: impl Fn(i32, u64) -> bool) {
    let Some(own) = own_cgroup() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(&own) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, start)) = name
            .to_str()
            .and_then(|n| n.strip_prefix("bgwork-"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, start)| Some((pid.parse::<i32>().ok()?, start.parse::<u64>().ok()?)))
        else {
            continue;
        };
        if !lives(pid, start) {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// Moves this process out of any job's cgroup it was born in (a daemon started by a
/// `bgwork` call inside a job): to the cgroup that holds the outermost `bgwork-` one,
/// so that killing the job's cgroup never kills the daemon.
pub fn leave_job_cgroups() {
    let Some(own) = own_cgroup() else {
        return;
    };
    let Some(mount) = mount_point() else {
        return;
    };
    let Ok(relative) = own.strip_prefix(&mount) else {
        return;
    };
    let mut outside = mount.clone();
    for part in relative.components() {
        if part.as_os_str().to_string_lossy().starts_with("bgwork-") {
            let _ = std::fs::write(outside.join("cgroup.procs"), std::process::id().to_string());
            return;
        }
        outside.push(part);
    }
}

/// Moves this process back to the parent of `dir` and removes `dir` (empty by now).
pub fn leave(dir: &Path) {
    if let Some(parent) = dir.parent() {
        let _ = std::fs::write(parent.join("cgroup.procs"), std::process::id().to_string());
    }
    let _ = std::fs::remove_dir(dir);
}

/// Kills every process in `dir`, waits (up to a second) until it is empty, removes it,
/// and returns how many processes it held.
pub fn kill_all(dir: &Path) -> usize {
    if !is_bgwork_cgroup(dir) {
        return 0;
    }
    let count = procs(dir).len();
    if std::fs::write(dir.join("cgroup.kill"), "1").is_err() {
        // A kernel before 5.14: one process at a time (a cgroup pins no pid reuse, but
        // these pids are read and killed at once, while they are still members).
        for pid in procs(dir) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while !procs(dir).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_dir(dir);
    count
}

fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Only a cgroup bgwork made, under a cgroup v2 mount, is ever killed.
fn is_bgwork_cgroup(dir: &Path) -> bool {
    let named = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("bgwork-"));
    named && mount_point().is_some_and(|mount| dir.starts_with(mount))
}

/// This process's cgroup v2 folder.
fn own_cgroup() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let relative = text.lines().find_map(|line| line.strip_prefix("0::"))?;
    let mount = mount_point()?;
    Some(mount.join(relative.trim_start_matches('/')))
}

/// Where the cgroup v2 hierarchy is mounted.
fn mount_point() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mount = before.split(' ').nth(4)?;
        (after.split(' ').next()? == "cgroup2").then(|| PathBuf::from(mount))
    })
}
