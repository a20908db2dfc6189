//! What a logout does to work on a host: where systemd-logind runs with
//! `KillUserProcesses=yes` (for this user: `KillOnlyUsers`, `KillExcludeUsers`), every
//! process of a login session is killed when the session ends, and the host's bgwork
//! daemon, started by the relay inside the ssh login, is one of them, with every job's
//! supervisor under it.
//!
//! The relay looks once, on the host, when it starts ([`Logout::look`]): no
//! systemd-logind there (no `/run/systemd/system`, or `loginctl` does not answer),
//! or one that kills nothing of this user's: nothing to do, nothing said. One that
//! kills, with lingering on for the user (`loginctl show-user -p Linger`, or
//! `/var/lib/systemd/linger/USER`): the host's daemon is started in a scope of the
//! user's own service manager (`systemd-run --user --scope`), which a logout does not
//! end, so its jobs outlive it. Lingering off (the user's manager itself ends at the
//! last logout), or a daemon that still runs in a login session (started earlier, or
//! `systemd-run` failed): the relay's first line says the jobs die at logout and the
//! fix, and each job started there carries it (`logout_warning`).

use crate::paths::Paths;
use std::path::Path;
use std::time::Duration;

/// What logind on this host does at logout, as the relay found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing kills work at logout here.
    Safe,
    /// Logout kills this user's processes, lingering is on: the daemon starts in a scope.
    Scope,
    /// Logout kills this user's processes and nothing here can keep them: the warning.
    Dies(String),
}

/// What the host said, read there.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub user: String,
    /// The logind manager's `Kill*` properties (`loginctl show-session -p …` with no
    /// session), else the `Kill*` settings of its configuration files.
    pub kill_settings: String,
    pub linger: bool,
}

/// The plan for these facts (`None`: no systemd-logind there).
pub fn plan(facts: Option<&Facts>) -> Plan {
    let Some(facts) = facts else {
        return Plan::Safe;
    };
    if !kills(&facts.kill_settings, &facts.user) {
        return Plan::Safe;
    }
    if facts.linger {
        return Plan::Scope;
    }
    let user = &facts.user;
    Plan::Dies(format!(
        "its jobs die when {user}'s last login there ends: systemd-logind has \
         KillUserProcesses=yes and lingering is off for {user}; `loginctl enable-linger {user}` \
         there keeps work across logouts (bgwork then starts its daemon there with \
         `systemd-run --user --scope`)"
    ))
}

/// Whether logind's `Kill*` settings (`KEY=VALUE` lines, the last of a key winning)
/// kill `user`'s processes at logout.
pub fn kills(settings: &str, user: &str) -> bool {
    let mut kill = false;
    let mut only: Vec<String> = Vec::new();
    let mut exclude = vec!["root".to_string()];
    for line in settings.lines().map(str::trim) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let words = || value.split_whitespace().map(str::to_string).collect();
        match key.trim() {
            "KillUserProcesses" => kill = yes(value),
            "KillOnlyUsers" => only = words(),
            "KillExcludeUsers" => exclude = words(),
            _ => {}
        }
    }
    let user = user.to_string();
    kill && (only.is_empty() || only.contains(&user)) && !exclude.contains(&user)
}

fn yes(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "yes" | "true" | "on" | "1"
    )
}

/// The `Kill*` lines of logind's configuration, in the order logind reads it (the
/// main file, then `logind.conf.d/*.conf` by name), for a logind that cannot be asked.
pub fn kill_settings_of(files: &[(String, String)]) -> String {
    let mut lines = Vec::new();
    for (_, text) in files {
        let mut in_login = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_login = line == "[Login]";
            } else if in_login && line.starts_with("Kill") {
                lines.push(line.to_string());
            }
        }
    }
    lines.join("\n")
}

/// How the relay deals with logout on this host, looked at once.
pub struct Logout {
    pub plan: Plan,
}

impl Logout {
    /// Looks at this host (the relay's).
    pub fn look() -> Logout {
        Logout {
            plan: plan(probe().as_ref()),
        }
    }

    /// Connects to the host's daemon; one started here for work that must outlive a
    /// logout is started in a scope of the user's manager.
    pub fn connect(&self, paths: &Paths) -> Result<crate::client::Client, crate::wire::WireError> {
        if self.plan == Plan::Scope && crate::client::Client::connect_existing(paths).is_err() {
            if let Err(why) = start_in_scope(paths) {
                crate::note!("bgwork relay: {why}");
            }
        }
        crate::client::Client::connect(paths)
    }

    /// What the relay's first line says of logout: the warning, when jobs started now
    /// die at logout. Starts the daemon first when logout would kill one started
    /// plainly, to know where it runs.
    pub fn warning(&self, paths: &Paths) -> Option<String> {
        match &self.plan {
            Plan::Safe => None,
            Plan::Dies(why) => Some(why.clone()),
            Plan::Scope => {
                if let Err(e) = self.connect(paths) {
                    return Some(format!(
                        "its bgwork daemon did not start ({}), so where its jobs run is not known",
                        e.message
                    ));
                }
                let pid = crate::client::read_pid(&paths.home.join("daemon.lock"))?;
                let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                in_session(&cgroup).then(|| {
                    "its jobs die at logout: systemd-logind has KillUserProcesses=yes and its \
                     bgwork daemon runs inside a login session (started before lingering was \
                     on, or `systemd-run --user --scope` failed: see its daemon.log); `bgwork \
                     shutdown` there, and the next job starts it in a scope"
                        .to_string()
                })
            }
        }
    }
}

/// Whether a process's `/proc/PID/cgroup` puts it in a logind session's scope.
pub fn in_session(cgroup: &str) -> bool {
    cgroup.lines().any(|line| {
        let path = line.rsplit(':').next().unwrap_or("");
        path.split('/')
            .any(|part| part.starts_with("session-") && part.ends_with(".scope"))
    })
}

/// What this host says of logind: `None` when no systemd-logind runs here.
fn probe() -> Option<Facts> {
    if !Path::new("/run/systemd/system").is_dir() {
        return None;
    }
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string());
    let asked = briefly(
        "loginctl",
        &[
            "show-session",
            "-p",
            "KillUserProcesses",
            "-p",
            "KillOnlyUsers",
            "-p",
            "KillExcludeUsers",
        ],
    );
    let kill_settings = match asked {
        Some(said) => said,
        // No loginctl: logind's own files, when it runs (its folder of users exists).
        None if Path::new("/run/systemd/users").is_dir() => kill_settings_of(&conf_files()),
        None => return None,
    };
    let linger = briefly("loginctl", &["show-user", &user, "-p", "Linger"])
        .is_some_and(|said| said.lines().any(|l| l.trim() == "Linger=yes"))
        || Path::new("/var/lib/systemd/linger").join(&user).exists();
    Some(Facts {
        user,
        kill_settings,
        linger,
    })
}

fn conf_files() -> Vec<(String, String)> {
    let mut files = Vec::new();
    let main = "/etc/systemd/logind.conf".to_string();
    if let Ok(text) = std::fs::read_to_string(&main) {
        files.push((main, text));
    }
    let mut more: Vec<_> = std::fs::read_dir("/etc/systemd/logind.conf.d")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    more.sort();
    for path in more {
        if let Ok(text) = std::fs::read_to_string(&path) {
            files.push((path.display().to_string(), text));
        }
    }
    files
}

/// A command's stdout when it succeeds within 5 s (it is killed past that).
fn briefly(program: &str, args: &[&str]) -> Option<String> {
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let mut said = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut said).ok()?;
    Some(said)
}

/// Starts the host's daemon with `systemd-run --user --scope`, detached as any client
/// starts it, and waits (at most 10 s) until it answers.
fn start_in_scope(paths: &Paths) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    paths
        .create_dirs()
        .map_err(|e| format!("could not make {}: {e}", paths.home.display()))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&paths.daemon_log)
        .map_err(|e| format!("could not open the daemon log: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("no bgwork binary: {e}"))?;
    let mut command = std::process::Command::new("systemd-run");
    command
        .args(["--user", "--scope", "--quiet", "--"])
        .arg(exe)
        .arg("daemon")
        .env("BGWORK_HOME", &paths.home)
        .env_remove("BGWORK_JOB")
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("could not run systemd-run --user --scope: {e}"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if crate::client::Client::connect_existing(paths).is_ok() {
            // Reaped whenever it ends (systemd-run execs the daemon in its scope).
            std::thread::spawn(move || child.wait());
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "systemd-run --user --scope did not start the daemon ({status}): its jobs run \
                 in the login session"
            ));
        }
        if std::time::Instant::now() >= deadline {
            std::thread::spawn(move || child.wait());
            return Err("the daemon started in a scope did not answer within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(kill_settings: &str, linger: bool) -> Facts {
        Facts {
            user: "me".into(),
            kill_settings: kill_settings.into(),
            linger,
        }
    }

    #[test]
    fn no_logind_or_no_kill_is_safe() {
        assert_eq!(plan(None), Plan::Safe);
        assert_eq!(
            plan(Some(&facts("KillUserProcesses=no", false))),
            Plan::Safe
        );
        assert_eq!(plan(Some(&facts("", false))), Plan::Safe);
    }

    #[test]
    fn kill_with_lingering_starts_in_a_scope_and_without_it_warns() {
        let kill = "KillUserProcesses=yes\nKillOnlyUsers=\nKillExcludeUsers=root";
        assert_eq!(plan(Some(&facts(kill, true))), Plan::Scope);
        match plan(Some(&facts(kill, false))) {
            Plan::Dies(why) => {
                assert!(why.contains("lingering is off for me"), "{why}");
                assert!(why.contains("loginctl enable-linger me"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_and_excluded_users_are_kept_apart() {
        assert!(!kills(
            "KillUserProcesses=yes\nKillExcludeUsers=root me",
            "me"
        ));
        assert!(!kills("KillUserProcesses=yes\nKillOnlyUsers=alice", "me"));
        assert!(kills("KillUserProcesses=yes\nKillOnlyUsers=alice me", "me"));
        assert!(!kills("KillUserProcesses=yes", "root"), "root by default");
        assert!(kills("KillUserProcesses=yes\nKillExcludeUsers=", "root"));
    }

    #[test]
    fn the_configuration_is_read_in_order_from_its_login_section() {
        let files = [
            (
                "logind.conf".to_string(),
                "[Login]\n#KillUserProcesses=no\nKillUserProcesses=yes\n".to_string(),
            ),
            (
                "logind.conf.d/10-x.conf".into(),
                "[Other]\nKillUserProcesses=yes\n[Login]\nKillUserProcesses=no\n".into(),
            ),
        ];
        let settings = kill_settings_of(&files);
        assert_eq!(settings, "KillUserProcesses=yes\nKillUserProcesses=no");
        assert!(!kills(&settings, "me"), "the last one wins");
    }

    #[test]
    fn a_login_sessions_scope_is_told_from_the_users_manager() {
        assert!(in_session(
            "0::/user.slice/user-1000.slice/session-3.scope\n"
        ));
        assert!(!in_session(
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n"
        ));
        assert!(!in_session("0::/\n"));
    }
}
