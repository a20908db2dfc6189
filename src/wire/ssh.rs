//! The shapes of the SSH executor: `ssh.json` in a job's folder, and the first line
//! bgwork's relay on a host sends.

use serde::{Deserialize, Serialize};

/// The version of the relay's channel: a line `N <request>` in, `N <reply>` out, and
/// after a reply that says `"output_bytes":K` its K bytes of output; a line `-N` in
/// cancels request N.
pub const RELAY_PROTOCOL: u32 = 3;

/// What `ssh.json` holds: the job's host, and who it is there. Written before the job
/// is handed over (then with its remote id), so a restarted daemon finds it by name
/// and never starts it twice.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct SshJob {
    pub host: String,
    /// The job's name on the host: `bgw-<home-id>-<row>`.
    pub name: String,
    /// The session its work is filed under on the host.
    pub session: String,
    #[serde(default)]
    pub remote_id: Option<String>,
    /// `--max-runtime` (ms), which the host's supervisor keeps: the end's report says
    /// the limit.
    #[serde(default)]
    pub max_runtime_ms: Option<u64>,
    /// What the host's relay said at its start when the job dies at logout there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logout: Option<String>,
    /// What was asked of the job while the host was down and the host has not taken
    /// yet: sent still by a daemon that takes the job back.
    #[serde(default, skip_serializing_if = "Unsent::is_empty")]
    pub unsent: Unsent,
}

/// A stop (its grace in ms and who asked), a pane's resize and its hang-up, not yet
/// taken by the host.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unsent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<(u64, crate::wire::Actor)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize: Option<(u16, u16)>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hang_up: bool,
}

impl Unsent {
    pub fn is_empty(&self) -> bool {
        *self == Unsent::default()
    }
}

/// The relay's first line: which bgwork answers.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct RelayHello {
    pub relay: String,
    pub version: String,
    pub protocol: u32,
    /// The control protocol of its supervisors.
    pub control: u32,
    /// Set when jobs started there die at logout (systemd-logind's
    /// `KillUserProcesses=yes` with lingering off): why, and the fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logout: Option<String>,
}
