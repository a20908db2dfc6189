//! What bgwork learns by looking at a job's processes in `/proc`: CPU time, memory and
//! the TCP ports they listen on. Read only; nothing here signals or changes a process.
//!
//! How it works: a job's processes are the descendants of its supervisor (found by
//! `supervisor::tree::job_pids` from the `processes` record of its folder, checked
//! against the supervisor's start time so a reused pid is never taken for it). CPU time is `utime + stime` of each process
//! (`/proc/PID/stat`, threads included), memory the sum of their resident sets
//! (`/proc/PID/statm`; pages shared between processes count once per process, as `ps`
//! adds them). Ports: the socket inodes in each process's `fd/` folder, looked up in the
//! LISTEN rows of `/proc/net/tcp` and `tcp6`, which are read once per question however
//! many jobs it asks about. A process that exits while it is read simply drops out.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::BufRead;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// CPU time and resident memory of a set of processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ms: u64,
    pub rss_bytes: u64,
}

/// The most listening addresses shown for one job (the lowest ports).
pub const MAX_LISTENING: usize = 32;

/// What one look at a job's processes found.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub usage: Usage,
    /// Listening addresses, e.g. `127.0.0.1:5173`, `[::]:8000`, sorted by port.
    pub listening: Vec<String>,
}

/// A process (of those this user may look into) that holds one of the sockets
/// `inodes`.
pub fn pid_holding(inodes: &HashSet<u64>) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .find(|&pid| socket_inodes(pid).iter().any(|i| inodes.contains(i)))
}

/// CPU time and resident memory of `pids` together.
pub fn usage(pids: &[i32]) -> Usage {
    let mut total = Usage::default();
    for &pid in pids {
        if let Some(one) = usage_of(pid) {
            total.cpu_ms += one.cpu_ms;
            total.rss_bytes += one.rss_bytes;
        }
    }
    total
}

fn usage_of(pid: i32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the name (which may hold spaces and parens): field 3 (state) onwards, so
    // utime (field 14) and stime (15) are the 12th and 13th.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm
        .split(' ')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    Some(Usage {
        cpu_ms: (utime + stime) * 1000 / ticks_per_second(),
        rss_bytes: pages * page_size(),
    })
}

/// The state letter of a process (`R`, `S`, `D`, …) from `/proc/PID/stat`.
pub fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.get(stat.rfind(')')? + 2..)?.chars().next()
}

/// The process group in the foreground of `pid`'s terminal (`tpgid`), if it has one.
pub fn terminal_foreground(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    let tpgid: i32 = fields.get(5)?.parse().ok()?;
    (tpgid > 0).then_some(tpgid)
}

/// The process group of `pid`.
pub fn group_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    fields.get(2)?.parse().ok()
}

/// The inodes of the sockets `pid` holds open (`/proc/PID/fd/N -> socket:[INODE]`).
pub fn socket_inodes(pid: i32) -> Vec<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let text = target.to_str()?;
            text.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// One listening TCP socket of `/proc/net/tcp{,6}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    pub address: SocketAddr,
    pub uid: u32,
    pub inode: u64,
}

/// Every listening TCP socket of this network namespace (IPv4 and IPv6): asked of the
/// kernel by netlink (`sock_diag`, which filters on the LISTEN state itself, so a host
/// with a hundred thousand connections costs no more than one with ten), else read
/// from `/proc/net/tcp{,6}`.
pub fn listeners() -> Vec<Listener> {
    let (v4, v6) = (
        diag::listeners(nix::libc::AF_INET as u8),
        diag::listeners(nix::libc::AF_INET6 as u8),
    );
    match (v4, v6) {
        (Some(mut v4), Some(v6)) => {
            v4.extend(v6);
            v4
        }
        _ => listeners_from_proc(),
    }
}

/// [`listeners`] from the text tables of `/proc/net`.
pub fn listeners_from_proc() -> Vec<Listener> {
    let mut found = Vec::new();
    for (path, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(file) = std::fs::File::open(path) else {
            continue;
        };
        let mut reader = std::io::BufReader::with_capacity(256 << 10, file);
        let mut line = String::new();
        while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            if let Some(listener) = parse_row(&line, v6) {
                found.push(listener);
            }
            line.clear();
        }
    }
    found
}

/// A LISTEN row of `/proc/net/tcp` (`sl local rem st … uid timeout inode`); none for
/// any other row or the header.
fn parse_row(line: &str, v6: bool) -> Option<Listener> {
    let mut fields = line.split_ascii_whitespace();
    let local = fields.nth(1)?;
    if fields.nth(1)? != "0A" {
        return None;
    }
    let uid = fields.nth(3)?.parse().ok()?;
    let inode = fields.nth(1)?.parse().ok()?;
    let (host, port) = local.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match v6 {
        false => IpAddr::V4(Ipv4Addr::from(word(host)?)),
        true => {
            if host.len() != 32 {
                return None;
            }
            let mut bytes = [0u8; 16];
            for (index, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(host.get(index * 8..index * 8 + 8)?)?);
            }
            let ip = Ipv6Addr::from(bytes);
            // An IPv4 address on an IPv6 socket (`::ffff:127.0.0.1`) is shown as IPv4.
            ip.to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(ip))
        }
    };
    Some(Listener {
        address: SocketAddr::new(ip, port),
        uid,
        inode,
    })
}

/// Eight hex digits the kernel printed from a 32-bit word in memory order.
fn word(hex: &str) -> Option<[u8; 4]> {
    (hex.len() == 8)
        .then(|| u32::from_str_radix(hex, 16).ok())
        .flatten()
        .map(u32::to_ne_bytes)
}

/// The kernel's socket-diagnostics interface (netlink `NETLINK_SOCK_DIAG`): listening
/// TCP sockets of one address family, as the messages `ss -ltn` reads.
mod diag {
    use super::Listener;
    use nix::sys::socket::{
        recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
        SockType,
    };
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const TCP_LISTEN: u32 = 10;
    const HEADER: usize = 16;
    /// `inet_diag_msg`: family, state, timer, retrans, the 48-byte socket id, then
    /// expires, rqueue, wqueue, uid and inode.
    const MESSAGE: usize = 72;

    /// None when the kernel does not answer (no netlink here, or a reply not understood).
    pub fn listeners(family: u8) -> Option<Vec<Listener>> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )
        .ok()?;
        use std::os::fd::AsRawFd;
        let timeout = nix::sys::time::TimeVal::new(2, 0);
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .ok()?;
        let mut request = Vec::with_capacity(HEADER + 56);
        request.extend_from_slice(&((HEADER + 56) as u32).to_ne_bytes());
        request.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        let flags = (nix::libc::NLM_F_REQUEST | nix::libc::NLM_F_DUMP) as u16;
        request.extend_from_slice(&flags.to_ne_bytes());
        request.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        request.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
        request.push(family);
        request.push(nix::libc::IPPROTO_TCP as u8);
        request.extend_from_slice(&[0, 0]); // no extensions, padding
        request.extend_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
        request.extend_from_slice(&[0u8; 48]); // any socket id
        sendto(
            fd.as_raw_fd(),
            &request,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .ok()?;
        let mut found = Vec::new();
        let mut buffer = vec![0u8; 64 << 10];
        loop {
            let n = recv(fd.as_raw_fd(), &mut buffer, MsgFlags::empty()).ok()?;
            if n == 0 {
                return None;
            }
            let mut at = 0;
            while at + HEADER <= n {
                let len = u32::from_ne_bytes(buffer[at..at + 4].try_into().ok()?) as usize;
                let kind = u16::from_ne_bytes(buffer[at + 4..at + 6].try_into().ok()?);
                if len < HEADER || at + len > n {
                    return None;
                }
                match kind {
                    NLMSG_DONE => return Some(found),
                    NLMSG_ERROR => return None,
                    _ => {
                        if let Some(listener) = parse(&buffer[at + HEADER..at + len], family) {
                            found.push(listener);
                        }
                    }
                }
                at += (len + 3) & !3;
            }
        }
    }

    fn parse(message: &[u8], family: u8) -> Option<Listener> {
        if message.len() < MESSAGE || message[1] as u32 != TCP_LISTEN {
            return None;
        }
        let port = u16::from_be_bytes(message[4..6].try_into().ok()?);
        let source = &message[8..24];
        let ip = match family as i32 {
            nix::libc::AF_INET => {
                IpAddr::V4(Ipv4Addr::new(source[0], source[1], source[2], source[3]))
            }
            _ => {
                let ip = Ipv6Addr::from(<[u8; 16]>::try_from(source).ok()?);
                ip.to_ipv4_mapped()
                    .map(IpAddr::V4)
                    .unwrap_or(IpAddr::V6(ip))
            }
        };
        let word = |at: usize| message[at..at + 4].try_into().ok().map(u32::from_ne_bytes);
        Some(Listener {
            address: SocketAddr::new(ip, port),
            uid: word(64)?,
            inode: word(68)? as u64,
        })
    }
}

/// What each job's processes use and listen on, for many jobs at once: the socket
/// tables are read once (and only when some process holds a socket).
pub fn observe_jobs(jobs: &[Vec<i32>], ports: bool) -> Vec<Observed> {
    let inodes: Vec<HashSet<u64>> = jobs
        .iter()
        .map(|pids| match ports {
            true => pids.iter().flat_map(|&pid| socket_inodes(pid)).collect(),
            false => HashSet::new(),
        })
        .collect();
    let table: HashMap<u64, SocketAddr> = if inodes.iter().any(|set| !set.is_empty()) {
        listeners()
            .into_iter()
            .map(|l| (l.inode, l.address))
            .collect()
    } else {
        HashMap::new()
    };
    jobs.iter()
        .zip(inodes)
        .map(|(pids, inodes)| {
            let addresses: BTreeSet<(u16, String)> = inodes
                .iter()
                .filter_map(|inode| table.get(inode))
                .map(|address| (address.port(), address.to_string()))
                .collect();
            Observed {
                usage: usage(pids),
                listening: addresses
                    .into_iter()
                    .take(MAX_LISTENING)
                    .map(|(_, text)| text)
                    .collect(),
            }
        })
        .collect()
}

/// The URL a browser opens for a listening address: a wildcard address is reached on
/// `localhost`.
pub fn url_of(listening: &str) -> String {
    let Ok(address) = listening.parse::<SocketAddr>() else {
        return format!("http://{listening}/");
    };
    match address.ip().is_unspecified() {
        true => format!("http://localhost:{}/", address.port()),
        false => format!("http://{address}/"),
    }
}

/// `127.0.0.1:5173 → http://127.0.0.1:5173/, …` for a list of listening addresses.
pub fn describe_listening(listening: &[String]) -> String {
    listening
        .iter()
        .map(|address| format!("{address} → {}", url_of(address)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `1.2 s` / `350 ms` of CPU time.
pub fn cpu_text(cpu_ms: u64) -> String {
    match cpu_ms {
        ms if ms < 1000 => format!("{ms} ms"),
        ms if ms < 100_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms => format!("{} s", ms / 1000),
    }
}

/// `45.3 MiB` of memory.
pub fn bytes_text(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let value = bytes as f64;
    if value < KIB * KIB {
        format!("{:.0} KiB", value / KIB)
    } else if value < KIB * KIB * KIB {
        format!("{:.1} MiB", value / KIB / KIB)
    } else {
        format!("{:.2} GiB", value / KIB / KIB / KIB)
    }
}

fn ticks_per_second() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        // SAFETY: sysconf reads a configuration value and has no other effect.
        let ticks = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
        if ticks > 0 {
            ticks as u64
        } else {
            100
        }
    })
}

fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: as above.
        let size = unsafe { nix::libc::sysconf(nix::libc::_SC_PAGESIZE) };
        if size > 0 {
            size as u64
        } else {
            4096
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_rows_of_both_tables() {
        let v4 = "   0: 0100007F:1435 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0";
        let row = parse_row(v4, false).expect("a listen row");
        assert_eq!(row.address.to_string(), "127.0.0.1:5173");
        assert_eq!((row.uid, row.inode), (1000, 4242));
        let established = v4.replace(" 0A ", " 01 ");
        assert!(parse_row(&established, false).is_none());
        let v6 = "   0: 00000000000000000000000001000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0";
        let row = parse_row(v6, true).expect("a v6 listen row");
        assert_eq!(row.address.to_string(), "[::1]:8000");
        let any6 = v6.replace("00000000000000000000000001000000", &"0".repeat(32));
        assert_eq!(
            parse_row(&any6, true).unwrap().address.to_string(),
            "[::]:8000"
        );
        assert!(parse_row("  sl  local_address rem_address   st tx_queue", false).is_none());
    }

    #[test]
    fn netlink_and_proc_agree_on_a_listening_socket() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = socket.local_addr().unwrap();
        let from_proc: Vec<Listener> = listeners_from_proc();
        let ours = from_proc
            .iter()
            .find(|l| l.address == address)
            .expect("in /proc/net/tcp");
        if let Some(from_kernel) = diag::listeners(nix::libc::AF_INET as u8) {
            assert!(
                from_kernel.contains(ours),
                "{ours:?} not in {from_kernel:?}"
            );
        }
        assert!(listeners().contains(ours));
    }

    #[test]
    fn urls() {
        assert_eq!(url_of("127.0.0.1:5173"), "http://127.0.0.1:5173/");
        assert_eq!(url_of("0.0.0.0:8000"), "http://localhost:8000/");
        assert_eq!(url_of("[::]:8000"), "http://localhost:8000/");
        assert_eq!(url_of("[::1]:8000"), "http://[::1]:8000/");
    }
}
