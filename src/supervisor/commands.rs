//! The control connections: the daemon's (and a client's) requests to the job
//! (stop, input, keys, resize), carried out and answered.

use super::conn::Conn;
use super::{pace_of, tree, Supervisor, INPUT_QUEUE_MAX};
use crate::wire::control::{FromSupervisor, ToSupervisor, PROTOCOL};
use nix::sys::signal::Signal;
use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

impl Supervisor {
    /// Takes new control connections; one from another uid is closed unread (the
    /// folder's modes keep other users out; this holds even when they were opened).
    pub(super) fn accept(&mut self) {
        while let Ok((stream, _)) = self.listener.accept() {
            if !same_user(&stream) {
                continue;
            }
            if let Ok(conn) = Conn::new(stream, Vec::new()) {
                self.conns.push(conn);
            }
        }
    }

    pub(super) fn serve_conn(&mut self, index: usize) {
        if self.conns[index].flush() {
            let figures = self.figures();
            self.conns[index].send(&figures);
        }
        for message in self.conns[index].receive() {
            self.handle(index, message);
        }
    }

    pub(super) fn handle(&mut self, index: usize, message: ToSupervisor) {
        if let Some(answer) = self.carry_out(message) {
            self.conns[index].send(&answer);
        }
    }

    /// Carries out a command of the daemon's, whether it came on a connection or as a
    /// file in the job's folder; returns the answer it calls for, if any.
    pub(super) fn carry_out(&mut self, message: ToSupervisor) -> Option<FromSupervisor> {
        match message {
            ToSupervisor::Hello { .. } => Some(FromSupervisor::Hello {
                protocol: PROTOCOL,
                pid: self.pid,
                log_len: self.log.len(),
                dropped: self.log.dropped(),
                unwritten: self.log.unwritten(),
                unwritten_at: self.log.unwritten_at(),
                status: self.final_status.clone(),
                between: self.between.clone().map(Box::new),
            }),
            ToSupervisor::Stop { actor, .. } if self.between.is_some() => {
                // Waiting to start again: nothing runs, so the stop ends it now.
                self.stop_actor.get_or_insert(actor);
                None
            }
            ToSupervisor::Stop { grace_ms, actor } => {
                self.begin_stop(Some(actor), Duration::from_millis(grace_ms));
                None
            }
            ToSupervisor::Rerun { run, marker } => {
                // Only the start the waiting run calls for: a repeated one starts nothing.
                if self.between.as_ref().is_some_and(|b| b.run + 1 == run) {
                    self.rerun(run, &marker);
                }
                None
            }
            ToSupervisor::Input { data } => {
                if self.stdin.is_some() && !self.close_input {
                    self.input_queue.extend_from_slice(&data);
                    self.write_input();
                    None
                } else {
                    Some(FromSupervisor::InputClosed)
                }
            }
            ToSupervisor::Write { seq, data } => Some(match self.take_input(data) {
                Ok(queued) => FromSupervisor::InputTaken { seq, queued },
                Err((reason, full)) => FromSupervisor::InputRefused { seq, reason, full },
            }),
            ToSupervisor::CloseInput => {
                // Input sent before end-of-input is still written (a caller's stdin
                // passed on and then closed, `send` then C-d).
                self.close_input = true;
                self.write_input();
                None
            }
            ToSupervisor::Resize { cols, rows } => {
                if let Some(pty) = &self.pty {
                    let _ = pty.resize(pty_process::Size::new(rows, cols));
                }
                None
            }
            ToSupervisor::Pace { every_ms } => {
                self.pace = pace_of(every_ms);
                None
            }
            ToSupervisor::Signal { signal } => {
                // A key's signal (C-c, C-z, a pane's hang-up) goes where a terminal
                // sends it: the job's process group, nothing else.
                if let (Ok(signal), None) = (Signal::try_from(signal), self.phase.main_end()) {
                    tree::signal_group(self.pid, signal);
                }
                None
            }
        }
    }

    /// Queues input for the job, within [`INPUT_QUEUE_MAX`]; the bytes now waiting.
    /// `Err((reason, full))`: refused, `full` when it may be taken later.
    pub(super) fn take_input(&mut self, data: Vec<u8>) -> Result<u64, (String, bool)> {
        if self.stdin.is_none() {
            return Err(("its stdin is closed".into(), false));
        }
        let waiting = self.input_queue.len();
        if waiting + data.len() > INPUT_QUEUE_MAX {
            let reason = format!(
                "it is not reading its input: {waiting} bytes sent earlier still wait \
                 (at most {INPUT_QUEUE_MAX} may)"
            );
            return Err((reason, true));
        }
        self.input_queue.extend_from_slice(&data);
        self.write_input();
        if self.stdin.is_none() {
            // The job had closed its end: nothing of it was taken.
            return Err(("its stdin is closed".into(), false));
        }
        Ok(self.input_queue.len() as u64)
    }

    pub(super) fn write_input(&mut self) {
        let Some(stdin) = self.stdin.as_mut() else {
            self.input_queue.clear();
            return;
        };
        while !self.input_queue.is_empty() {
            match stdin.write(&self.input_queue) {
                Ok(n) => {
                    self.input_queue.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.stdin = None;
                    self.input_queue.clear();
                    for conn in &mut self.conns {
                        conn.send(&FromSupervisor::InputClosed);
                    }
                    return;
                }
            }
        }
        if self.close_input {
            self.stdin = None;
        }
    }
}

/// Whether the peer of a control connection runs as this process's uid.
pub(super) fn same_user(stream: &UnixStream) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    getsockopt(stream, PeerCredentials)
        .is_ok_and(|peer| peer.uid() == nix::unistd::geteuid().as_raw())
}
