//! The job's process tree: finding every descendant of the supervisor and signalling it.
//!
//! The supervisor is a child subreaper, so a process of the job that escaped its group
//! (`setsid`, a double fork) is re-parented to the supervisor, not to init: walking
//! `/proc/*/stat` for children of the supervisor, and of their children, finds them all.

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::collections::HashMap;

/// Every live descendant of `root` (not `root` itself), zombies excluded. Walks the
/// kernel's per-task `children` lists (cost: the size of the tree), or, where the
/// kernel has none, every process in `/proc`.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        let Some(children) = children_of(pid) else {
            if pid == root {
                return descendants_by_scan(root);
            }
            continue;
        };
        for child in children {
            if matches!(parent_and_state(child), Some((_, state)) if state != 'Z' && state != 'X') {
                found.push(child);
            }
            queue.push(child);
        }
    }
    found
}

/// The children of every thread of `pid`; `None` where the kernel offers no list.
fn children_of(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut children = Vec::new();
    for task in tasks.flatten() {
        let text = std::fs::read_to_string(task.path().join("children")).ok()?;
        children.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    Some(children)
}

fn descendants_by_scan(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for pid in all_pids() {
        if let Some((ppid, state)) = parent_and_state(pid) {
            if state != 'Z' && state != 'X' {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            found.push(child);
            queue.push(child);
        }
    }
    found
}

/// Sends `signal` to the job's group and to every descendant of `root`, with SIGCONT
/// after it so that a stopped process can act on it.
pub fn signal_all(root: i32, group: i32, signal: Signal) {
    let _ = killpg(Pid::from_raw(group), signal);
    for pid in descendants(root) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
    if signal != Signal::SIGKILL {
        let _ = killpg(Pid::from_raw(group), Signal::SIGCONT);
        for pid in descendants(root) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        }
    }
}

/// The pid of every process, from `/proc`.
fn all_pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
}

/// `(ppid, state)` from `/proc/PID/stat`; the name field may hold spaces and parens.
fn parent_and_state(pid: i32) -> Option<(i32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let mut fields = after_name.split(' ');
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Kills every process that carries `BGWORK_JOB=key` in its environment: what is left of
/// a job whose supervisor died. Each process is pinned with a pidfd before it is checked
/// and signalled, so a reused pid can never make this signal an unrelated process.
pub fn sweep_job(key: &str) -> usize {
    if key.is_empty() {
        return 0;
    }
    let marker = format!("BGWORK_JOB={key}");
    let mut killed = 0;
    let me = std::process::id() as i32;
    for pid in all_pids() {
        if pid == me {
            continue;
        }
        let Some(pidfd) = pidfd_open(pid) else {
            continue;
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let ours = environ
            .split(|&b| b == 0)
            .any(|var| var == marker.as_bytes());
        if ours && pidfd_kill(&pidfd) {
            killed += 1;
        }
    }
    killed
}

fn pidfd_open(pid: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative result is a descriptor this process now owns.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_kill(pidfd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let null = std::ptr::null::<nix::libc::siginfo_t>();
    // SAFETY: pidfd_send_signal takes a pidfd, a signal, an optional siginfo and flags.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            nix::libc::SIGKILL,
            null,
            0,
        )
    };
    rc == 0
}

/// Whether `pid` is a live `bgwork supervise` process.
pub fn is_supervisor(pid: i32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let supervise = cmdline.split(|&b| b == 0).nth(1) == Some(b"supervise".as_slice());
    supervise && matches!(parent_and_state(pid), Some((_, state)) if state != 'Z')
}
