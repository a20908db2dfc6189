//! Jobs' output as readers see it: read, grep, the line scanner of waits and monitors, who watches which output (and the pace of its supervisor), panes' screens.

pub(crate) mod grep;
pub(crate) mod pane;
pub(crate) mod read;
pub(crate) mod scan;
pub(crate) mod watchers;
