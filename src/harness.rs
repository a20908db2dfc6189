//! Which harness process a hook or an MCP server runs under, so that both speak for the
//! same conversation (contract §11, docs/harnesses.md).
//!
//! How it works: an agent harness (Claude Code, Codex CLI, Gemini CLI) starts its hooks
//! and its MCP servers as its own children, the hooks usually through a shell
//! (`sh -c COMMAND`), the MCP servers directly. The harness process is therefore the
//! nearest ancestor that is not a shell or a plain wrapper (`timeout`, `nice`, …): the
//! same process for every hook and every MCP server of one harness session, another
//! one for a second harness in the same folder. It is named by a [`ProcessKey`] (pid,
//! start time, boot), which no other process ever has. Read only, from `/proc`.

use crate::wire::ProcessKey;

/// Programs that stand between a harness and what it runs without being a harness.
const GO_BETWEENS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "ash", "busybox", "tcsh", "csh", "timeout",
    "nice", "nohup", "stdbuf", "env", "setsid",
];

/// How far up the walk goes at most.
const MAX_DEPTH: usize = 16;

/// The harness process this process runs under: its nearest ancestor that is not a
/// shell or a wrapper. `None` when there is none but init (a process started by a
/// service manager, or whose parent died).
pub fn harness_of_this_process() -> Option<ProcessKey> {
    let boot = boot_id()?;
    let mut pid = std::os::unix::process::parent_id();
    for _ in 0..MAX_DEPTH {
        if pid <= 1 {
            return None;
        }
        let stat = Stat::of(pid)?;
        if !GO_BETWEENS.contains(&stat.name.as_str()) {
            return Some(ProcessKey {
                pid,
                started: stat.started,
                boot,
            });
        }
        pid = stat.parent;
    }
    None
}

/// This process's own key.
pub fn this_process() -> Option<ProcessKey> {
    let pid = std::process::id();
    Some(ProcessKey {
        pid,
        started: Stat::of(pid)?.started,
        boot: boot_id()?,
    })
}

/// Whether the process `key` names still runs (not a later one with its pid).
pub fn alive(key: &ProcessKey) -> bool {
    boot_id().is_some_and(|boot| boot == key.boot)
        && Stat::of(key.pid).is_some_and(|stat| stat.started == key.started)
}

/// The fields of `/proc/PID/stat` the walk needs.
struct Stat {
    name: String,
    parent: u32,
    started: u64,
}

impl Stat {
    fn of(pid: u32) -> Option<Stat> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `PID (NAME) STATE PPID …`: the name may hold spaces and parentheses.
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let name = stat.get(open + 1..close)?.to_string();
        let fields: Vec<&str> = stat.get(close + 2..)?.split(' ').collect();
        Some(Stat {
            name,
            parent: fields.get(1)?.parse().ok()?,
            started: fields.get(19)?.parse().ok()?,
        })
    }
}

fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string()).filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_start_time_is_not() {
        let me = this_process().unwrap();
        assert!(alive(&me));
        let other = ProcessKey {
            started: me.started + 1,
            ..me.clone()
        };
        assert!(!alive(&other));
        let rebooted = ProcessKey {
            boot: "another-boot".into(),
            ..me
        };
        assert!(!alive(&rebooted));
    }
}
