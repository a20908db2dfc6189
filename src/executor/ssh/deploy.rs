//! The same bgwork on the host: `BGWORK_REMOTE_BIN` (a path on the host) when set, else
//! a `bgwork` of this very version on the host's PATH, else this binary copied to a
//! private per-version folder of the remote user (`~/.cache/bgwork/bin/VERSION-SUM/`,
//! 0700), its SHA-256 checked on the host before it is moved into place. Only a copy
//! whose sum matched is ever at that path (it is written beside it and renamed), so a
//! link that opens later finds it there without reading its 20-150 MB again.

use super::call::{explain, SshCall};
use std::path::PathBuf;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// This binary and its SHA-256, read once.
fn this_binary() -> Result<&'static (PathBuf, String), String> {
    static ONCE: std::sync::OnceLock<Result<(PathBuf, String), String>> =
        std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        use sha2::Digest;
        let exe = std::env::var_os("BGWORK_SLURM_BGWORK")
            .map(PathBuf::from)
            .map_or_else(std::env::current_exe, Ok)
            .map_err(|e| format!("could not find the bgwork binary: {e}"))?;
        let bytes =
            std::fs::read(&exe).map_err(|e| format!("could not read {}: {e}", exe.display()))?;
        let sum = sha2::Sha256::digest(&bytes);
        let hex: String = sum.iter().map(|b| format!("{b:02x}")).collect();
        Ok((exe, hex))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Runs `remote` on the host with `stdin` (none: empty) and returns its stdout, or ssh's
/// complaint explained.
async fn run(call: &SshCall, remote: &str, stdin: Option<PathBuf>) -> Result<String, String> {
    use std::process::Stdio;
    let mut command = call.command(remote);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    match stdin {
        Some(path) => {
            let file = std::fs::File::open(&path)
                .map_err(|e| format!("could not read {}: {e}", path.display()))?;
            command.stdin(Stdio::from(file));
        }
        None => {
            command.stdin(Stdio::null());
        }
    }
    let output = tokio::time::timeout(std::time::Duration::from_secs(120), command.output())
        .await
        .map_err(|_| format!("ssh {} did not answer within 120 s", call.host))?
        .map_err(|e| format!("could not run ssh (install openssh-client): {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    // 255: ssh's own failure; any other code is the remote command's.
    if output.status.code() == Some(255) || output.status.code().is_none() {
        return Err(explain(&call.host, &stderr));
    }
    if !output.status.success() {
        return Err(format!(
            "a command bgwork ran on {} failed ({}): {}",
            call.host,
            output.status,
            stderr.trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The path of this version of bgwork on the host, copied there when it is missing.
pub async fn ensure(call: &SshCall) -> Result<String, String> {
    if let Some(bin) = std::env::var("BGWORK_REMOTE_BIN")
        .ok()
        .filter(|b| !b.is_empty())
    {
        return Ok(bin);
    }
    let (exe, sum) = this_binary()?;
    let folder = format!("\"$HOME\"/.cache/bgwork/bin/{VERSION}-{}", &sum[..16]);
    let look = format!(
        "p=$(command -v bgwork 2>/dev/null || true); \
         if [ -n \"$p\" ] && [ \"$(\"$p\" --version 2>/dev/null)\" = {want} ]; then echo \"found $p\"; exit 0; fi; \
         f={folder}/bgwork; \
         if [ -x \"$f\" ]; then echo \"found $f\"; exit 0; fi; \
         echo \"need $(uname -s) $(uname -m)\"",
        want = shell_quote(&format!("bgwork {VERSION}")),
    );
    let said = run(call, &format!("sh -c {}", shell_quote(&look)), None).await?;
    let said = said.trim();
    if let Some(path) = said.strip_prefix("found ") {
        return Ok(path.to_string());
    }
    let Some(platform) = said.strip_prefix("need ") else {
        return Err(format!(
            "{} answered {said:?} when asked for bgwork: set BGWORK_REMOTE_BIN to bgwork {VERSION} there",
            call.host
        ));
    };
    let here = format!("{} {}", uname_s(), std::env::consts::ARCH);
    if !platform.eq_ignore_ascii_case(&here) {
        return Err(format!(
            "{} runs {platform}, this bgwork is built for {here}: install bgwork {VERSION} there \
             and set BGWORK_REMOTE_BIN to its path on the host",
            call.host
        ));
    }
    let copy = format!(
        "umask 077; mkdir -p \"$HOME\"/.cache/bgwork/bin && chmod 700 \"$HOME\"/.cache/bgwork \"$HOME\"/.cache/bgwork/bin && \
         mkdir -p {folder} && chmod 700 {folder} && t={folder}/bgwork.part.$$ && cat > \"$t\" && \
         if [ \"$(sha256sum < \"$t\" | cut -d' ' -f1)\" = {sum} ]; then chmod 700 \"$t\" && mv -f \"$t\" {folder}/bgwork && echo copied; \
         else rm -f \"$t\"; echo corrupt; fi"
    );
    let said = run(
        call,
        &format!("sh -c {}", shell_quote(&copy)),
        Some(exe.clone()),
    )
    .await?;
    match said.trim() {
        "copied" => {}
        other => {
            return Err(format!(
                "bgwork could not be copied to {} (its checksum there did not match: {other:?}): \
                 try again, or install bgwork {VERSION} there and set BGWORK_REMOTE_BIN",
                call.host
            ))
        }
    }
    let found = run(
        call,
        &format!("sh -c {}", shell_quote(&format!("cd {folder} && pwd"))),
        None,
    )
    .await?;
    Ok(format!("{}/bgwork", found.trim()))
}

fn uname_s() -> &'static str {
    match std::env::consts::OS {
        "linux" => "Linux",
        "macos" => "Darwin",
        "freebsd" => "FreeBSD",
        other => other,
    }
}
