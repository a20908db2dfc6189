//! One integration-test binary: every test drives the real `bgwork` binary against a
//! real daemon in a temporary `BGWORK_HOME`.

mod ends;
mod faults;
mod hostile;
mod mcp;
mod mcp_hostile;
mod monitors;
mod output;
mod panes;
mod restart;
mod security;
mod sessions;
mod stop;
mod surface;
mod util;
mod wait;
