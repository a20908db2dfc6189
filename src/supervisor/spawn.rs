//! Starting the job: `bash -c COMMAND` in a process group of its own with its output on
//! a pipe, or, for a pane, as the session leader of a new pseudo-terminal.

use crate::wire::control::JobSpec;
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// A started job: its pid, where its output is read and where its input is written.
pub struct Spawned {
    pub pid: i32,
    pub output: File,
    pub input: File,
    pub pty: Option<pty_process::blocking::Pty>,
}

/// Starts the job as its spec says (a pane when it asks for a terminal).
pub fn spawn_job(spec: &JobSpec) -> std::io::Result<Spawned> {
    match spec.pane {
        Some(size) => spawn_pane(spec, size),
        None => {
            let (pid, output, input) = spawn_job_plain(spec)?;
            Ok(Spawned {
                pid,
                output,
                input,
                pty: None,
            })
        }
    }
}

fn spawn_pane(spec: &JobSpec, size: crate::wire::control::PaneSize) -> std::io::Result<Spawned> {
    let (pty, pts) = pty_process::blocking::open().map_err(std::io::Error::other)?;
    pty.resize(pty_process::Size::new(size.rows, size.cols))
        .map_err(std::io::Error::other)?;
    let command = pty_process::blocking::Command::new(bash())
        .arg("-c")
        .arg("--")
        .arg(&spec.command)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(&spec.env)
        .envs(env_bytes(spec)?)
        .env("TERM", "xterm-256color")
        .env("BGWORK_JOB", &spec.job_key);
    // SAFETY: only async-signal-safe calls (sigprocmask, sigaction, prctl) run between
    // fork and exec; pty-process makes the child a session leader on the terminal first.
    let command = unsafe { command.pre_exec(reset_for_exec) };
    if !Path::new(&spec.cwd).is_dir() {
        return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
    }
    let child = command.spawn(pts).map_err(std::io::Error::other)?;
    let master: OwnedFd = nix::unistd::dup(&pty)?;
    let output = nonblocking(master)?;
    let input = output.try_clone()?;
    Ok(Spawned {
        pid: child.id() as i32,
        output,
        input,
        pty: Some(pty),
    })
}

/// What a job's process does between fork and exec (after joining a group of its own,
/// or becoming a pane's session leader): the signal mask and handling a fresh process
/// has (the supervisor blocks signals it reads from a signalfd), and death with its
/// supervisor.
fn reset_for_exec() -> std::io::Result<()> {
    SigSet::empty().thread_set_mask()?;
    for signal in [
        Signal::SIGPIPE,
        Signal::SIGHUP,
        Signal::SIGINT,
        Signal::SIGTERM,
    ] {
        // SAFETY: restoring the default disposition installs no handler.
        unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl)? };
    }
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    Ok(())
}

/// Starts `bash -c COMMAND` in its own process group; returns its pid, the read end of
/// its output pipe and the write end of its stdin, both non-blocking.
fn spawn_job_plain(spec: &JobSpec) -> std::io::Result<(i32, File, File)> {
    let (output_read, output_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (input_read, input_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let _ = nix::fcntl::fcntl(&output_read, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
    let mut command = Command::new(bash());
    command
        .arg("-c")
        .arg("--")
        .arg(&spec.command)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(&spec.env)
        .envs(env_bytes(spec)?)
        .env("BGWORK_JOB", &spec.job_key)
        .stdin(Stdio::from(input_read))
        .stdout(Stdio::from(output_write.try_clone()?))
        .stderr(Stdio::from(output_write));
    // SAFETY: only async-signal-safe calls (setpgid, sigprocmask, sigaction, prctl) run
    // between fork and exec.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            reset_for_exec()
        });
    }
    let child = command.spawn()?;
    drop(command);
    let output = nonblocking(output_read)?;
    let stdin = nonblocking(input_write)?;
    Ok((child.id() as i32, output, stdin))
}

/// The spec's variables that are not UTF-8, as the bytes they were.
fn env_bytes(spec: &JobSpec) -> std::io::Result<Vec<(OsString, OsString)>> {
    crate::environ::decode_pairs(&spec.env_bytes).map_err(std::io::Error::other)
}

fn nonblocking(fd: OwnedFd) -> std::io::Result<File> {
    let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(File::from(fd))
}

/// The shell that runs commands: `/bin/bash` where it exists (no PATH search).
fn bash() -> &'static str {
    if Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "bash"
    }
}

pub fn spawn_message(spec: &JobSpec, error: &std::io::Error) -> String {
    if !Path::new(&spec.cwd).is_dir() {
        return format!(
            "the working directory {} does not exist: pass an existing --cwd",
            spec.cwd
        );
    }
    format!("could not run bash -c: {error}")
}
