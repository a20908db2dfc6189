//! Harness sessions (contract §11): a hook binds its session to its harness process;
//! an MCP server under that process joins it, else takes over the session an earlier
//! server of the same harness process made (a restarted server), else makes one. The
//! bindings are in the store, so they survive a restart of the daemon too.

use super::Daemon;
use crate::harness::alive;
use crate::paths::now_ms;
use crate::wire::{Ack, ProcessKey, SessionReply, WireError};

/// The longest boot id a request may carry (the kernel's is 36 characters).
const MAX_BOOT_ID: usize = 64;

impl Daemon {
    /// `bind_harness`: `session` is the conversation of the harness process `harness`.
    pub(crate) fn bind_harness(
        &self,
        session: &str,
        harness: &ProcessKey,
    ) -> Result<Ack, WireError> {
        check_key("harness", harness)?;
        self.forget_gone_harnesses();
        self.lock()
            .store
            .bind_hook_session(session, harness, now_ms())?;
        Ok(Ack {
            ok: true,
            message: format!(
                "{session} is the session of harness process {}",
                harness.pid
            ),
        })
    }

    /// `new_session`: a session for an MCP server; with its harness process, the one
    /// that process speaks for (see the module's comment).
    pub(crate) fn new_session(
        &self,
        base: &str,
        harness: Option<&ProcessKey>,
        server: Option<&ProcessKey>,
    ) -> Result<SessionReply, WireError> {
        let (Some(harness), Some(server)) = (harness, server) else {
            return self.unique_session(base);
        };
        check_key("harness", harness)?;
        check_key("server", server)?;
        self.forget_gone_harnesses();
        let bindings = self.lock().store.harness_bindings(harness)?;
        if let Some(hook) = bindings.iter().find(|b| b.by_hook) {
            return Ok(SessionReply {
                session: hook.session.clone(),
            });
        }
        let me = (server.pid, server.started);
        if let Some(own) = bindings.iter().find(|b| b.server == Some(me)) {
            return Ok(SessionReply {
                session: own.session.clone(),
            });
        }
        // A server of this harness process that is gone: its session is taken over.
        let gone = bindings.iter().filter(|b| {
            b.server.is_some_and(|(pid, started)| {
                !alive(&ProcessKey {
                    pid,
                    started,
                    boot: harness.boot.clone(),
                })
            })
        });
        for binding in gone {
            let before = binding.server.expect("filtered on a server");
            let mut inner = self.lock();
            if inner
                .store
                .take_over_server_session(&binding.session, before, server, now_ms())?
            {
                inner.claimed.insert(binding.session.clone());
                return Ok(SessionReply {
                    session: binding.session.clone(),
                });
            }
        }
        let reply = self.unique_session(base)?;
        self.lock()
            .store
            .bind_server_session(&reply.session, harness, server, now_ms())?;
        Ok(reply)
    }

    /// Forgets the bindings of harness processes that are gone (a pid and start time
    /// never come back, so they could only grow the table).
    fn forget_gone_harnesses(&self) {
        let bindings = match self.lock().store.all_harness_bindings() {
            Ok(bindings) => bindings,
            Err(e) => {
                crate::note!("bgwork daemon: could not read harness sessions: {e}");
                return;
            }
        };
        let gone: Vec<_> = bindings
            .into_iter()
            .filter(|b| !alive(&b.harness))
            .collect();
        if gone.is_empty() {
            return;
        }
        let mut inner = self.lock();
        for binding in gone {
            if let Err(e) = inner
                .store
                .forget_harness_binding(&binding.session, &binding.harness)
            {
                crate::note!("bgwork daemon: could not forget a harness session: {e}");
            }
        }
    }
}

fn check_key(what: &str, key: &ProcessKey) -> Result<(), WireError> {
    if key.pid == 0 || key.boot.is_empty() || key.boot.len() > MAX_BOOT_ID {
        return Err(WireError::bad_request(format!(
            "{what}: a process is a pid above 0, its start time and a boot id of 1 to \
             {MAX_BOOT_ID} bytes"
        )));
    }
    Ok(())
}
