//! `run`: its output streamed to stdout, stdin passed on, and its end as the exit code.

use super::terminal::{inert, inert_lines};
use crate::client::Client;
use crate::wire::{self, Envelope, Request, RunOutcome, RunReply, WireError};
use base64::Engine;
use std::io::Write;
use std::process::ExitCode;

/// `run`: streams output chunks, then exits with the command's own status when it
/// ended in time, 0 when it was promoted, 1 when it was killed.
pub(super) fn run(
    client: &mut Client,
    envelope: &Envelope,
    json: bool,
) -> Result<ExitCode, WireError> {
    client.send(envelope)?;
    // Stdin frames and a detach frame share one writer, a whole line at a time.
    let writer = std::sync::Arc::new(std::sync::Mutex::new(client.writer()?));
    let mut feeder = None;
    if matches!(&envelope.request, Request::Run(args) if args.stdin == wire::RunStdin::Forward) {
        feeder = Some(Feeder::start(&writer));
    }
    let mut out = std::io::stdout();
    // Why stdout could not take the output (a full disk): the run was asked to go on in
    // the background, and nothing more goes to stdout.
    let mut detached: Option<String> = None;
    // Whether the choice of `--timeout auto` was said before the wait.
    let mut said = false;
    // The run's job, once the daemon named it.
    let mut started: Option<String> = None;
    let reply: RunReply = loop {
        let line = match (client.next_line(), &started) {
            (Ok(Some(line)), _) => line,
            // The job lives on under its supervisor; a daemon started by the next call
            // takes it back.
            (Ok(None) | Err(_), Some(id)) => {
                return Err(WireError::new(
                    wire::ErrorCode::Unavailable,
                    format!(
                        "the daemon went away during the run of {id}, which goes on: \
                         `bgwork wait {id}` for its end, `bgwork read {id}` for its output"
                    ),
                ))
            }
            (Ok(None), None) => {
                return Err(WireError::new(
                    wire::ErrorCode::Unavailable,
                    "the daemon closed the connection",
                ))
            }
            (Err(e), None) => return Err(e),
        };
        if let Ok(chunk) = serde_json::from_slice::<wire::Chunk>(&line) {
            // The command's own bytes, as they are (its stdout is this one).
            let bytes = match &chunk.bytes {
                Some(encoded) => base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .unwrap_or_default(),
                None => inert_lines(&chunk.chunk).into_owned().into_bytes(),
            };
            if detached.is_some() {
                continue;
            }
            match out.write_all(&bytes).and_then(|()| out.flush()) {
                Ok(()) => {}
                // Whoever read this stdout went away (`run … | head`): so does the run,
                // and the daemon stops its job as the person's Ctrl-C would.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    return Ok(ExitCode::from(141))
                }
                // A full disk (or a failing device) is no reader going away: the command
                // goes on in the background, and the caller is told so on stderr.
                Err(e) => {
                    let why = format!("the run's output could not be written to stdout ({e})");
                    match &mut feeder {
                        // The feeder is the connection's one writer: it sends it.
                        Some(Feeder::Process { control }) => {
                            let line = format!("detach {}\n", why.replace('\n', " "));
                            let _ = control.write_all(line.as_bytes());
                        }
                        _ => {
                            let frame = wire::StdinFrame {
                                detach: Some(why.clone()),
                                ..wire::StdinFrame::default()
                            };
                            let mut writer = writer.lock().unwrap_or_else(|p| p.into_inner());
                            let _ = writer.write_all(&wire::encode_line(&frame));
                        }
                    }
                    detached = Some(why);
                }
            }
            continue;
        }
        if let Ok(first) = serde_json::from_slice::<wire::RunStarted>(&line) {
            if let Some(note) = &first.note {
                // On stderr, `--json` or not: stdout keeps the reply alone.
                eprintln!("[{}]", inert(note));
                said = true;
            }
            started = Some(first.started).filter(|id| !id.is_empty());
            continue;
        }
        break wire::decode_reply(&line)?;
    };
    if let (Some(Feeder::Process { control }), RunOutcome::Promoted) = (&mut feeder, reply.outcome)
    {
        // The rest of stdin is the job's now: the feeder outlives this process.
        let folder = reply.item.folder.as_deref().unwrap_or("");
        let keep = format!("keep {}\t{}\t{folder}\n", envelope.session, reply.item.id);
        let _ = control.write_all(keep.as_bytes());
    }
    if detached.is_some() {
        // Stdout takes nothing: the end (or the promotion) is said on stderr.
        eprintln!("bgwork: {}", inert(&reply.message));
        let code = match (reply.outcome, reply.item.exit_code, reply.item.signal) {
            (RunOutcome::Ended, Some(code), _) => code,
            (RunOutcome::Ended, None, Some(signal)) => 128 + signal,
            _ => 1,
        };
        return Ok(ExitCode::from(code.clamp(0, 255) as u8));
    }
    let mut text = match json {
        true => wire::to_json_text(&reply),
        false => inert_lines(&reply.output).into_owned(),
    };
    if json && !text.ends_with('\n') {
        text.push('\n');
    }
    let printed = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    if let Err(e) = printed {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            // A full disk: the reply is lost, which the caller must hear of.
            eprintln!(
                "bgwork: the run's reply could not be written to stdout ({e}): {}",
                inert(&reply.message)
            );
            return Ok(ExitCode::from(1));
        }
    }
    if let (false, false, Some(choice)) = (json, said, &reply.timeout_choice) {
        eprintln!("[{}]", inert(choice));
    }
    if !json && reply.outcome != RunOutcome::Ended {
        eprintln!("[{}]", inert(&reply.message));
    }
    let code = match reply.outcome {
        RunOutcome::Ended => match (reply.item.exit_code, reply.item.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 1,
        },
        RunOutcome::Promoted => 0,
        RunOutcome::Killed => 1,
    };
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Who passes this process's stdin on to a run.
enum Feeder {
    /// A thread of this process: a terminal's input (or a stdin that is no pipe, file or
    /// socket) goes to the run while it is in the foreground.
    Thread,
    /// `bgwork run-feed`, a process of its own holding this stdin and the connection: a
    /// promoted run's job gets the rest of a pipe or a file after this process exits
    /// (the daemon passes it on after the reply); `control` asks it for the background.
    Process { control: std::fs::File },
}

impl Feeder {
    fn start(writer: &std::sync::Arc<std::sync::Mutex<std::os::unix::net::UnixStream>>) -> Feeder {
        let stdin = std::io::stdin();
        let piped = nix::sys::stat::fstat(&stdin).is_ok_and(|st| {
            let kind = nix::sys::stat::SFlag::from_bits_truncate(st.st_mode)
                & nix::sys::stat::SFlag::S_IFMT;
            [
                nix::sys::stat::SFlag::S_IFIFO,
                nix::sys::stat::SFlag::S_IFREG,
                nix::sys::stat::SFlag::S_IFSOCK,
            ]
            .contains(&kind)
        });
        if piped {
            match Self::spawn(writer) {
                Ok(control) => return Feeder::Process { control },
                Err(e) => eprintln!(
                    "bgwork: could not start the process that passes stdin on ({e}): \
                     a promoted run gets only the input passed before its promotion"
                ),
            }
        }
        let writer = writer.clone();
        std::thread::spawn(move || forward_stdin(&writer));
        Feeder::Thread
    }

    /// Starts `bgwork run-feed` with this stdin, a descriptor of the connection and the
    /// read end of a control pipe; the write end is this process's.
    fn spawn(
        writer: &std::sync::Mutex<std::os::unix::net::UnixStream>,
    ) -> std::io::Result<std::fs::File> {
        use std::os::fd::{AsRawFd, OwnedFd};
        let socket: OwnedFd = {
            let writer = writer.lock().unwrap_or_else(|p| p.into_inner());
            // `dup` leaves the new descriptor open across exec.
            nix::unistd::dup(&*writer).map_err(std::io::Error::from)?
        };
        let (read, write) = nix::unistd::pipe().map_err(std::io::Error::from)?;
        nix::fcntl::fcntl(
            &write,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(std::io::Error::from)?;
        std::process::Command::new(std::env::current_exe()?)
            .args(["run-feed", "--fd", &socket.as_raw_fd().to_string()])
            .args(["--control", &read.as_raw_fd().to_string()])
            .stdin(std::process::Stdio::inherit())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        Ok(std::fs::File::from(write))
    }
}

/// `bgwork run-feed`: passes its stdin on to the run of the connection `fd` as stdin
/// frames until it ends (then says end-of-input), or until the daemon closes the
/// connection (the run ended, or its job did). On `control`, `run` says `detach WHY`
/// (sent on as a detach) and `keep SESSION<tab>ID<tab>FOLDER` once the run is promoted; `control`
/// closed before `keep` is a `run` gone (killed, or ended): the feeder goes too, so the
/// daemon sees the caller go as it would without a feeder. Once promoted, the daemon's
/// last words on the connection say what is left ([`leftover`]): the job takes no more
/// ([`wire::STDIN_TAKEN_NO_MORE`]), or the connection closed while the job runs on (a
/// daemon stopped or restarted, which gives back what the job had not taken): then the
/// rest goes with `send` ([`send_rest`]).
pub fn feed_main(fd: i32, control: i32) -> ExitCode {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::io::BufRead;
    use std::os::fd::{AsFd, FromRawFd};
    // Safety: both descriptors were opened for this process by `run`, which owns none
    // of them any more.
    let mut socket = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    let mut control = Some(std::io::BufReader::new(unsafe {
        std::fs::File::from_raw_fd(control)
    }));
    let stdin = std::io::stdin();
    let mut buffer = vec![0u8; 64 << 10];
    // The promoted job, once `run` says which.
    let mut job: Option<Promoted> = None;
    // What `run` said on `control` while a frame was being written.
    let mut heard: Vec<String> = Vec::new();
    loop {
        // `run` said it was promoted, or asked a detach, while a write blocked.
        for line in std::mem::take(&mut heard) {
            match line.trim_end().strip_prefix("detach ") {
                Some(why) => {
                    let frame = wire::StdinFrame {
                        detach: Some(why.to_string()),
                        ..wire::StdinFrame::default()
                    };
                    if write_frame(&socket, &frame, &mut control, &mut heard) != Written::Whole {
                        return ExitCode::SUCCESS;
                    }
                }
                None => job = job.or_else(|| kept(&line)),
            }
        }
        let (gone, asked, input) = {
            let socket_fd = socket.as_fd();
            // Before the promotion the connection's replies are `run`'s to read: no
            // events asked (its hang-up, the daemon closed it, is always told). After
            // it, the daemon's one line says the job takes no more input.
            let told = match job {
                Some(_) => PollFlags::POLLIN,
                None => PollFlags::empty(),
            };
            let mut fds = vec![
                PollFd::new(socket_fd, told),
                PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
            ];
            if let Some(control) = &control {
                fds.push(PollFd::new(control.get_ref().as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return ExitCode::FAILURE,
            }
            let any =
                |fd: &PollFd, flags: PollFlags| fd.revents().is_some_and(|r| r.intersects(flags));
            let ended = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
            (
                any(&fds[0], ended | told),
                fds.get(2)
                    .is_some_and(|fd| any(fd, PollFlags::POLLIN | ended)),
                any(&fds[1], PollFlags::POLLIN | ended),
            )
        };
        if gone {
            job = job
                .or_else(|| heard.iter().find_map(|line| kept(line)))
                .or_else(|| promotion(&mut control));
            if let Some(job) = &job {
                if let Leftover::Returned(back) = leftover(&mut socket) {
                    send_rest(job, &mut buffer, back, false);
                }
            }
            return ExitCode::SUCCESS;
        }
        if asked {
            let mut line = String::new();
            match control.as_mut().map(|c| c.read_line(&mut line)) {
                Some(Ok(n)) if n > 0 => {
                    if line.starts_with("detach ") {
                        heard.push(line);
                    } else {
                        job = kept(&line);
                        control = None;
                    }
                    continue;
                }
                // `run` went away before its promotion.
                _ => return ExitCode::SUCCESS,
            }
        }
        if input {
            let n = read_piece(&mut stdin.lock(), &mut buffer);
            let sent = match write_frame(
                &socket,
                &input_frame(&buffer[..n]),
                &mut control,
                &mut heard,
            ) {
                Written::Whole => true,
                Written::Failed => false,
                // `run` went away before its promotion (a Ctrl-C): so does its feeder,
                // and the daemon sees the caller go, though it read nothing meanwhile.
                Written::RunGone => return ExitCode::SUCCESS,
            };
            if sent && n > 0 {
                continue;
            }
            // A write that blocked while the job took nothing may have outlasted the
            // promotion: `run` said it meanwhile.
            job = job
                .or_else(|| heard.iter().find_map(|line| kept(line)))
                .or_else(|| promotion(&mut control));
            let Some(job) = &job else {
                return ExitCode::SUCCESS;
            };
            // Promoted: the end of input sent, or a piece the connection refused (its
            // daemon shut it as it went: none of the piece was taken). The daemon says
            // whether the job took everything.
            if let Leftover::Returned(mut back) = leftover(&mut socket) {
                if !sent {
                    back.extend_from_slice(&buffer[..n]);
                }
                send_rest(job, &mut buffer, back, n == 0);
            }
            return ExitCode::SUCCESS;
        }
    }
}

/// How a frame's write ended.
#[derive(PartialEq, Eq)]
enum Written {
    Whole,
    /// The connection refused it (its daemon shut it, or went).
    Failed,
    /// `run` closed `control` before it said the run was promoted.
    RunGone,
}

/// Writes `frame` whole on the run's connection, watching `control` meanwhile: a write
/// that blocks (the daemon reads no more while the job takes none of its input) must
/// not keep the feeder, and with it the connection, alive after its `run` went. What
/// `run` says meanwhile is put in `heard`.
fn write_frame(
    socket: &std::os::unix::net::UnixStream,
    frame: &wire::StdinFrame,
    control: &mut Option<std::io::BufReader<std::fs::File>>,
    heard: &mut Vec<String>,
) -> Written {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::socket::{send, MsgFlags};
    use std::io::BufRead;
    use std::os::fd::{AsFd, AsRawFd};
    let line = wire::encode_line(frame);
    let mut done = 0;
    while done < line.len() {
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        match send(socket.as_raw_fd(), &line[done..], flags) {
            Ok(n) => {
                done += n;
                continue;
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(_) => return Written::Failed,
        }
        let mut fds = vec![PollFd::new(socket.as_fd(), PollFlags::POLLOUT)];
        if let Some(control) = control.as_ref() {
            fds.push(PollFd::new(control.get_ref().as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return Written::Failed,
        }
        let told = fds
            .get(1)
            .and_then(PollFd::revents)
            .is_some_and(|r| !r.is_empty());
        if !told {
            continue;
        }
        let mut said = String::new();
        match control.as_mut().map(|c| c.read_line(&mut said)) {
            Some(Ok(n)) if n > 0 => {
                let keep = said.starts_with("keep ");
                heard.push(said);
                if keep {
                    *control = None;
                }
            }
            _ => return Written::RunGone,
        }
    }
    Written::Whole
}

/// The job of a `keep SESSION<tab>ID<tab>FOLDER` line of `control` (FOLDER may be empty).
fn kept(line: &str) -> Option<Promoted> {
    let rest = line
        .strip_suffix('\n')
        .unwrap_or(line)
        .strip_prefix("keep ")?;
    let (session, rest) = rest.split_once('\t')?;
    let (id, folder) = rest.split_once('\t').unwrap_or((rest, ""));
    Some(Promoted {
        session: session.to_string(),
        id: id.to_string(),
        folder: (!folder.is_empty()).then(|| std::path::PathBuf::from(folder)),
    })
}

/// The promoted job a feeder passes the rest of stdin to.
struct Promoted {
    session: String,
    id: String,
    /// Its folder, where its end is written whether or not a daemon runs.
    folder: Option<std::path::PathBuf>,
}

impl Promoted {
    /// Whether the job's folder says it ended: its status is written, or the
    /// supervisor it recorded is gone. No daemon is started for such a job: one
    /// stopped with its work (`shutdown --stop-work`) is not started again by a
    /// feeder with nothing left to pass.
    fn ended_here(&self) -> bool {
        let Some(folder) = &self.folder else {
            return false;
        };
        let recorded = crate::supervisor::tree::TreeRecord::read(folder)
            .supervisor
            .is_some();
        crate::job_dir::JobDir(folder).status().exists()
            || (recorded && crate::supervisor::tree::supervisor_of(folder).is_none())
    }
}

/// The promoted job, once `run` says it on `control` (read to its end: `run` closes it
/// as it goes, promoted or not); none when the run was not promoted.
fn promotion(control: &mut Option<std::io::BufReader<std::fs::File>>) -> Option<Promoted> {
    use std::io::BufRead;
    let control = control.take()?;
    control
        .lines()
        .map_while(Result::ok)
        .find_map(|line| kept(&line))
}

/// What a promoted run's daemon left to its feeder when it closed the connection.
enum Leftover {
    /// The job takes no more input (it ended, or its input closed): nothing is passed
    /// to the next daemon (one stopped with its work is not started again).
    NoMore,
    /// The connection closed while the job may run on (a daemon gone), with the input
    /// it gave back (none from a daemon killed): sent to the next daemon first.
    Returned(Vec<u8>),
}

/// Reads the daemon's last lines on a promoted run's connection, to its end.
fn leftover(socket: &mut std::os::unix::net::UnixStream) -> Leftover {
    use base64::Engine;
    use std::io::BufRead;
    // A daemon closes the connection once it has said it; one stuck is not waited on.
    let _ = socket.set_read_timeout(Some(std::time::Duration::from_secs(30)));
    let no_more = wire::STDIN_TAKEN_NO_MORE.trim_ascii_end();
    let mut back = Vec::new();
    for line in std::io::BufReader::new(socket).split(b'\n') {
        let Ok(line) = line else { break };
        if line == no_more {
            return Leftover::NoMore;
        }
        if let Ok(returned) = serde_json::from_slice::<wire::ReturnedStdin>(&line) {
            if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(returned.returned) {
                back.extend_from_slice(&bytes);
            }
        }
    }
    Leftover::Returned(back)
}

/// The rest of a promoted run's stdin after its connection closed: `back` first (what
/// the old daemon gave back, and a piece it refused), then each piece of stdin with
/// `send` (a daemon that restarted takes the job back and its input with it), then
/// `--key C-d` at its end (at once when `ended`: stdin had ended already); until the
/// job takes no more input (it ended, or its input closed). A daemon killed loses what
/// it had not read of the connection.
fn send_rest(job: &Promoted, buffer: &mut [u8], back: Vec<u8>, ended: bool) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    use std::time::Duration;
    let paths = crate::paths::Paths::from_env();
    let stdin = std::io::stdin();
    let (session, id) = (job.session.as_str(), job.id.as_str());
    let ask = |request: Request, patience: Duration| -> Result<serde_json::Value, WireError> {
        ask(&paths, session, request, patience, &|| !job.ended_here())
    };
    // Whether the job has ended (as its folder says, or a daemon now).
    let job_ended = || {
        let look = Request::Wait(wire::WaitArgs {
            ids: vec![id.to_string()],
            timeout_s: Some(0.0),
            ..wire::WaitArgs::default()
        });
        job.ended_here()
            || ask(look, Duration::ZERO)
                .ok()
                .and_then(|reply| serde_json::from_value::<wire::WaitReply>(reply).ok())
                .is_some_and(|reply| reply.items.iter().any(|i| i.state == wire::State::Ended))
    };
    // A send is asked again while no daemon answers (one is starting), for a minute;
    // while the job's input queue is full (`limit`: it reads later); and, for a
    // minute, while the job that runs on is not attached yet (the next daemon takes
    // it back). Refused otherwise, the job takes no more.
    let send = |text: String, keys: Vec<String>| {
        let mut pause = Duration::from_millis(100);
        let unattached_until = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let send = Request::Send(wire::SendArgs {
                id: id.to_string(),
                text: text.clone(),
                keys: keys.clone(),
            });
            match ask(send, Duration::from_secs(60)) {
                Ok(_) => return true,
                // A daemon that read the piece and went away (killed) may have passed
                // it on or lost it, as a killed daemon loses what it held: the passing
                // goes on with the next piece, to the daemon that takes the job back.
                Err(e) if e.code == wire::ErrorCode::Unavailable && daemon_took(&e) => return true,
                Err(e) if e.code == wire::ErrorCode::Limit => {}
                Err(e)
                    if e.code == wire::ErrorCode::NotRunning
                        && std::time::Instant::now() < unattached_until
                        && !job_ended() => {}
                Err(_) => return false,
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    };
    // `piece` sent (empty: the end of input); whether more may follow.
    let pass = |piece: &[u8]| {
        let taken = match piece.is_empty() {
            true => send(String::new(), vec!["C-d".to_string()]),
            false => send(crate::keys::escape(piece), Vec::new()),
        };
        taken && !piece.is_empty()
    };
    for piece in back.chunks(64 << 10) {
        if !pass(piece) {
            return;
        }
    }
    if ended {
        pass(&[]);
        return;
    }
    loop {
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        let ready = match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(n) => n > 0,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        };
        if !ready {
            // A quiet pipe: the job may have ended meanwhile.
            if job_ended() {
                return;
            }
            continue;
        }
        let n = read_piece(&mut stdin.lock(), buffer);
        if !pass(&buffer[..n]) {
            return;
        }
    }
}

/// One request of `session`, its connection tried again every 200 ms for `patience`
/// while no daemon can be reached, and asked again while a daemon that goes away
/// leaves it unread (a daemon shut down with it in its queue: it was not carried out).
/// One that a daemon read and went away with is not asked again (a `send` it may have
/// carried out would be sent twice): its error is `Unavailable`. A daemon is started
/// only while `may_start` says so (looked at before each try); otherwise no daemon
/// running is an `Unavailable` at once, not waited on.
fn ask<T: serde::de::DeserializeOwned>(
    paths: &crate::paths::Paths,
    session: &str,
    request: Request,
    patience: std::time::Duration,
    may_start: &dyn Fn() -> bool,
) -> Result<T, WireError> {
    let envelope = Envelope {
        session: session.to_string(),
        request,
    };
    let deadline = std::time::Instant::now() + patience;
    loop {
        let connected = match may_start() {
            true => Client::connect(paths),
            false => match Client::connect_existing(paths) {
                Ok(client) => Ok(client),
                Err(e) => {
                    return Err(WireError::new(
                        wire::ErrorCode::Unavailable,
                        format!("no daemon runs, and the job ended: {e}"),
                    ))
                }
            },
        };
        match connected {
            Ok(mut client) => match client.call::<T>(&envelope) {
                Err(_) if client.unread() && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                answer => return answer,
            },
            Err(e)
                if e.code == wire::ErrorCode::Unavailable
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether a failed request's error says a daemon read it and went away with it.
fn daemon_took(error: &WireError) -> bool {
    error
        .message
        .contains(crate::client::WENT_AWAY_WITH_REQUEST)
}

/// The next piece of `stdin` into `buffer`: its length, 0 at its end (a stdin that
/// cannot be read is an ended one).
fn read_piece(stdin: &mut impl std::io::Read, buffer: &mut [u8]) -> usize {
    loop {
        match stdin.read(buffer) {
            Ok(n) => return n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return 0,
        }
    }
}

/// A piece of the caller's stdin as a frame of its run (none: its end).
fn input_frame(piece: &[u8]) -> wire::StdinFrame {
    wire::StdinFrame {
        stdin: base64::engine::general_purpose::STANDARD.encode(piece),
        eof: piece.is_empty(),
        detach: None,
    }
}

/// Passes this process's stdin on to a run, until it ends (or cannot be read: a closed
/// or unreadable stdin is an ended one), then says end-of-input.
fn forward_stdin(writer: &std::sync::Mutex<std::os::unix::net::UnixStream>) {
    let mut stdin = std::io::stdin().lock();
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let n = read_piece(&mut stdin, &mut buffer);
        let frame = input_frame(&buffer[..n]);
        let mut writer = writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.write_all(&wire::encode_line(&frame)).is_err() || n == 0 {
            return;
        }
    }
}
