//! `Config`: the daemon's limits and policies (contract §5, §6), with their defaults.
//!
//! Each can be changed by an environment variable of the daemon's process, read once
//! at start (`BGWORK_MAX_RUNNING=1000 bgwork daemon` for a benchmark, say).

use std::time::Duration;

/// Past this usual time (`BGWORK_AUTO_BACKGROUND_S`), `run --timeout auto` backgrounds
/// the command at once: waiting on it costs more than backgrounding does.
pub const AUTO_BACKGROUND: Duration = Duration::from_secs(15);
/// The largest value (seconds) taken for a timing policy of the run history: a day.
const MAX_POLICY_S: f64 = 86_400.0;

#[derive(Debug, Clone)]
pub struct Config {
    /// Running jobs, panes and monitors of this machine per session.
    pub max_running: usize,
    /// Jobs on Slurm (queued or running) per session (`BGWORK_MAX_SLURM`), counted
    /// apart from `max_running` in every admission (`admission/mod.rs`): the cluster runs
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
    /// The daemon ends on its own once it has had no unsettled item and no client
    /// connection for this long (`BGWORK_EXIT_WHEN_IDLE_MS`; none: never). A host's
    /// daemon is started with it by the ssh relay.
    pub exit_when_idle: Option<Duration>,
    /// Whether `list`, `read` and MCP results look for the TCP ports jobs listen on
    /// (`BGWORK_PORTS=0` turns it off).
    pub ports: bool,
    /// The usual time past which `run --timeout auto` backgrounds a command at once
    /// (`BGWORK_AUTO_BACKGROUND_S`, seconds, fractions allowed).
    pub auto_background: Duration,
    /// How much longer than its usual time a job runs, at least, before its
    /// running-long notice (`BGWORK_OVERRUN_MARGIN_S`, seconds; beside 3× the usual).
    pub overrun_margin: Duration,
    /// What was wrong with the `BGWORK_*` settings given (a value that is not a number,
    /// or one taken as a nearer bound), one sentence each: said in the daemon's log at
    /// start and in `status`.
    pub refused: Vec<String>,
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
            exit_when_idle: None,
            ports: true,
            auto_background: AUTO_BACKGROUND,
            overrun_margin: Duration::from_secs(60),
            refused: Vec::new(),
        }
    }
}

/// Reads the `BGWORK_*` settings, keeping a sentence for each one it could not take as
/// given.
struct Settings {
    refused: Vec<String>,
}

impl Settings {
    /// A whole number of at least `min`, or none (unset, or said in `refused`).
    fn number(&mut self, name: &str, default: impl std::fmt::Display, min: u64) -> Option<u64> {
        let text = std::env::var(name).ok()?;
        match text.trim().parse::<u64>() {
            Ok(n) if n >= min => Some(n),
            Ok(_) => {
                self.refused.push(format!(
                    "{name}={text:?} is below its least value {min}: {min} is used"
                ));
                Some(min)
            }
            Err(_) => {
                self.refused.push(format!(
                    "{name}={text:?} is not a whole number of at least {min}: the default \
                     {default} is used"
                ));
                None
            }
        }
    }

    /// A switch: `0` turns it off, `1` leaves it on.
    fn switch(&mut self, name: &str) -> bool {
        match std::env::var(name).ok().as_deref().map(str::trim) {
            None | Some("1") => true,
            Some("0") => false,
            Some(other) => {
                self.refused.push(format!(
                    "{name}={other:?} is neither 0 (off) nor 1 (on): it stays on"
                ));
                true
            }
        }
    }

    /// Seconds (fractions allowed) from 0 to [`MAX_POLICY_S`], or none.
    fn seconds(&mut self, name: &str, default: Duration) -> Option<Duration> {
        let text = std::env::var(name).ok()?;
        match text.trim().parse::<f64>() {
            Ok(s) if (0.0..=MAX_POLICY_S).contains(&s) => Duration::try_from_secs_f64(s).ok(),
            Ok(s) if s > MAX_POLICY_S => {
                self.refused.push(format!(
                    "{name}={text:?} is over a day: {MAX_POLICY_S} s is used"
                ));
                Some(Duration::from_secs_f64(MAX_POLICY_S))
            }
            _ => {
                self.refused.push(format!(
                    "{name}={text:?} is not a number of seconds from 0 to {MAX_POLICY_S}: \
                     the default {} s is used",
                    default.as_secs_f64()
                ));
                None
            }
        }
    }
}

impl Config {
    /// The defaults, overridden by `BGWORK_*` variables where set; a value that cannot
    /// be taken as given is said in [`Config::refused`].
    pub fn from_env() -> Config {
        let mut config = Config::default();
        let mut settings = Settings {
            refused: Vec::new(),
        };
        let s = &mut settings;
        if let Some(n) = s.number("BGWORK_MAX_RUNNING", config.max_running, 0) {
            config.max_running = n as usize;
        }
        if let Some(n) = s.number("BGWORK_MAX_SLURM", config.max_slurm, 0) {
            config.max_slurm = n as usize;
        }
        match s.number("BGWORK_MAX_RUNNING_TOTAL", config.max_running_total, 0) {
            Some(n) => config.max_running_total = n as usize,
            None => config.max_running_total = config.max_running_total.max(config.max_running),
        }
        if let Some(n) = s.number(
            "BGWORK_MAX_STARTS_PER_MINUTE",
            config.max_starts_per_minute,
            0,
        ) {
            config.max_starts_per_minute = n as usize;
        }
        if let Some(n) = s.number("BGWORK_LOG_CAP", config.log_cap, 1 << 16) {
            config.log_cap = n;
        }
        if let Some(n) = s.number("BGWORK_LOG_HEAD", config.log_head, 0) {
            config.log_head = n;
        }
        if config.log_head > config.log_cap / 2 {
            if std::env::var_os("BGWORK_LOG_HEAD").is_some() {
                s.refused.push(format!(
                    "BGWORK_LOG_HEAD={} is over half the log's cap: {} is used",
                    config.log_head,
                    config.log_cap / 2
                ));
            }
            config.log_head = config.log_cap / 2;
        }
        if let Some(n) = s.number("BGWORK_LINGER_MS", config.linger_grace.as_millis(), 0) {
            config.linger_grace = Duration::from_millis(n);
        }
        if let Some(n) = s.number("BGWORK_RETAIN_S", config.retain.as_secs(), 0) {
            config.retain = Duration::from_secs(n);
        }
        if let Some(n) = s.number("BGWORK_GC_TOTAL_BYTES", config.gc_total_bytes, 0) {
            config.gc_total_bytes = n;
        }
        config.cgroups = s.switch("BGWORK_CGROUPS");
        if let Some(n) = s.number("BGWORK_MAX_CONNECTIONS", "512", 1) {
            config.max_connections = Some(n as usize);
        }
        let idle = config.idle_timeout.as_millis();
        if let Some(n) = s.number("BGWORK_IDLE_TIMEOUT_MS", idle, 1) {
            config.idle_timeout = Duration::from_millis(n);
        }
        let stall = config.write_stall.as_millis();
        if let Some(n) = s.number("BGWORK_WRITE_STALL_MS", stall, 1) {
            config.write_stall = Duration::from_millis(n);
        }
        if let Some(n) = s.number("BGWORK_EXIT_WHEN_IDLE_MS", "never", 100) {
            config.exit_when_idle = Some(Duration::from_millis(n));
        }
        config.ports = s.switch("BGWORK_PORTS");
        if let Some(threshold) = s.seconds("BGWORK_AUTO_BACKGROUND_S", config.auto_background) {
            config.auto_background = threshold;
        }
        if let Some(margin) = s.seconds("BGWORK_OVERRUN_MARGIN_S", config.overrun_margin) {
            config.overrun_margin = margin;
        }
        config.refused = settings.refused;
        config
    }
}
