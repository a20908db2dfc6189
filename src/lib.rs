//! bgwork: background work for AI agents — start now, read later, hear when it ends.
//!
//! Three kinds of process share this library: the CLI (and other front ends) in
//! [`cli`] and [`client`], the daemon in [`daemon`], and one supervisor per job in
//! [`supervisor`]. ARCHITECTURE.md maps the modules and the rules between them.

/// Writes a line to stderr (the daemon's or a supervisor's log), ignoring failure: a
/// full disk must never take a daemon or a supervisor down (`eprintln!` would panic).
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod cli;
pub mod client;
pub mod daemon;
pub mod delivery;
pub mod end;
pub mod environ;
pub mod executor;
pub mod harness;
pub mod history;
pub mod hook;
pub mod http;
pub mod job_dir;
pub mod keeper;
pub mod keys;
pub mod mcp;
pub mod observe;
pub mod output;
pub mod paths;
pub mod redact;
pub mod rendered;
pub mod store;
pub mod supervisor;
pub mod wire;
