//! The supervisor's side of a Slurm job's command files: the daemon leaves each
//! command as `commands/<ms>-<pid>-<n>.json` in the job's folder (written whole, then
//! renamed into place, so names sort in the order they were left, see `Tracker`); the
//! supervisor on the node takes them through [`CommandFiles`], removing each file once
//! read, and answers input as `answers/<seq>.json`, which the daemon's tracker reads.

use crate::job_dir::JobDir;
use crate::supervisor::{CommandSource, MAX_COMMAND_LINE};
use crate::wire::control::{self, FromSupervisor, ToSupervisor};
use std::path::{Path, PathBuf};

/// The command files of a job's folder, as its supervisor reads them.
#[derive(Debug, Default)]
pub struct CommandFiles;

impl CommandSource for CommandFiles {
    fn take(&mut self, job_dir: &Path) -> Vec<ToSupervisor> {
        let dir = JobDir(job_dir).commands();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut names: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        names.sort();
        let mut commands = Vec::new();
        for path in names {
            // As long as a control line may be (input is the longest command).
            let bytes = crate::paths::read_untrusted(&path, MAX_COMMAND_LINE as u64);
            let _ = std::fs::remove_file(&path);
            let Ok(bytes) = bytes else { continue };
            for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                match control::decode::<ToSupervisor>(line) {
                    Ok(message) => commands.push(message),
                    Err(e) => crate::note!("bgwork supervise: a command file: {e}"),
                }
            }
        }
        commands
    }

    fn answer(&mut self, job_dir: &Path, seq: u64, answer: &FromSupervisor) {
        let dir = JobDir(job_dir).answers();
        let _ = std::fs::create_dir(&dir);
        let written =
            crate::paths::write_whole(&dir.join(format!("{seq}.json")), &control::encode(answer));
        if let Err(e) = written {
            crate::note!(
                "bgwork supervise: could not answer in {}: {e}",
                dir.display()
            );
        }
    }
}
