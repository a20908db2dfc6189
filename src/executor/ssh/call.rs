//! How bgwork calls the system's OpenSSH client: the options of every ssh call it makes
//! to a host (`SshCall`), and what ssh's complaints mean (`explain`). The link's
//! channel and the deploy's copy are both such calls.

use std::path::PathBuf;

/// How long ssh has to connect.
pub const CONNECT_TIMEOUT_S: u32 = 10;

/// How every ssh call bgwork makes to a host is made.
#[derive(Clone, Debug)]
pub struct SshCall {
    pub host: String,
    /// `BGWORK_SSH_CONFIG`: passed as `-F` to every call.
    pub config: Option<PathBuf>,
    /// The folder of the connection masters' sockets (private to this user).
    pub control_dir: PathBuf,
}

impl SshCall {
    /// `ssh` with bgwork's options, for `remote` (one shell command line on the host).
    pub fn command(&self, remote: &str) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ssh");
        command.args(self.options());
        command.arg("--").arg(&self.host).arg(remote);
        command.kill_on_drop(true);
        command
    }

    pub fn options(&self) -> Vec<String> {
        let mut options = Vec::new();
        if let Some(config) = &self.config {
            options.push("-F".into());
            options.push(config.display().to_string());
        }
        for option in [
            "BatchMode=yes".to_string(),
            format!("ConnectTimeout={CONNECT_TIMEOUT_S}"),
            "ControlMaster=auto".into(),
            format!("ControlPath={}/%C", self.control_dir.display()),
            "ControlPersist=60".into(),
            "ServerAliveInterval=5".into(),
            "ServerAliveCountMax=3".into(),
        ] {
            options.push("-o".into());
            options.push(option);
        }
        options.push("-T".into());
        options
    }
}

/// What ssh's complaint means, and what to do: ssh's own words are quoted.
pub fn explain(host: &str, stderr: &str) -> String {
    let said: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        // ssh names itself ("ssh: connect to host …"): quoted after "(ssh: " once.
        .map(|l| l.strip_prefix("ssh: ").unwrap_or(l))
        .filter(|l| {
            !l.is_empty() && !l.starts_with("@@@") && !l.starts_with("Warning: Permanently added")
        })
        .collect();
    let words = said.join(" / ");
    let lower = stderr.to_lowercase();
    let fix = if lower.contains("remote host identification has changed")
        || lower.contains("host key for") && lower.contains("has changed")
    {
        format!(
            "the host key of {host} has CHANGED since it was recorded: if the change is expected, \
             remove the old key (`ssh-keygen -R HOST`) and connect once with `ssh {host}`; else do not trust it"
        )
    } else if lower.contains("host key verification failed")
        || lower.contains("no ed25519 host key is known")
        || lower.contains("host key is known")
    {
        format!(
            "the host key of {host} is not known: connect once with `ssh {host}` and accept it \
             (bgwork never accepts a host key itself)"
        )
    } else if lower.contains("permission denied") {
        format!(
            "{host} refused the login: bgwork logs in with your keys and agent only (BatchMode), \
             never a password: add your key there (`ssh-copy-id {host}`) or load it (`ssh-add`)"
        )
    } else if lower.contains("could not resolve hostname") {
        format!("{host} is no host ssh knows: check its name or your ssh config")
    } else if lower.contains("connection refused")
        || lower.contains("timed out")
        || lower.contains("no route to host")
        || lower.contains("network is unreachable")
        || lower.contains("connection closed")
        || lower.contains("connection reset")
    {
        format!("{host} cannot be reached: check that it is up and that `ssh {host}` connects")
    } else {
        format!("ssh to {host} failed: check that `ssh {host} true` works")
    };
    match words.is_empty() {
        true => fix,
        false => format!("{fix} (ssh: {words})"),
    }
}
