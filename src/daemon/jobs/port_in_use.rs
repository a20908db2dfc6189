//! The one notice of a port already in use by a running job: an error line of its
//! output that says a port is in use (`in_use_line`, `ports_in`: the port and the
//! address it names), matched by address and port against what listens
//! (`conflicts`), and the item, pid or uid that holds it (`holder_of`).

use crate::daemon::processes::observable;
use crate::daemon::Daemon;
use crate::observe;
use crate::store::Record;
use regex::Regex;
use std::path::Path;
use std::sync::OnceLock;

/// The first line of `bytes` that says an address is in use, as a reader is shown it
/// (the phrase is looked for in that text, like every matcher: see
/// `scan::reader_text`).
pub(super) fn in_use_line(bytes: &[u8]) -> Option<String> {
    static PATTERN: OnceLock<regex::bytes::Regex> = OnceLock::new();
    let pattern = PATTERN.get_or_init(|| {
        regex::bytes::Regex::new(r"(?i)EADDRINUSE|address already in use").expect("a valid pattern")
    });
    // Plain text that does not hold the phrase cannot show it (masking adds none).
    if !crate::rendered::maybe_controls(bytes, true) && !pattern.is_match(bytes) {
        return None;
    }
    let mut in_key = false;
    let mut lines = bytes.split(|&b| b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let edge = match lines.peek() {
            Some(_) => crate::daemon::output::scan::Edge::Whole,
            None => crate::daemon::output::scan::Edge::Open,
        };
        let text = crate::daemon::output::scan::reader_text(line, edge, in_key);
        in_key = crate::redact::private_key_open_after(line, in_key);
        match text {
            Some(text) if pattern.is_match(text.as_bytes()) => {
                return Some(text.chars().take(500).collect());
            }
            _ => {}
        }
    }
    None
}

/// A port a line names, with the address it names it on (none: any address, as in
/// `:8080` or `port 5173`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Named {
    port: u16,
    /// The addresses meant (`localhost` means both loopbacks).
    on: Option<Vec<std::net::IpAddr>>,
}

/// Ports a line names (`127.0.0.1:3000`, `[::1]:3000`, `:::3000`, `:8080`, `port
/// 3000`), the last first. A number after a colon counts only when what comes before
/// the colon is an address, a host name or nothing: `07:15:29,411` is a time of day.
pub(super) fn ports_in(line: &str) -> Option<Vec<Named>> {
    static WORDS: OnceLock<Regex> = OnceLock::new();
    static COLON: OnceLock<Regex> = OnceLock::new();
    let words = WORDS
        .get_or_init(|| Regex::new(r"(?i)\bport\s*:?\s*(\d{1,5})\b").expect("a valid pattern"));
    let colon = COLON.get_or_init(|| {
        Regex::new(r"([0-9A-Za-z.:\[\]*_-]*):(\d{1,5})\b").expect("a valid pattern")
    });
    let mut found: Vec<(usize, Named)> = Vec::new();
    for c in words.captures_iter(line) {
        if let Some(port) = c.get(1).and_then(|p| p.as_str().parse().ok()) {
            found.push((c.get(0).map_or(0, |m| m.start()), Named { port, on: None }));
        }
    }
    for c in colon.captures_iter(line) {
        let (Some(before), Some(port)) = (c.get(1), c.get(2)) else {
            continue;
        };
        // A number followed by `.`, `,` or `:` and a digit is a time or a figure.
        let after = &line[port.end()..];
        let mut rest = after.chars();
        if matches!((rest.next(), rest.next()), (Some('.' | ',' | ':'), Some(d)) if d.is_ascii_digit())
        {
            continue;
        }
        let Ok(port) = port.as_str().parse::<u16>() else {
            continue;
        };
        if let Some(on) = address_before(before.as_str()) {
            found.push((before.start(), Named { port, on }));
        }
    }
    found.retain(|(_, named)| named.port > 0);
    found.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    let ports: Vec<Named> = found.into_iter().map(|(_, named)| named).collect();
    (!ports.is_empty()).then_some(ports)
}

/// What the text before a `:PORT` names: `Some(None)` any address (nothing, `*`, a host
/// name), `Some(Some(addresses))` an address, `None` no address at all (`07:15`).
pub(super) fn address_before(text: &str) -> Option<Option<Vec<std::net::IpAddr>>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let text = text.trim_start_matches(['(', '\'', '"']);
    if text.is_empty() || text == "*" {
        return Some(None);
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return inner
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| Some(vec![IpAddr::V6(ip)]));
    }
    // Node's `:::3000`: the address `::` before the port's colon.
    if text == "::" || text == ":" {
        return Some(Some(vec![IpAddr::V6(Ipv6Addr::UNSPECIFIED)]));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(Some(vec![ip]));
    }
    if text.eq_ignore_ascii_case("localhost") {
        return Some(Some(vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ]));
    }
    // A host name has a letter and no colon; digits alone (`07`) or a time are none.
    let host = !text.contains(':') && text.chars().any(|c| c.is_ascii_alphabetic());
    host.then_some(None)
}

/// Whether a bind to `named` fails because of a socket listening on `listening`: the
/// same address, or a wildcard on either side (IPv6's `::` takes IPv4 too).
pub(super) fn conflicts(named: &Named, listening: std::net::SocketAddr) -> bool {
    use std::net::IpAddr;
    if listening.port() != named.port {
        return false;
    }
    let Some(on) = &named.on else {
        return true;
    };
    let plain = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let held = plain(listening.ip());
    on.iter().any(|&ip| {
        let ip = plain(ip);
        ip == held
            || (held.is_unspecified() && (held.is_ipv6() || ip.is_ipv4()))
            || (ip.is_unspecified() && (ip.is_ipv6() || held.is_ipv4()))
    })
}

/// Numbers in a command that some process listens on (`http.server 8000`), for an
/// error line that names no port.
pub(super) fn listened_ports_in(command: &str) -> Vec<u16> {
    let listening: std::collections::HashSet<u16> = observe::listeners()
        .iter()
        .map(|l| l.address.port())
        .collect();
    command
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u16>().ok())
        .filter(|p| listening.contains(p))
        .collect()
}

/// Who listens where a bind to `named` fails: an item of this daemon (any session; not `own`), else a pid
/// and its name, else the uid of a process bgwork cannot look into.
pub(super) fn holder_of(named: &Named, own: i64, running: &[Record]) -> Option<String> {
    let listeners: Vec<observe::Listener> = observe::listeners()
        .into_iter()
        .filter(|l| conflicts(named, l.address))
        .collect();
    let first = listeners.first()?;
    let inodes: std::collections::HashSet<u64> = listeners.iter().map(|l| l.inode).collect();
    // The job's own processes first (a second bind of its own), then other items.
    let own_first = running
        .iter()
        .filter(|r| r.row == own)
        .chain(running.iter().filter(|r| r.row != own && observable(r)));
    for record in own_first {
        let pids = crate::supervisor::tree::job_pids(Path::new(&record.job_dir));
        let holder = pids.iter().find(|&&pid| {
            observe::socket_inodes(pid)
                .iter()
                .any(|i| inodes.contains(i))
        });
        match holder {
            Some(pid) if record.row == own => {
                return Some(format!("its own process {pid} (it binds the port twice)"))
            }
            Some(_) => {
                return Some(format!(
                    "{} of session {} (`{}`)",
                    record.id,
                    record.session,
                    // Another session's command may hold a token its agent wrote.
                    short(&crate::redact::mask_shapes(record.command.clone()))
                ));
            }
            None => {}
        }
    }
    if let Some(pid) = observe::pid_holding(&inodes) {
        if pid == std::process::id() as i32 {
            return Some(format!("this bgwork daemon (pid {pid})"));
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        return Some(format!(
            "pid {pid} ({}), which is not bgwork work",
            name.trim()
        ));
    }
    let me = nix::unistd::geteuid().as_raw();
    Some(match first.uid == me {
        true => format!("a process bgwork cannot see ({})", first.address),
        false => format!(
            "a process of another user (uid {}, {})",
            first.uid, first.address
        ),
    })
}

pub(super) fn short(command: &str) -> String {
    let mut text: String = command.chars().take(60).collect();
    if text.len() < command.len() {
        text.push('…');
    }
    text
}

impl Daemon {
    /// A line of `record`'s output says a port is in use: one notice (per job) naming
    /// who holds it.
    pub(super) async fn port_in_use(&self, record: &Record, line: String) {
        let key = format!("addrinuse:{}", record.row);
        let twins = self
            .lock()
            .store
            .list_every_session(false)
            .unwrap_or_default();
        let own = record.row;
        let command = record.command.clone();
        let holder = tokio::task::spawn_blocking(move || {
            let ports = ports_in(&line).unwrap_or_else(|| {
                let ports = listened_ports_in(&command).into_iter();
                ports.map(|port| Named { port, on: None }).collect()
            });
            let found = ports
                .iter()
                .find_map(|named| holder_of(named, own, &twins).map(|h| (named.port, h)));
            let ports: Vec<u16> = ports.iter().map(|named| named.port).collect();
            (line, ports, found)
        })
        .await;
        let Ok((line, ports, found)) = holder else {
            return;
        };
        let text = match (found, ports.first()) {
            (Some((port, holder)), _) => {
                format!("{}: port {port} is already in use, held by {holder}", record.id)
            }
            (None, Some(port)) => format!(
                "{}: port {port} is already in use (nothing listens on it now: it may be free again)",
                record.id
            ),
            (None, None) => format!(
                "{}: an address is already in use (its output names no port bgwork could find)",
                record.id
            ),
        };
        let added = self
            .lock()
            .store
            .add_event_notice(record.row, &key, &text, &line);
        match added {
            Ok(true) => self.records_changed(),
            Ok(false) => {}
            Err(e) => crate::note!("bgwork daemon: could not record a port notice: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_named_by_error_lines() {
        let first = |line: &str| ports_in(line).map(|p| p[0].port);
        let node = "Error: listen EADDRINUSE: address already in use :::3000";
        assert_eq!(first(node), Some(3000));
        let go = "listen tcp 127.0.0.1:8080: bind: address already in use";
        assert_eq!(first(go), Some(8080));
        assert_eq!(
            first("listen tcp :8080: bind: address already in use"),
            Some(8080)
        );
        let words = "OSError: [Errno 98] Address already in use (port 5173)";
        assert_eq!(first(words), Some(5173));
        assert_eq!(ports_in("OSError: [Errno 98] Address already in use"), None);
        let logged = "07:15:29,411 ERROR [Errno 98] Address already in use";
        assert_eq!(ports_in(logged), None);
        let both = "2026-12-01 07:15:29.411 bind [::1]:18960 failed: address already in use";
        let named = ports_in(both).unwrap();
        assert_eq!(named.len(), 1, "{named:?}");
        let v6: std::net::SocketAddr = "[::1]:18960".parse().unwrap();
        let v4: std::net::SocketAddr = "127.0.0.1:18960".parse().unwrap();
        let any: std::net::SocketAddr = "0.0.0.0:18960".parse().unwrap();
        assert!(conflicts(&named[0], v6) && !conflicts(&named[0], v4));
        let loopback4 = &ports_in("bind 127.0.0.1:18960: in use").unwrap()[0];
        assert!(conflicts(loopback4, v4) && conflicts(loopback4, any) && !conflicts(loopback4, v6));
        assert!(conflicts(&first_named("localhost:18960"), v6));
        assert!(in_use_line(b"ok\nlisten EADDRINUSE :::3000\nmore")
            .is_some_and(|l| l == "listen EADDRINUSE :::3000"));
    }

    fn first_named(line: &str) -> Named {
        ports_in(line).unwrap().remove(0)
    }
}
