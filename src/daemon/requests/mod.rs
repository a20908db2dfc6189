//! The requests of clients, one file per family: start, stop, send, run, restart, wait, and the records as items (list, dismiss, gc, status).

pub(crate) mod items;
pub(crate) mod restart;
pub(crate) mod run;
pub(crate) mod send;
pub(crate) mod start;
pub(crate) mod stop;
pub(crate) mod wait;
