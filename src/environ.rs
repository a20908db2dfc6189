//! A job's inherited environment, which is bytes: the caller's variables as they travel
//! in a request (UTF-8 ones as text, the others as base64 pairs) and back to `OsString`s.
//!
//! A Unix environment may hold any bytes but NUL; JSON strings hold only Unicode. The
//! variables that are valid UTF-8 travel in `inherit_env`; a variable whose name or
//! value is not travels in `inherit_env_bytes` as `[base64(name), base64(value)]`, and
//! the supervisor sets it with the very bytes it had.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// The caller's environment: UTF-8 variables by name, and the others as base64 pairs.
#[derive(Debug, Default)]
pub struct CallerEnv {
    pub text: BTreeMap<String, String>,
    pub bytes: Vec<[String; 2]>,
}

impl CallerEnv {
    /// This process's own environment (never panics on a non-UTF-8 variable).
    pub fn of_this_process() -> CallerEnv {
        let mut env = CallerEnv::default();
        for (name, value) in std::env::vars_os() {
            match (name.to_str(), value.to_str()) {
                (Some(name), Some(value)) => {
                    env.text.insert(name.to_string(), value.to_string());
                }
                _ => env.bytes.push([
                    STANDARD.encode(name.as_bytes()),
                    STANDARD.encode(value.as_bytes()),
                ]),
            }
        }
        env
    }
}

/// Decodes base64 `[name, value]` pairs, refusing what no environment can hold (a name
/// that is empty or holds `=`, a NUL byte anywhere).
pub fn decode_pairs(pairs: &[[String; 2]]) -> Result<Vec<(OsString, OsString)>, String> {
    pairs
        .iter()
        .enumerate()
        .map(|(n, [name, value])| {
            let decode = |text: &str, what: &str| {
                STANDARD.decode(text).map_err(|e| {
                    format!("inherit_env_bytes[{n}]: the {what} is not base64 ({e})")
                })
            };
            let name = decode(name, "name")?;
            let value = decode(value, "value")?;
            if name.is_empty() || name.contains(&b'=') || name.contains(&0) {
                return Err(format!(
                    "inherit_env_bytes[{n}]: a variable's name must be non-empty, without '=' or NUL"
                ));
            }
            if value.contains(&0) {
                return Err(format!(
                    "inherit_env_bytes[{n}]: a variable's value cannot hold a NUL byte"
                ));
            }
            Ok((OsString::from_vec(name), OsString::from_vec(value)))
        })
        .collect()
}

/// The pairs whose name is not one of `names` (a variable set as text wins over them).
pub fn without_names(pairs: &[[String; 2]], names: &BTreeMap<String, String>) -> Vec<[String; 2]> {
    pairs
        .iter()
        .filter(|[name, _]| {
            let decoded = STANDARD.decode(name).unwrap_or_default();
            !std::str::from_utf8(&decoded).is_ok_and(|name| names.contains_key(name))
        })
        .cloned()
        .collect()
}
