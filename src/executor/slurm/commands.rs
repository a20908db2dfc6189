//! The supervisor's side of a Slurm job, on its node: `bgwork supervise --spec-file`
//! ([`supervise`]) takes the job's spec from the file and its values through the
//! hand-over, and its commands from files. The daemon leaves each
//! command as `commands/<ms>-<pid>-<n>.json` in the job's folder (written whole, then
//! renamed into place, so names sort in the order they were left, see `Tracker`); the
//! supervisor on the node takes them through [`CommandFiles`], removing each file once
//! read, and answers input as `answers/<seq>.json`, which the daemon's tracker reads.

use super::handover;
use crate::job_dir::JobDir;
use crate::supervisor::{write_not_started, CommandSource, Launch, MAX_COMMAND_LINE};
use crate::wire::control::{self, FromSupervisor, JobSpec, ToSupervisor};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// `bgwork supervise --spec-file PATH`: the supervisor of a job that Slurm started,
/// its spec taken from the file and its commands from the job's folder.
pub fn supervise(spec_file: PathBuf) -> ! {
    let make = move || {
        launch_from_file(&spec_file)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", spec_file.display())))
    };
    crate::supervisor::run(Launch::Made {
        make: Box::new(make),
        commands: Box::new(CommandFiles),
    })
}

/// A launch socket fed from a spec file: the spec is read and the file removed; the
/// job's environment and secrets, which the file does not hold, are asked of the
/// daemon through the job's folder (`handover`) and put under the environment Slurm
/// gave this process (`environ::under_scheduler`); the whole spec is written on one
/// end of a socket pair by a thread, whose other end becomes the launch socket; nobody
/// answers on it. A job whose values cannot come ends as not started, with why.
fn launch_from_file(path: &Path) -> std::io::Result<UnixStream> {
    let bytes = crate::paths::read_untrusted(path, 64 << 20)?;
    let _ = std::fs::remove_file(path);
    let mut spec: JobSpec = control::decode(&bytes).map_err(std::io::Error::other)?;
    let job_dir = PathBuf::from(&spec.job_dir);
    match handover::receive(&job_dir, handover::PATIENCE) {
        Ok(values) => values.put(&mut spec),
        Err(why) => {
            write_not_started(&job_dir, &spec.owner, &why)?;
            return Err(std::io::Error::other(why));
        }
    }
    crate::environ::under_scheduler(&mut spec, std::env::vars_os());
    let spec = control::encode(&spec);
    let (ours, mut theirs) = UnixStream::pair()?;
    std::thread::spawn(move || {
        let _ = theirs.write_all(&spec);
        // Held open until the job is read: dropped with this thread afterwards.
        let _ = theirs.shutdown(std::net::Shutdown::Write);
    });
    Ok(ours)
}

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
