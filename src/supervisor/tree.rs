//! The job's process tree: finding every descendant of the supervisor and signalling it.
//!
//! The supervisor is a child subreaper, so a process of the job that escaped its group
//! (`setsid`, a double fork) is re-parented to the supervisor, not to init: walking the
//! kernel's per-task `children` lists (`/proc/PID/task/*/children`) from the supervisor
//! down finds them all (every `/proc/*/stat` is read only where the kernel has no such
//! list).

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::path::Path;

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
            if is_bgwork_service(child) {
                continue;
            }
            if running(child) {
                found.push(child);
            }
            queue.push(child);
        }
    }
    found
}

/// Whether `pid` is a bgwork daemon or supervisor: one that a job started (a daemon
/// started on demand by a `bgwork` call inside a job) is not part of the job, and
/// neither is the work it serves; stops and sweeps leave its whole subtree alone.
fn is_bgwork_service(pid: i32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let role = cmdline.split(|&b| b == 0).nth(1).unwrap_or_default();
    if role != b"daemon" && role != b"supervise" {
        return false;
    }
    let exe = |link: std::path::PathBuf| {
        let text = link.to_string_lossy().into_owned();
        text.strip_suffix(" (deleted)").unwrap_or(&text).to_string()
    };
    let theirs = std::fs::read_link(format!("/proc/{pid}/exe")).map(exe);
    let ours = std::env::current_exe().map(exe);
    matches!((theirs, ours), (Ok(a), Ok(b)) if a == b)
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
            if is_bgwork_service(child) {
                continue;
            }
            found.push(child);
            queue.push(child);
        }
    }
    found
}

/// Sends `signal` to the job's process group and to every descendant of `root` (those
/// that left the group included), and nothing more: a STOP or TSTP stays a stop.
pub fn signal_tree(root: i32, group: i32, signal: Signal) {
    let _ = killpg(Pid::from_raw(group), signal);
    for pid in descendants(root) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// Sends SIGCONT to the job's tree, so that a stopped process acts on a signal it was
/// sent (a TERM of a stop): after [`signal_tree`] for anything but a pause.
pub fn continue_tree(root: i32, group: i32) {
    signal_tree(root, group, Signal::SIGCONT);
}

/// Sends `signal` to the job's process group only, as a terminal sends a key's signal
/// to its foreground group.
pub fn signal_group(group: i32, signal: Signal) {
    let _ = killpg(Pid::from_raw(group), signal);
}

/// The pid of every process, from `/proc`.
fn all_pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
}

/// Whether a process runs: it exists and is no zombie.
pub fn running(pid: i32) -> bool {
    matches!(parent_and_state(pid), Some((_, state)) if state != 'Z' && state != 'X')
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

/// What a supervisor knows of its job's processes, kept in the job's folder
/// (`processes`) once the job runs: where a sweep looks when the supervisor is gone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TreeRecord {
    /// The supervisor's pid and start time (it leads the job's session).
    pub supervisor: Option<(i32, u64)>,
    /// The job's main process and start time (it leads the job's process group).
    pub job: Option<(i32, u64)>,
    /// The job's cgroup, when one could be made.
    pub cgroup: Option<std::path::PathBuf>,
}

impl TreeRecord {
    pub fn write(&self, job_dir: &std::path::Path) -> std::io::Result<()> {
        let mut text = String::new();
        for (name, figures) in [("supervisor", self.supervisor), ("job", self.job)] {
            if let Some((pid, start)) = figures {
                text.push_str(&format!("{name} {pid} {start}\n"));
            }
        }
        if let Some(cgroup) = &self.cgroup {
            text.push_str(&format!("cgroup {}\n", cgroup.display()));
        }
        let temp = crate::job_dir::JobDir(job_dir).temp(crate::job_dir::JobDir::PROCESSES);
        std::fs::write(&temp, text)?;
        std::fs::rename(temp, crate::job_dir::JobDir(job_dir).processes())
    }

    pub fn read(job_dir: &std::path::Path) -> TreeRecord {
        // The job may have replaced it (a FIFO would block the reader).
        let text =
            crate::paths::read_untrusted(&crate::job_dir::JobDir(job_dir).processes(), 64 << 10)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default();
        let mut record = TreeRecord::default();
        for line in text.lines() {
            let (name, rest) = line.split_once(' ').unwrap_or((line, ""));
            let figures = || {
                let (pid, start) = rest.split_once(' ')?;
                Some((pid.parse().ok()?, start.parse().ok()?))
            };
            match name {
                "supervisor" => record.supervisor = figures(),
                "job" => record.job = figures(),
                "cgroup" if !rest.is_empty() => record.cgroup = Some(rest.into()),
                _ => {}
            }
        }
        record
    }
}

/// A process's start time (clock ticks since boot): with its pid, it names one process
/// for ever.
pub fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid).map(|f| f.start)
}

/// Kills what is left of a job whose supervisor died, and returns how many processes
/// it killed: its cgroup whole, where it had one; then every process in the job's
/// process group or the supervisor's session, or carrying `BGWORK_JOB=key` in its
/// environment. Each process is pinned with a pidfd before it is checked and
/// signalled. A group or session is only matched while its leader's pid is not in use
/// by another process (a live leader must have the recorded start time): a pid that
/// names a group or a session cannot be given to a new process while a member lives.
pub fn sweep_job(key: &str, job_dir: &std::path::Path) -> usize {
    let tree = TreeRecord::read(job_dir);
    let mut killed = tree.cgroup.as_deref().map_or(0, super::cgroup::kill_all);
    let still_ours = |leader: Option<(i32, u64)>| {
        leader.filter(|&(pid, start)| start_time(pid).is_none_or(|now| now == start))
    };
    let group = still_ours(tree.job).map(|(pid, _)| pid);
    let session = still_ours(tree.supervisor).map(|(pid, _)| pid);
    let marker = format!("BGWORK_JOB={key}");
    let me = std::process::id() as i32;
    for pid in all_pids() {
        if pid == me {
            continue;
        }
        let Some(pidfd) = pidfd_open(pid) else {
            continue;
        };
        let Some(fields) = stat_fields(pid) else {
            continue;
        };
        let in_tree = Some(fields.group) == group || Some(fields.session) == session;
        let marked = !key.is_empty() && {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            environ
                .split(|&b| b == 0)
                .any(|var| var == marker.as_bytes())
        };
        if (in_tree || marked) && pidfd_kill(&pidfd) {
            killed += 1;
        }
    }
    killed
}

/// The fields of `/proc/PID/stat` a sweep reads.
struct StatFields {
    group: i32,
    session: i32,
    start: u64,
}

fn stat_fields(pid: i32) -> Option<StatFields> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the name (which may hold spaces and parens): field 3 (state) onwards.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    Some(StatFields {
        group: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
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

/// The processes of the job whose folder is `job_dir`: every live descendant of its
/// supervisor (not the supervisor itself). Empty when the supervisor is gone.
pub fn job_pids(job_dir: &Path) -> Vec<i32> {
    supervisor_of(job_dir).map(descendants).unwrap_or_default()
}

/// The pid of the live supervisor of the job whose folder is `job_dir`. The folder's
/// `processes` record names it, but the job may have rewritten that file: the process
/// it names counts only when it has the recorded start time and its stderr is that
/// folder's `supervisor.log` (where every supervisor writes), which no job can arrange
/// for a process that is not its own supervisor.
pub fn supervisor_of(job_dir: &Path) -> Option<i32> {
    let record = TreeRecord::read(job_dir);
    let (pid, start) = record.supervisor?;
    if start_time(pid) != Some(start) {
        return None;
    }
    let stderr = std::fs::read_link(format!("/proc/{pid}/fd/2")).ok()?;
    let stderr = stderr.to_string_lossy();
    let stderr = Path::new(stderr.strip_suffix(" (deleted)").unwrap_or(&stderr));
    let log = |dir: &Path| crate::job_dir::JobDir(dir).supervisor_log();
    // The folder's real path is asked only when it is not named as the supervisor
    // names it (a home reached through a link).
    let named = stderr == log(job_dir)
        || std::fs::canonicalize(job_dir).is_ok_and(|dir| stderr == log(&dir));
    named.then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    fn state(pid: i32) -> Option<char> {
        parent_and_state(pid).map(|(_, state)| state)
    }

    /// Polls until `pid` is in `wanted` state, within 10 s.
    fn reaches(pid: i32, wanted: char) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if state(pid) == Some(wanted) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn issue23_4_a_stop_signal_to_the_tree_is_not_continued_at_once() {
        // A shell leading its own group, with a child: the job's tree in small.
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 1000 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let root = shell.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        let child = loop {
            if let Some(&child) = descendants(root).first() {
                break child;
            }
            assert!(Instant::now() < deadline, "the shell's child did not start");
            std::thread::sleep(Duration::from_millis(5));
        };
        signal_tree(root, root, Signal::SIGSTOP);
        let paused = reaches(child, 'T') && reaches(root, 'T');
        continue_tree(root, root);
        let continued = paused && reaches(child, 'S');
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
        let _ = shell.kill();
        let _ = shell.wait();
        assert!(paused, "a STOP sent to the tree was undone at once");
        assert!(continued, "continue_tree did not wake the tree");
    }
}
