//! A job's inherited environment, which is bytes: the caller's variables as they travel
//! in a request (UTF-8 ones as text, the others as base64 pairs) and back to `OsString`s.
//!
//! A Unix environment may hold any bytes but NUL; JSON strings hold only Unicode. The
//! variables that are valid UTF-8 travel in `inherit_env`; a variable whose name or
//! value is not travels in `inherit_env_bytes` as `[base64(name), base64(value)]`, and
//! the supervisor sets it with the very bytes it had.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// The caller's environment: UTF-8 variables by name, and the others as base64 pairs.
#[derive(Debug, Default)]
pub struct CallerEnv {
    pub text: BTreeMap<String, String>,
    pub bytes: Vec<[String; 2]>,
}

impl CallerEnv {
    /// This process's own environment (never panics on a non-UTF-8 variable).
    pub fn of_this_process() -> CallerEnv {
        let mut env = CallerEnv::default();
        for (name, value) in std::env::vars_os() {
            match (name.to_str(), value.to_str()) {
                (Some(name), Some(value)) => {
                    env.text.insert(name.to_string(), value.to_string());
                }
                _ => env.bytes.push([
                    STANDARD.encode(name.as_bytes()),
                    STANDARD.encode(value.as_bytes()),
                ]),
            }
        }
        env
    }
}

/// The variables of a plain login environment, taken from this process when a request
/// comes from no caller with an environment of its own (the strip's Restart); with the
/// ones that find this daemon's home and socket, so a `bgwork` call in the job reaches
/// this daemon.
const PLAIN_NAMES: [&str; 13] = [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "BGWORK_HOME",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
];

/// A plain environment for work started by a person from no shell (the strip): this
/// process's values of the login variables only ([`PLAIN_NAMES`]), never the rest of
/// the environment of whichever client started the daemon.
pub fn plain() -> BTreeMap<String, String> {
    PLAIN_NAMES
        .iter()
        .filter_map(|&name| Some((name.to_string(), std::env::var(name).ok()?)))
        .collect()
}

/// Decodes base64 `[name, value]` pairs, refusing what no environment can hold (a name
/// that is empty or holds `=`, a NUL byte anywhere).
pub fn decode_pairs(pairs: &[[String; 2]]) -> Result<Vec<(OsString, OsString)>, String> {
    pairs
        .iter()
        .enumerate()
        .map(|(n, [name, value])| {
            let decode = |text: &str, what: &str| {
                STANDARD.decode(text).map_err(|e| {
                    format!("inherit_env_bytes[{n}]: the {what} is not base64 ({e})")
                })
            };
            let name = decode(name, "name")?;
            let value = decode(value, "value")?;
            if name.is_empty() || name.contains(&b'=') || name.contains(&0) {
                return Err(format!(
                    "inherit_env_bytes[{n}]: a variable's name must be non-empty, without '=' or NUL"
                ));
            }
            if value.contains(&0) {
                return Err(format!(
                    "inherit_env_bytes[{n}]: a variable's value cannot hold a NUL byte"
                ));
            }
            Ok((OsString::from_vec(name), OsString::from_vec(value)))
        })
        .collect()
}

/// The pairs whose name is not one of `names` (a variable set as text wins over them).
pub fn without_names(pairs: &[[String; 2]], names: &BTreeMap<String, String>) -> Vec<[String; 2]> {
    pairs
        .iter()
        .filter(|[name, _]| {
            let decoded = STANDARD.decode(name).unwrap_or_default();
            !std::str::from_utf8(&decoded).is_ok_and(|name| names.contains_key(name))
        })
        .cloned()
        .collect()
}

/// Variables a scheduler sets for the job it runs beside `SLURM_*`, which name what it
/// gave this job (the devices of its `--gpus`) and so win over the caller's.
const SCHEDULERS_OWN: [&str; 4] = [
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
];

/// Whether the scheduler's value of `name` wins over the caller's.
fn schedulers_own(name: &[u8]) -> bool {
    name.starts_with(b"SLURM_") || SCHEDULERS_OWN.iter().any(|own| own.as_bytes() == name)
}

/// The environment of a job a scheduler runs: the one it gave the job's supervisor
/// (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`, `SLURM_CPUS_ON_NODE`, what its prolog and
/// gres set, …) beneath the caller's. For a name both have, the caller's value wins,
/// but for the scheduler's own of this job (`SLURM_*`, the GPUs it gave).
pub fn under_scheduler(
    spec: &mut crate::wire::control::JobSpec,
    scheduler: impl IntoIterator<Item = (OsString, OsString)>,
) {
    let callers_bytes: Vec<Vec<u8>> = spec
        .env_bytes
        .iter()
        .map(|[name, _]| STANDARD.decode(name).unwrap_or_default())
        .collect();
    for (name, value) in scheduler {
        let raw = name.as_bytes();
        let callers = std::str::from_utf8(raw).is_ok_and(|n| spec.env.contains_key(n))
            || callers_bytes.iter().any(|n| n == raw);
        if callers && !schedulers_own(raw) {
            continue;
        }
        // The caller's value of that name goes, in whichever form it travelled.
        spec.env_bytes
            .retain(|[n, _]| STANDARD.decode(n).unwrap_or_default() != raw);
        match (name.to_str(), value.to_str()) {
            (Some(name), Some(value)) => {
                spec.env.insert(name.to_string(), value.to_string());
            }
            _ => {
                if let Some(name) = name.to_str() {
                    spec.env.remove(name);
                }
                spec.env_bytes
                    .push([STANDARD.encode(raw), STANDARD.encode(value.as_bytes())]);
            }
        }
    }
}

/// Variables left out of a job's identity: its own id (every item has another), and
/// a shell's bookkeeping, which says where the caller stood, not what the job does:
/// `_` (the command a shell runs), `PWD` and `OLDPWD` (the job's folder is compared on
/// its own; `bash -c` sets `PWD` to it), `SHLVL`.
const NOT_IDENTITY: &[&str] = &["BGWORK_ITEM", "_", "PWD", "OLDPWD", "SHLVL"];

/// A salted digest of the environment a job is given (`text` and the base64 `pairs`),
/// written `SALT:SHA256` in hex: what tells two starts of one command apart (`PORT=3001`
/// is another server) without keeping a value anywhere.
pub fn digest(text: &BTreeMap<String, String>, pairs: &[[String; 2]]) -> String {
    let mut salt = [0u8; 16];
    if let Err(e) = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut salt))
    {
        crate::note!("bgwork daemon: no random salt for an environment digest ({e})");
    }
    format!("{}:{}", hex(&salt), salted(&salt, text, pairs))
}

/// Whether `stored` (a [`digest`]) is the digest of this environment.
pub fn digest_matches(
    stored: &str,
    text: &BTreeMap<String, String>,
    pairs: &[[String; 2]],
) -> bool {
    let Some((salt, hash)) = stored.split_once(':') else {
        return false;
    };
    let salt: Option<Vec<u8>> = (0..salt.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(salt.get(at..at + 2)?, 16).ok())
        .collect();
    salt.is_some_and(|salt| salted(&salt, text, pairs) == hash)
}

fn salted(salt: &[u8], text: &BTreeMap<String, String>, pairs: &[[String; 2]]) -> String {
    use sha2::Digest;
    let mut all: Vec<(Vec<u8>, Vec<u8>)> = text
        .iter()
        .map(|(k, v)| (k.clone().into_bytes(), v.clone().into_bytes()))
        .collect();
    for [name, value] in pairs {
        let (name, value) = (STANDARD.decode(name), STANDARD.decode(value));
        if let (Ok(name), Ok(value)) = (name, value) {
            all.push((name, value));
        }
    }
    all.retain(|(name, _)| !NOT_IDENTITY.iter().any(|n| n.as_bytes() == name.as_slice()));
    all.sort();
    let mut hasher = sha2::Sha256::new();
    hasher.update(salt);
    for (name, value) in &all {
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name);
        hasher.update((value.len() as u64).to_le_bytes());
        hasher.update(value);
    }
    hex(&hasher.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(env: &[(&str, &str)]) -> crate::wire::control::JobSpec {
        let env: BTreeMap<&str, &str> = env.iter().copied().collect();
        serde_json::from_value(serde_json::json!({
            "protocol": crate::wire::control::PROTOCOL,
            "job_key": "", "job_dir": "", "command": "", "cwd": "",
            "env": env, "log_cap": 0, "log_head": 0, "linger_grace_ms": 0,
        }))
        .unwrap()
    }

    #[test]
    fn issue22_7_slurms_variables_reach_the_job_beside_the_callers() {
        let mut job = spec(&[
            ("PATH", "/caller/bin"),
            ("ENVIRONMENT", "mine"),
            ("SLURM_JOB_ID", "999"),
            ("SLURM_MINE", "kept"),
            ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
        ]);
        let slurm = [
            ("PATH", "/node/bin"),
            ("ENVIRONMENT", "BATCH"),
            ("SLURM_JOB_ID", "42"),
            ("SLURM_JOB_NODELIST", "n1"),
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("TMPDIR", "/tmp/job42"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        under_scheduler(&mut job, slurm);
        let got = |n: &str| job.env.get(n).map(String::as_str);
        // The caller's win, but for Slurm's own of this job.
        assert_eq!(got("PATH"), Some("/caller/bin"));
        assert_eq!(got("ENVIRONMENT"), Some("mine"));
        assert_eq!(got("SLURM_JOB_ID"), Some("42"));
        assert_eq!(got("CUDA_VISIBLE_DEVICES"), Some("1"));
        // What only one side has is there.
        assert_eq!(got("SLURM_JOB_NODELIST"), Some("n1"));
        assert_eq!(got("TMPDIR"), Some("/tmp/job42"));
        assert_eq!(got("SLURM_MINE"), Some("kept"));
    }

    #[test]
    fn issue22_7_bytes_that_are_not_utf8_are_weighed_the_same() {
        let mut job = spec(&[("SLURM_JOB_ID", "999")]);
        job.env_bytes = vec![[STANDARD.encode("ODD"), STANDARD.encode([0xff])]];
        let slurm = vec![
            (OsString::from("ODD"), OsString::from("slurms")),
            (
                OsString::from("SLURM_JOB_ID"),
                OsString::from_vec(vec![b'4', 0xfe]),
            ),
        ];
        under_scheduler(&mut job, slurm);
        // The caller's ODD (bytes) wins; Slurm's SLURM_JOB_ID (bytes) replaces the text.
        assert!(!job.env.contains_key("ODD"));
        assert!(!job.env.contains_key("SLURM_JOB_ID"));
        let pairs = decode_pairs(&job.env_bytes).unwrap();
        assert!(pairs.contains(&(OsString::from("ODD"), OsString::from_vec(vec![0xff]))));
        assert!(pairs.contains(&(
            OsString::from("SLURM_JOB_ID"),
            OsString::from_vec(vec![b'4', 0xfe])
        )));
        assert_eq!(pairs.len(), 2);
    }
}
