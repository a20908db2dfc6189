//! The glue to the executors: applying their events and settling ends, a sub-agent's report.

pub(crate) mod after;
pub(crate) mod held_values;
pub(crate) mod job_watch;
pub(crate) mod new_item;
pub(crate) mod port_in_use;
pub(crate) mod report;
pub(crate) mod restart_policy;
pub(crate) mod settle;
