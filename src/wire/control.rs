//! The daemon ↔ supervisor protocol and the supervisor's durable status file.
//!
//! One JSON object per line over the job's control socket. The first line a supervisor
//! reads on its launch socket is a [`JobSpec`]; after that the daemon sends
//! [`ToSupervisor`] and the supervisor sends [`FromSupervisor`]. Every connection
//! starts with `hello`, which carries [`PROTOCOL`]: a daemon refuses a supervisor whose
//! protocol it does not speak, and says so, instead of guessing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the daemon ↔ supervisor protocol and of the status file.
pub const PROTOCOL: u32 = 1;

/// Everything a supervisor needs to run one job. Sent once, over the launch socket,
/// so that environment values never appear in a process's argument list.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct JobSpec {
    pub protocol: u32,
    /// Unique for this home; also exported to the job as `BGWORK_JOB`.
    pub job_key: String,
    pub job_dir: String,
    pub command: String,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    /// Variables whose name or value is not UTF-8: base64 `[name, value]` pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_bytes: Vec<[String; 2]>,
    pub log_cap: u64,
    pub log_head: u64,
    /// How long leftover children of a job whose main process ended get after TERM.
    pub linger_grace_ms: u64,
    /// Set for a pane: the job runs on a pseudo-terminal of this size.
    #[serde(default)]
    pub pane: Option<PaneSize>,
    /// The job's owner as its status file must name it (see [`ExitStatus::owner`]).
    #[serde(default)]
    pub owner: String,
    /// Run the job without a cgroup of its own even where one could be made.
    #[serde(default)]
    pub no_cgroup: bool,
    /// Stop the job (as the agent) once it has run this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runtime_ms: Option<u64>,
    /// `[name, value]` of each secret the log is masked for: kept in the supervisor's
    /// memory only, and on this machine never written (a job on Slurm is handed its
    /// spec as a file, `spec.json`, removed once read: see ARCHITECTURE.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<[String; 2]>,
    /// Keep the unmasked output too, in `output.raw.log`.
    #[serde(default)]
    pub keep_raw_log: bool,
    /// The pace of output progress until the daemon sets another (`Pace`); absent
    /// (an older daemon), the prompt one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_every_ms: Option<u64>,
    /// A restart policy: a run that fails (or is killed by a signal from elsewhere)
    /// does not end the job while restarts are left; the supervisor waits for the
    /// daemon's `rerun` (after the back-off and the admission) or a stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartRule>,
}

/// A job's restart policy as its supervisor (how many restarts it may make) and its
/// description (`job.json`, so that a daemon that lost its database keeps it) hold it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartRule {
    pub max_restarts: u32,
    #[serde(default)]
    pub backoff_min_ms: u64,
    #[serde(default)]
    pub backoff_max_ms: u64,
}

/// A run of a job with a restart policy that ended and will be started again: run
/// `run` (0 for the first) ended with `status`, and the supervisor waits.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BetweenRuns {
    pub run: u32,
    pub status: ExitStatus,
}

/// A job's description, written into its folder when it starts (`job.json`): what a
/// daemon that lost its database needs to take the job back. Environment values are
/// never in it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct JobRecord {
    pub session: String,
    pub id: String,
    pub kind: crate::wire::Kind,
    pub name: Option<String>,
    pub command: String,
    pub cwd: String,
    pub notify: bool,
    pub env_names: Vec<String>,
    pub started_at: i64,
    pub cols: Option<u16>,
    pub rows: Option<u16>,
    /// Names among `env_names` given with `--secret` (masked however short), so that
    /// `restart` masks them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_names: Vec<String>,
    #[serde(default)]
    pub keep_raw_log: bool,
    /// A salted digest of the environment the job was given (`SALT:SHA256`, both hex;
    /// never the values), so that a start is told from its running twin by its whole
    /// identity, after a daemon restart too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_digest: Option<String>,
    /// Its restart policy (`start --restart on-failure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartRule>,
}

/// The name of a job's description in its folder.

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaneSize {
    pub cols: u16,
    pub rows: u16,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToSupervisor {
    Hello {
        protocol: u32,
    },
    Stop {
        grace_ms: u64,
        actor: crate::wire::Actor,
    },
    /// Bytes for the job's stdin, not acknowledged (kept for older daemons).
    Input {
        #[serde(with = "bytes")]
        data: Vec<u8>,
    },
    /// Bytes for the job's stdin; answered with `input_taken` or `input_refused`
    /// carrying the same `seq`.
    Write {
        seq: u64,
        #[serde(with = "bytes")]
        data: Vec<u8>,
    },
    CloseInput,
    Resize {
        cols: u16,
        rows: u16,
    },
    Signal {
        signal: i32,
    },
    /// Report output progress at most every `every_ms` (the daemon asks for a prompt
    /// pace while someone waits on the output, a relaxed one otherwise). A change in
    /// the log's dropped or unwritten bytes is reported promptly whatever the pace.
    Pace {
        every_ms: u64,
    },
    /// Start the job again (run `run`, counted from 0), writing `marker` as a line
    /// of the log first. Carried out only while run `run - 1` has ended and waits:
    /// a repeated `rerun` starts nothing.
    Rerun {
        run: u32,
        marker: String,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum FromSupervisor {
    Hello {
        protocol: u32,
        pid: i32,
        log_len: u64,
        dropped: u64,
        #[serde(default)]
        unwritten: u64,
        #[serde(default)]
        unwritten_at: u64,
        /// Present once the job has ended (the status file holds the same).
        status: Option<ExitStatus>,
        /// Present while a run has ended and the job waits to be started again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        between: Option<Box<BetweenRuns>>,
    },
    Spawned {
        pid: i32,
    },
    SpawnFailed {
        message: String,
    },
    Output {
        log_len: u64,
        dropped: u64,
        /// Output bytes that could not be written (a full disk), and the log offset
        /// where the first of them was lost.
        #[serde(default)]
        unwritten: u64,
        #[serde(default)]
        unwritten_at: u64,
    },
    InputClosed,
    /// The bytes of `write` `seq` are queued for the job; `queued` bytes now wait.
    InputTaken {
        seq: u64,
        queued: u64,
    },
    /// The bytes of `write` `seq` were not taken, and why; `full` when they may be
    /// once the job has read what waits.
    InputRefused {
        seq: u64,
        reason: String,
        #[serde(default)]
        full: bool,
    },
    Exited {
        status: ExitStatus,
    },
    /// A run ended and the job waits for `rerun` (its restart policy) or a stop.
    RunEnded {
        between: Box<BetweenRuns>,
    },
}

/// How a job ended, as its supervisor saw it; written atomically to `status`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ExitStatus {
    pub protocol: u32,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Set when a stop was asked for before the job ended.
    pub stop_actor: Option<crate::wire::Actor>,
    /// Set when the command could not start.
    pub spawn_error: Option<String>,
    pub log_len: u64,
    pub dropped: u64,
    /// Bytes of output that could not be written to the log (a full disk).
    #[serde(default)]
    pub unwritten: u64,
    /// The log offset where the first unwritten byte was lost.
    #[serde(default)]
    pub unwritten_at: u64,
    /// Whose status this is (the job's session, id and start time): a status file
    /// that names another owner is no status of this job.
    #[serde(default)]
    pub owner: String,
    pub ended_at_ms: i64,
    /// The job's main process, so a daemon that never heard of it still records it.
    #[serde(default)]
    pub pid: Option<i32>,
    /// Set when a stop had to KILL the job: the grace (ms) its TERM had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub killed_after_ms: Option<u64>,
    /// Set when the job was stopped for running past its `max_runtime_ms`: that limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub past_limit_ms: Option<u64>,
    /// CPU time (ms) of every process of the job, reaped by the supervisor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// The most resident memory the job's process tree was seen to hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// The end a cluster's scheduler reported when no process status says it (a job
    /// Slurm timed out or lost with its supervisor): see `end::classify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_end: Option<crate::wire::End>,
    /// What the scheduler said of the end ("time limit", "node failed").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl ExitStatus {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("status encodes")
    }
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let status: ExitStatus =
            serde_json::from_slice(bytes).map_err(|e| format!("status file unreadable: {e}"))?;
        if status.protocol != PROTOCOL {
            return Err(format!(
                "status file has protocol {} and this build speaks {PROTOCOL}",
                status.protocol
            ));
        }
        Ok(status)
    }
}

/// Bytes on the wire as base64 text (a JSON array of numbers costs up to 4 bytes a
/// byte); an array of numbers is still read.
mod bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            Numbers(Vec<u8>),
        }
        match Form::deserialize(deserializer)? {
            Form::Text(text) => base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(serde::de::Error::custom),
            Form::Numbers(numbers) => Ok(numbers),
        }
    }
}

pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).expect("control message encodes");
    line.push(b'\n');
    line
}

pub fn decode<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, String> {
    serde_json::from_slice(line).map_err(|e| format!("malformed control message: {e}"))
}

impl FromSupervisor {
    /// A supervisor's message from its line. An output report, most of what a chatty
    /// job's supervisor sends, is read straight into its four numbers: the tagged
    /// enum's own decoding first copies every field aside to find its tag.
    pub fn decode(line: &[u8]) -> Result<FromSupervisor, String> {
        #[derive(Deserialize)]
        struct Output {
            log_len: u64,
            dropped: u64,
            #[serde(default)]
            unwritten: u64,
            #[serde(default)]
            unwritten_at: u64,
        }
        if line.starts_with(br#"{"ev":"output","#) {
            if let Ok(report) = serde_json::from_slice::<Output>(line) {
                return Ok(FromSupervisor::Output {
                    log_len: report.log_len,
                    dropped: report.dropped,
                    unwritten: report.unwritten,
                    unwritten_at: report.unwritten_at,
                });
            }
        }
        decode(line)
    }
}

#[cfg(test)]
mod from_supervisor_tests {
    use super::*;

    #[test]
    fn an_output_report_decodes_by_its_short_path_as_by_the_enum() {
        let report = FromSupervisor::Output {
            log_len: 12_345,
            dropped: 7,
            unwritten: 3,
            unwritten_at: 99,
        };
        let line = encode(&report);
        assert!(line.starts_with(br#"{"ev":"output","#), "{line:?}");
        let short = FromSupervisor::decode(&line).unwrap();
        let long: FromSupervisor = decode(&line).unwrap();
        assert_eq!(format!("{short:?}"), format!("{long:?}"));
        // Any other message takes the enum's path.
        let spawned = encode(&FromSupervisor::Spawned { pid: 42 });
        let decoded = FromSupervisor::decode(&spawned).unwrap();
        assert!(matches!(decoded, FromSupervisor::Spawned { pid: 42 }));
        // A malformed report is refused as before.
        assert!(FromSupervisor::decode(br#"{"ev":"output","log_len":"x"}"#).is_err());
    }
}
