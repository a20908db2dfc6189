//! One integration-test binary: every test drives the real `bgwork` binary against a
//! real daemon in a temporary `BGWORK_HOME`.

mod conformance;
mod core_load;
mod delivery;
mod ends;
mod faults;
mod harness_hooks;
mod history;
mod hostile;
mod hostile15;
mod house;
mod issue22;
mod issue25;
mod mcp;
mod mcp_hostile;
mod monitors;
mod monitors_hostile;
mod observe;
mod output;
mod panes;
mod panes_hostile;
mod restart;
mod search;
mod secrets;
mod secrets22;
mod secrets_rendered;
mod security;
mod security_hostile;
mod sessions;
mod slurm;
mod ssh;
mod stop;
mod strip;
mod surface;
mod util;
mod wait;
