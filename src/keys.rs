//! Input for `send`: escapes in text (`\n`, `\t`, `\xHH`) and named keys.

use crate::wire::control::ToSupervisor;
use crate::wire::WireError;

/// Turns `send` text into bytes: `\n \r \t \e \0 \\ \xHH` are understood.
pub fn unescape(text: &str) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            Some('n') => out.push(b'\n'),
            Some('r') => out.push(b'\r'),
            Some('t') => out.push(b'\t'),
            Some('e') => out.push(0x1b),
            Some('0') => out.push(0),
            Some('\\') => out.push(b'\\'),
            Some('x') => {
                let hex: String = chars.by_ref().take(2).collect();
                let byte = u8::from_str_radix(&hex, 16).map_err(|_| {
                    WireError::bad_request(format!(
                        "bad escape \\x{hex}: write two hex digits, e.g. \\x03"
                    ))
                })?;
                out.push(byte);
            }
            Some(other) => {
                return Err(WireError::bad_request(format!(
                    "unknown escape \\{other}: use \\n \\r \\t \\e \\0 \\\\ or \\xHH"
                )))
            }
            None => out.push(b'\\'),
        }
    }
    Ok(out)
}

/// What a named key means for a plain job (no terminal): control keys become the
/// signal or end-of-input a terminal would have made; others become their bytes.
pub fn plain_job_key(key: &str) -> Result<ToSupervisor, WireError> {
    use nix::sys::signal::Signal;
    let command = match key.to_ascii_lowercase().as_str() {
        "c-c" => ToSupervisor::Signal {
            signal: Signal::SIGINT as i32,
        },
        "c-\\" => ToSupervisor::Signal {
            signal: Signal::SIGQUIT as i32,
        },
        "c-z" => ToSupervisor::Signal {
            signal: Signal::SIGTSTP as i32,
        },
        "c-d" => ToSupervisor::CloseInput,
        _ => ToSupervisor::Input {
            data: key_bytes(key)?,
        },
    };
    Ok(command)
}

/// The bytes a terminal sends for a named key.
pub fn key_bytes(key: &str) -> Result<Vec<u8>, WireError> {
    let lower = key.to_ascii_lowercase();
    let bytes: &[u8] = match lower.as_str() {
        "enter" | "return" => b"\r",
        "tab" => b"\t",
        "esc" | "escape" => b"\x1b",
        "backspace" | "bs" => b"\x7f",
        "space" => b" ",
        "up" => b"\x1b[A",
        "down" => b"\x1b[B",
        "right" => b"\x1b[C",
        "left" => b"\x1b[D",
        "home" => b"\x1b[H",
        "end" => b"\x1b[F",
        "pageup" => b"\x1b[5~",
        "pagedown" => b"\x1b[6~",
        "delete" | "del" => b"\x1b[3~",
        "insert" | "ins" => b"\x1b[2~",
        "s-tab" | "btab" => b"\x1b[Z",
        // Function keys as xterm sends them.
        "f1" => b"\x1bOP",
        "f2" => b"\x1bOQ",
        "f3" => b"\x1bOR",
        "f4" => b"\x1bOS",
        "f5" => b"\x1b[15~",
        "f6" => b"\x1b[17~",
        "f7" => b"\x1b[18~",
        "f8" => b"\x1b[19~",
        "f9" => b"\x1b[20~",
        "f10" => b"\x1b[21~",
        "f11" => b"\x1b[23~",
        "f12" => b"\x1b[24~",
        // Control with a punctuation key.
        "c-@" | "c-space" => b"\x00",
        "c-[" => b"\x1b",
        "c-\\" => b"\x1c",
        "c-]" => b"\x1d",
        "c-^" => b"\x1e",
        "c-_" => b"\x1f",
        "c-?" => b"\x7f",
        _ => {
            if let Some(letter) = lower.strip_prefix("c-").filter(|l| l.len() == 1) {
                let c = letter.as_bytes()[0];
                if c.is_ascii_lowercase() {
                    return Ok(vec![c - b'a' + 1]);
                }
            }
            return Err(WireError::bad_request(format!(
                "unknown key {key}: use C-a..C-z, C-@, C-[, C-\\, C-], C-^, C-_, Enter, Tab, \
                 S-Tab, Esc, Backspace, Up, Down, Left, Right, Home, End, PageUp, PageDown, \
                 Insert, Delete, F1..F12"
            )));
        }
    };
    Ok(bytes.to_vec())
}

/// Input bytes as `send` text, which [`unescape`] turns back into the same bytes
/// (`\\`, and `\xHH` for every byte that is not printable ASCII).
pub fn escape(data: &[u8]) -> String {
    let mut text = String::with_capacity(data.len());
    for &byte in data {
        match byte {
            b'\\' => text.push_str("\\\\"),
            0x20..=0x7e => text.push(byte as char),
            _ => text.push_str(&format!("\\x{byte:02x}")),
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_become_bytes() {
        assert_eq!(unescape(r"a\nb\t\x03\\").unwrap(), b"a\nb\t\x03\\");
        assert!(unescape(r"\xZZ").is_err());
        assert!(unescape(r"\q").is_err());
    }

    #[test]
    fn keys_become_terminal_bytes() {
        assert_eq!(key_bytes("C-c").unwrap(), vec![3]);
        assert_eq!(key_bytes("Up").unwrap(), b"\x1b[A");
        assert!(key_bytes("Hyper").is_err());
        assert_eq!(key_bytes("F1").unwrap(), b"\x1bOP");
        assert_eq!(key_bytes("f12").unwrap(), b"\x1b[24~");
        assert_eq!(key_bytes("Insert").unwrap(), b"\x1b[2~");
        assert_eq!(key_bytes("C-\\").unwrap(), vec![0x1c]);
        assert!(key_bytes("F13").is_err());
    }
}
