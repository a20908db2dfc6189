//! `Config`: the daemon's limits and policies (contract §5, §6), with their defaults.
//!
//! Each can be changed by an environment variable of the daemon's process, read once
//! at start (`BGWORK_MAX_RUNNING=1000 bgwork daemon` for a benchmark, say).

use std::time::Duration;

/// The largest value (seconds) taken for a timing policy of the run history: a day.
const MAX_POLICY_S: f64 = 86_400.0;

#[derive(Debug, Clone)]
pub struct Config {
    /// Running jobs, panes and monitors of this machine per session.
    pub max_running: usize,
    /// Jobs on Slurm (queued or running) per session (`BGWORK_MAX_SLURM`), counted
    /// apart from `max_running` in every admission (`admission.rs`): the cluster runs
    /// them.
    pub max_slurm: usize,
    /// Running items of every session together (`BGWORK_MAX_RUNNING_TOTAL`; 0: no cap).
    /// Unless set, it is at least `max_running`, so that raising the per-session limit
    /// alone is not undone by it.
    pub max_running_total: usize,
    /// Starts per session (with its sub-agents) in any minute
    /// (`BGWORK_MAX_STARTS_PER_MINUTE`; 0: no guard).
    pub max_starts_per_minute: usize,
    /// Bytes of output kept per job: the first `log_head` and the newest rest.
    pub log_cap: u64,
    pub log_head: u64,
    /// How long leftover processes of a job whose main process ended get after TERM.
    pub linger_grace: Duration,
    /// How long ended records stay before `gc` removes them.
    pub retain: Duration,
    /// Total log bytes of ended records that `gc` keeps.
    pub gc_total_bytes: u64,
    /// The initial-output window of `start` when the caller gives none.
    pub default_window: Duration,
    /// Whether each job gets a cgroup of its own where the kernel allows one
    /// (`BGWORK_CGROUPS=0` turns them off).
    pub cgroups: bool,
    /// Client connections served at once; none: 512, or fewer when the daemon's file
    /// descriptor limit is low (`BGWORK_MAX_CONNECTIONS` sets it exactly).
    pub max_connections: Option<usize>,
    /// A connection with no request in flight (and no notice awaiting its `ack`) is
    /// closed after this long.
    pub idle_timeout: Duration,
    /// A client that accepts no byte of a reply for this long is dropped.
    pub write_stall: Duration,
    /// Whether `list`, `read` and MCP results look for the TCP ports jobs listen on
    /// (`BGWORK_PORTS=0` turns it off).
    pub ports: bool,
    /// The usual time past which `run --timeout auto` backgrounds a command at once
    /// (`BGWORK_AUTO_BACKGROUND_S`, seconds, fractions allowed).
    pub auto_background: Duration,
    /// How much longer than its usual time a job runs, at least, before its
    /// running-long notice (`BGWORK_OVERRUN_MARGIN_S`, seconds; beside 3× the usual).
    pub overrun_margin: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_running: 10,
            max_slurm: 50,
            max_running_total: 64,
            max_starts_per_minute: 60,
            log_cap: 256 << 20,
            log_head: 1 << 20,
            linger_grace: Duration::from_secs(2),
            retain: Duration::from_secs(24 * 3600),
            gc_total_bytes: 1 << 30,
            default_window: Duration::from_millis(1000),
            cgroups: true,
            max_connections: None,
            idle_timeout: Duration::from_secs(300),
            write_stall: Duration::from_secs(30),
            ports: true,
            auto_background: super::history::AUTO_BACKGROUND,
            overrun_margin: Duration::from_secs(60),
        }
    }
}

impl Config {
    /// The defaults, overridden by `BGWORK_*` variables where set and valid.
    pub fn from_env() -> Config {
        let mut config = Config::default();
        let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        if let Some(n) = number("BGWORK_MAX_RUNNING") {
            config.max_running = n as usize;
        }
        if let Some(n) = number("BGWORK_MAX_SLURM") {
            config.max_slurm = n as usize;
        }
        match number("BGWORK_MAX_RUNNING_TOTAL") {
            Some(n) => config.max_running_total = n as usize,
            None => config.max_running_total = config.max_running_total.max(config.max_running),
        }
        if let Some(n) = number("BGWORK_MAX_STARTS_PER_MINUTE") {
            config.max_starts_per_minute = n as usize;
        }
        if let Some(n) = number("BGWORK_LOG_CAP") {
            config.log_cap = n.max(1 << 16);
        }
        if let Some(n) = number("BGWORK_LOG_HEAD") {
            config.log_head = n;
        }
        config.log_head = config.log_head.min(config.log_cap / 2);
        if let Some(n) = number("BGWORK_LINGER_MS") {
            config.linger_grace = Duration::from_millis(n);
        }
        if let Some(n) = number("BGWORK_RETAIN_S") {
            config.retain = Duration::from_secs(n);
        }
        if let Some(n) = number("BGWORK_GC_TOTAL_BYTES") {
            config.gc_total_bytes = n;
        }
        if number("BGWORK_CGROUPS") == Some(0) {
            config.cgroups = false;
        }
        if let Some(n) = number("BGWORK_MAX_CONNECTIONS") {
            config.max_connections = Some((n as usize).max(1));
        }
        if let Some(n) = number("BGWORK_IDLE_TIMEOUT_MS") {
            config.idle_timeout = Duration::from_millis(n.max(1));
        }
        if let Some(n) = number("BGWORK_WRITE_STALL_MS") {
            config.write_stall = Duration::from_millis(n.max(1));
        }
        if number("BGWORK_PORTS") == Some(0) {
            config.ports = false;
        }
        let seconds = std::env::var("BGWORK_AUTO_BACKGROUND_S")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .and_then(|s| Duration::try_from_secs_f64(s.min(MAX_POLICY_S)).ok());
        if let Some(threshold) = seconds {
            config.auto_background = threshold;
        }
        if let Some(n) = number("BGWORK_OVERRUN_MARGIN_S") {
            config.overrun_margin = Duration::from_secs_f64((n as f64).min(MAX_POLICY_S));
        }
        config
    }
}
