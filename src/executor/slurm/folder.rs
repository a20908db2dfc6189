//! The files of a Slurm job's folder that its executor and its tracker both name: the
//! spec, the batch script and its output, and the figures the supervisor leaves.

use crate::job_dir::JobDir;
use crate::wire::control;
use std::path::Path;

pub(super) const SPEC_FILE: &str = "spec.json";
pub(super) const SCRIPT_FILE: &str = "slurm.sh";
/// The batch script's own output (the supervisor's complaints, Slurm's messages).
pub(super) const SLURM_OUT: &str = "slurm.out";

/// The log's dropped middle and unwritten bytes as the supervisor last wrote them
/// (none written: nothing dropped, nothing lost).
pub(super) fn figures(job_dir: &Path) -> (u64, u64, u64) {
    let read = crate::paths::read_untrusted(&JobDir(job_dir).figures(), 4096)
        .ok()
        .and_then(|bytes| control::decode::<control::FromSupervisor>(&bytes).ok());
    match read {
        Some(control::FromSupervisor::Output {
            dropped,
            unwritten,
            unwritten_at,
            ..
        }) => (dropped, unwritten, unwritten_at),
        _ => (0, 0, 0),
    }
}

pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)
        .and_then(|mut file| file.write_all(bytes))
        .map_err(|e| format!("could not write {}: {e}", path.display()))
}
