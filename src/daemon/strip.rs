//! The work strip's view of the daemon: the [`crate::http::Backend`] the daemon hands
//! the strip, so that the strip reaches it only through `wire::Request`s and its
//! wake-up signals (and `http` imports nothing of the daemon).

use super::Daemon;
use crate::http::{Backend, Serving};
use crate::wire::{Envelope, WireError};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::watch;

impl Backend for Daemon {
    fn ask(self: Arc<Self>, envelope: Envelope) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send>> {
        Box::pin(async move {
            let token = self.new_token();
            let answer = self.dispatch(envelope, token).await;
            // What the strip shows reaches a person, not the agent: an end a reply of
            // its own showed (a `read` of an ended job) is still the agent's notice.
            self.release(token, &answer.deliver);
            answer.line
        })
    }

    fn changes(&self) -> watch::Receiver<u64> {
        Daemon::changes(self)
    }

    fn output_changes(&self, session: &str, id: &str) -> Result<watch::Receiver<()>, WireError> {
        Daemon::output_changes(self, session, id)
    }

    fn shutdown_signal(&self) -> watch::Receiver<bool> {
        Daemon::shutdown_signal(self)
    }

    fn home(&self) -> &Path {
        &self.paths.home
    }

    fn serving(&self) -> &tokio::sync::Mutex<Option<Serving>> {
        &self.http
    }
}

impl Daemon {
    /// The daemon as the strip sees it.
    pub(crate) fn backend(self: &Arc<Self>) -> Arc<dyn Backend> {
        self.clone()
    }
}
