//! The values of a job on Slurm that no file may hold in clear: its environment (the
//! caller's, `--env`) and its secrets, handed to its supervisor on the node through
//! the job's folder, sealed.
//!
//! The spec file the batch script reads holds everything else. The supervisor, once
//! Slurm has started it, makes a key pair (X25519) that lives in its memory only and
//! leaves the public key in the folder ([`KEY_FILE`]); the daemon's tracker of the job,
//! woken by the key's rename (or at its next look, every 100 ms), answers with the values sealed to that key
//! ([`SEALED_FILE`]: an anonymous `crypto_box`, X25519 + XSalsa20-Poly1305), and
//! forgets them; the supervisor opens them in memory and removes both files. A daemon
//! that no longer has the values (it was restarted while the job was queued: they were
//! never written) answers why, and the job ends with that reason instead of running
//! without them.

use crate::wire::control::{self, JobSpec};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use crypto_box::aead::OsRng;
use crypto_box::{PublicKey, SecretKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The supervisor's public key, left for the daemon.
pub const KEY_FILE: &str = "handover-key.json";
/// The daemon's answer: the values sealed to that key, or why they cannot come.
pub const SEALED_FILE: &str = "handover-sealed.json";
/// How long a supervisor waits for the daemon's answer before it gives up.
pub const PATIENCE: Duration = Duration::from_secs(60);
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// The most an answer may weigh (10,000 secrets of 8 KiB and an environment, sealed
/// and in base64).
const ANSWER_MAX: u64 = 256 << 20;

/// The parts of a [`JobSpec`] that are sensitive.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct Values {
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub env_bytes: Vec<[String; 2]>,
    #[serde(default)]
    pub secrets: Vec<[String; 2]>,
}

impl Values {
    /// Takes the sensitive parts out of a spec, which keeps the rest.
    pub fn take(spec: &mut JobSpec) -> Values {
        Values {
            env: std::mem::take(&mut spec.env),
            env_bytes: std::mem::take(&mut spec.env_bytes),
            secrets: std::mem::take(&mut spec.secrets),
        }
    }

    /// Puts them back.
    pub fn put(self, spec: &mut JobSpec) {
        spec.env = self.env;
        spec.env_bytes = self.env_bytes;
        spec.secrets = self.secrets;
    }
}

#[derive(Serialize, Deserialize)]
struct Key {
    public_key: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    /// The values, as JSON, sealed to the supervisor's key, in base64.
    Sealed(String),
    /// Why the daemon cannot give them.
    Refused(String),
}

/// What the daemon's tracker of a job holds of its values.
#[derive(Debug)]
pub enum Held {
    /// In memory, until the supervisor asks.
    Values(Values),
    /// Given to the supervisor (or it had them before this daemon started).
    HandedOver,
    /// Not here, and why: the job cannot have them.
    Gone(String),
}

/// What a restarted daemon says of a job it finds queued: its values are gone.
pub const GONE_WITH_THE_DAEMON: &str = "the daemon stopped while the job waited in Slurm's \
     queue, and with it the job's environment and secrets, which bgwork never writes to \
     disk: start it again";

impl Held {
    /// Whether the job's values are gone for good.
    pub fn gone(&self) -> Option<&str> {
        match self {
            Held::Gone(why) => Some(why),
            _ => None,
        }
    }

    /// Answers the supervisor of the job in `job_dir` if it has asked (its key is in
    /// the folder and no answer yet): the values sealed to its key, which this process
    /// then forgets, or why they cannot come. Called at every look at the folder.
    pub fn answer(&mut self, job_dir: &Path) {
        if matches!(self, Held::HandedOver) {
            return;
        }
        let key_path = job_dir.join(KEY_FILE);
        if !key_path.exists() || job_dir.join(SEALED_FILE).exists() {
            return;
        }
        let key = crate::paths::read_untrusted(&key_path, 4096)
            .ok()
            .and_then(|bytes| control::decode::<Key>(&bytes).ok())
            .and_then(|key| STANDARD.decode(key.public_key).ok())
            .and_then(|bytes| PublicKey::from_slice(&bytes).ok());
        let answer = match (std::mem::replace(self, Held::HandedOver), key) {
            (Held::Values(values), Some(key)) => {
                let plain = control::encode(&values);
                match key.seal(&mut OsRng, &plain) {
                    Ok(sealed) => Answer::Sealed(STANDARD.encode(sealed)),
                    Err(_) => {
                        *self = Held::Gone("its values could not be sealed".into());
                        Answer::Refused("the daemon could not seal the job's values".into())
                    }
                }
            }
            (Held::Values(_), None) => {
                let why = format!("the key its supervisor left ({KEY_FILE}) is unreadable");
                *self = Held::Gone(why.clone());
                Answer::Refused(why)
            }
            (Held::Gone(why), _) => {
                *self = Held::Gone(why.clone());
                Answer::Refused(why)
            }
            (Held::HandedOver, _) => return,
        };
        if let Err(e) =
            crate::paths::write_whole(&job_dir.join(SEALED_FILE), &control::encode(&answer))
        {
            crate::note!(
                "bgwork daemon: could not answer the supervisor in {}: {e}",
                job_dir.display()
            );
        }
    }
}

/// On the node: asks the daemon for the job's values (a fresh key left in `job_dir`)
/// and waits at most `patience` for them. The key's secret half never leaves this
/// process; both files are removed once the answer is read.
pub fn receive(job_dir: &Path, patience: Duration) -> Result<Values, String> {
    let secret = SecretKey::generate(&mut OsRng);
    let key = Key {
        public_key: STANDARD.encode(secret.public_key().as_bytes()),
    };
    let key_path = job_dir.join(KEY_FILE);
    let sealed_path = job_dir.join(SEALED_FILE);
    // Watched before the key is left, so an answer that comes at once is not missed.
    let wake = super::folder_wake::watch_blocking(job_dir);
    crate::paths::write_whole(&key_path, &control::encode(&key))
        .map_err(|e| format!("could not leave its key in {}: {e}", job_dir.display()))?;
    let deadline = Instant::now() + patience;
    loop {
        match crate::paths::read_untrusted(&sealed_path, ANSWER_MAX) {
            Ok(bytes) => {
                let _ = std::fs::remove_file(&sealed_path);
                let _ = std::fs::remove_file(&key_path);
                return open(&secret, &bytes);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                let _ = std::fs::remove_file(&key_path);
                return Err(format!("could not read {}: {e}", sealed_path.display()));
            }
        }
        if Instant::now() >= deadline {
            let _ = std::fs::remove_file(&key_path);
            return Err(format!(
                "bgwork's daemon did not hand over the job's environment and secrets within \
                 {} s (they are never written to disk): is it running? Start the job again",
                patience.as_secs()
            ));
        }
        // The answer wakes this at once where inotify sees it; else the next look.
        super::folder_wake::wait_blocking(wake.as_ref(), LOOK_EVERY);
    }
}

fn open(secret: &SecretKey, bytes: &[u8]) -> Result<Values, String> {
    let answer = control::decode::<Answer>(bytes)
        .map_err(|e| format!("the daemon's answer ({SEALED_FILE}) is unreadable: {e}"))?;
    let sealed = match answer {
        Answer::Sealed(sealed) => sealed,
        Answer::Refused(why) => return Err(why),
    };
    let sealed = STANDARD
        .decode(sealed)
        .map_err(|e| format!("the daemon's answer is not base64: {e}"))?;
    let plain = secret
        .unseal(&sealed)
        .map_err(|_| "the daemon's answer was not sealed to this supervisor's key".to_string())?;
    control::decode(&plain).map_err(|e| format!("the values handed over are unreadable: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Values {
        Values {
            env: BTreeMap::from([("TOKEN".into(), "s3cr3t-value-42".into())]),
            env_bytes: vec![["bmFtZQ==".into(), "/w==".into()]],
            secrets: vec![["TOKEN".into(), "s3cr3t-value-42".into()]],
        }
    }

    /// Plays the daemon's tracker: looks at the folder until it has answered.
    fn daemon(dir: std::path::PathBuf, mut held: Held) -> std::thread::JoinHandle<Held> {
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !dir.join(SEALED_FILE).exists() && Instant::now() < deadline {
                held.answer(&dir);
                std::thread::sleep(Duration::from_millis(5));
            }
            held
        })
    }

    #[test]
    fn issue22_6_values_reach_the_supervisor_sealed_and_no_file_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let tracker = daemon(dir.path().to_path_buf(), Held::Values(values()));
        let got = receive(dir.path(), Duration::from_secs(10)).unwrap();
        assert_eq!(got, values());
        let held = tracker.join().unwrap();
        assert!(matches!(held, Held::HandedOver), "{held:?}");
        // Both files are gone, and nothing the folder ever held had the value.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// The daemon's answer is taken as soon as it is renamed into the folder, not at the
    /// supervisor's next look (100 ms later): part of a Slurm job's start.
    #[test]
    fn issue27_6_the_supervisor_takes_the_answer_as_soon_as_it_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().to_path_buf();
        let tracker = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !folder.join(KEY_FILE).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            // The supervisor has looked once by now and found no answer.
            std::thread::sleep(Duration::from_millis(20));
            let mut held = Held::Values(values());
            held.answer(&folder);
            Instant::now()
        });
        let got = receive(dir.path(), Duration::from_secs(10)).unwrap();
        let taken = Instant::now();
        let answered = tracker.join().unwrap();
        assert_eq!(got, values());
        let late = taken.duration_since(answered);
        assert!(
            late < Duration::from_millis(50),
            "taken {late:?} after it was left"
        );
    }

    #[test]
    fn issue22_6_the_answer_holds_no_value_in_clear() {
        let dir = tempfile::tempdir().unwrap();
        let secret = SecretKey::generate(&mut OsRng);
        let key = Key {
            public_key: STANDARD.encode(secret.public_key().as_bytes()),
        };
        std::fs::write(dir.path().join(KEY_FILE), control::encode(&key)).unwrap();
        let mut held = Held::Values(values());
        held.answer(dir.path());
        let answer = std::fs::read(dir.path().join(SEALED_FILE)).unwrap();
        let text = String::from_utf8_lossy(&answer);
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(
            !text.contains(&STANDARD.encode("s3cr3t-value-42")),
            "{text}"
        );
        assert_eq!(open(&secret, &answer).unwrap(), values());
        // Asked again, it has nothing more to give.
        std::fs::remove_file(dir.path().join(SEALED_FILE)).unwrap();
        held.answer(dir.path());
        assert!(!dir.path().join(SEALED_FILE).exists());
    }

    #[test]
    fn issue22_6_a_daemon_without_the_values_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let tracker = daemon(
            dir.path().to_path_buf(),
            Held::Gone(GONE_WITH_THE_DAEMON.into()),
        );
        let why = receive(dir.path(), Duration::from_secs(10)).unwrap_err();
        assert_eq!(why, GONE_WITH_THE_DAEMON);
        tracker.join().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn issue22_6_no_daemon_no_run() {
        let dir = tempfile::tempdir().unwrap();
        let why = receive(dir.path(), Duration::from_millis(300)).unwrap_err();
        assert!(why.contains("did not hand over"), "{why}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn issue22_6_an_answer_sealed_to_another_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let other = SecretKey::generate(&mut OsRng);
        let key = Key {
            public_key: STANDARD.encode(other.public_key().as_bytes()),
        };
        std::fs::write(dir.path().join(KEY_FILE), control::encode(&key)).unwrap();
        let mut held = Held::Values(values());
        held.answer(dir.path());
        let answer = std::fs::read(dir.path().join(SEALED_FILE)).unwrap();
        let mine = SecretKey::generate(&mut OsRng);
        assert!(open(&mine, &answer).unwrap_err().contains("not sealed"));
    }
}
