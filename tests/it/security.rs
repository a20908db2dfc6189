//! Security and bad input: socket modes, other uids, frames, NUL, secrets.

use crate::util::{Home, BIN};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;

fn raw_call(home: &Home, bytes: &[u8]) -> serde_json::Value {
    home.start_daemon();
    let mut stream = UnixStream::connect(home.socket()).unwrap();
    // The daemon may refuse an oversized frame before it has all been written.
    let _ = stream.write_all(bytes);
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

#[test]
fn the_socket_is_0600_in_a_0700_folder() {
    let home = Home::new();
    home.start_daemon();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&home.socket()), 0o600);
    assert_eq!(mode(home.path()), 0o700);
}

#[test]
fn a_client_of_another_uid_is_refused() {
    let home = Home::new();
    home.start_daemon();
    let as_nobody = || {
        std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                BIN,
                "--json",
                "list",
            ])
            .env("BGWORK_HOME", home.path())
            .output()
            .unwrap()
    };
    let denied = as_nobody();
    assert!(!denied.status.success(), "file modes keep nobody out");
    // Open the modes: the daemon's own uid check must still refuse.
    let open = std::fs::Permissions::from_mode(0o777);
    std::fs::set_permissions(home.path(), open.clone()).unwrap();
    std::fs::set_permissions(home.socket(), open).unwrap();
    let refused = as_nobody();
    // The other user's own client refuses a folder that is not its user's; a raw
    // connection of that user gets the daemon's refusal.
    let raw = crate::security_hostile::as_nobody(|| {
        let mut stream = UnixStream::connect(home.socket()).unwrap();
        let _ = stream.write_all(b"{\"session\":\"test\",\"op\":\"list\"}\n");
        let mut line = String::new();
        let _ = BufReader::new(stream).read_line(&mut line);
        line
    });
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(!refused.status.success());
    let out = String::from_utf8_lossy(&refused.stdout);
    assert!(
        out.contains("refused to use"),
        "{out} {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(raw.contains("refused"), "{raw}");
    assert_eq!(
        home.json(&["list"])["items"],
        serde_json::json!([]),
        "the daemon serves on"
    );
}

#[test]
fn an_oversized_frame_is_refused_and_the_daemon_serves_on() {
    let home = Home::new();
    let mut big = b"{\"session\":\"test\",\"op\":\"list\",\"pad\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'x', 2 << 20));
    let reply = raw_call(&home, &big);
    assert_eq!(reply["error"]["code"], "too_large");
    assert!(home.json(&["status"])["pid"].as_i64().unwrap() > 0);
}

#[test]
fn malformed_requests_and_nul_bytes_get_clear_errors() {
    let home = Home::new();
    let reply = raw_call(&home, b"this is not json\n");
    assert_eq!(reply["error"]["code"], "bad_request");
    let reply = raw_call(&home, b"{\"session\":\"test\",\"op\":\"launch_rockets\"}\n");
    assert_eq!(reply["error"]["code"], "bad_request");
    let nul =
        b"{\"session\":\"test\",\"op\":\"start\",\"command\":\"echo a\\u0000b\",\"window_ms\":0}\n";
    let reply = raw_call(&home, nul);
    assert_eq!(reply["error"]["code"], "bad_request");
    assert!(reply["error"]["message"].as_str().unwrap().contains("NUL"));
    assert_eq!(
        home.json(&["list", "--all"])["items"],
        serde_json::json!([])
    );
}

#[test]
fn a_secret_in_the_environment_appears_nowhere() {
    let secret = "hunter2-7f3a9c";
    let inherited = "inherited-5be01d";
    let home = Home::new().with("MY_INHERITED_TOKEN", inherited);
    let id = home.start_with(
        &["--env", &format!("API_TOKEN={secret}")],
        r#"test ${#API_TOKEN} = 14 && test "${API_TOKEN:0:7}" = hunter2 && test -n "$MY_INHERITED_TOKEN""#,
    );
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "succeeded", "the job sees its variables");
    assert_eq!(item["env_names"], serde_json::json!(["API_TOKEN"]));
    let listing = home.run(&["--json", "list", "--all"]).stdout;
    let (_, _, error) = home.error(&["start", "--env", &format!("BAD{secret}"), "--", "true"]);
    home.json(&["shutdown"]);
    let mut places = vec![listing, error];
    for entry in walk(home.path()) {
        places
            .push(String::from_utf8_lossy(&std::fs::read(&entry).unwrap_or_default()).into_owned());
    }
    for text in places {
        assert!(!text.contains(secret), "the secret leaked");
        assert!(!text.contains(inherited), "an inherited value leaked");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else if path.is_file() {
            files.push(path);
        }
    }
    files
}
