//! The search through logs, by bytes written to a file.

use super::*;
use crate::daemon::output::grep::compile;
use crate::daemon::output::grep::shown::{strip_colors, SHOWN};
use std::io::Write;

fn search_in(bytes: &[u8], pattern: &str, context: usize, gap: Range<u64>) -> Found {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(bytes).unwrap();
    let regex = compile(pattern).unwrap();
    let search = Search {
        regex: &regex,
        from: 0,
        to: bytes.len() as u64,
        gap,
        context,
        max_matches: 1000,
        max_text: 1 << 20,
        redact: true,
    };
    search.run(&file).unwrap()
}

fn lines(found: &Found) -> Vec<(u64, u64, String)> {
    found
        .matches
        .iter()
        .map(|m| (m.line.line, m.line.offset, m.line.text.clone()))
        .collect()
}

#[test]
fn lines_offsets_and_numbers() {
    let found = search_in(b"alpha\nbeta\ngamma beta\n\nbeta", "beta", 0, 0..0);
    assert_eq!(
        lines(&found),
        vec![
            (2, 6, "beta".into()),
            (3, 11, "gamma beta".into()),
            (5, 23, "beta".into())
        ]
    );
}

#[test]
fn context_lines_are_shown_once() {
    let text: String = (1..=20).map(|n| format!("l{n}\n")).collect();
    let found = search_in(text.as_bytes(), "^l(5|7|15)$", 2, 0..0);
    let m = &found.matches;
    assert_eq!(m.len(), 3);
    let texts = |v: &Vec<GrepLine>| v.iter().map(|l| l.text.clone()).collect::<Vec<_>>();
    assert_eq!(texts(&m[0].before), ["l3", "l4"]);
    assert_eq!(texts(&m[0].after), ["l6"]);
    assert!(m[1].before.is_empty());
    assert_eq!(texts(&m[1].after), ["l8", "l9"]);
    assert_eq!(texts(&m[2].before), ["l13", "l14"]);
    assert_eq!(m[2].before[0].line, 13);
    assert_eq!(texts(&m[2].after), ["l16", "l17"]);
}

#[test]
fn escapes_carriage_returns_and_binary() {
    let found = search_in(
        b"\x1b[31mERROR\x1b[0m: red\nok\n10%\r100% done\r\n\xff\xfe\x00bin ERROR\n",
        "ERROR|done",
        0,
        0..0,
    );
    assert_eq!(
        lines(&found),
        vec![
            (1, 0, "ERROR: red".into()),
            (3, 23, "100% done".into()),
            (4, 38, "\u{fffd}\u{fffd}bin ERROR".into())
        ]
    );
}

#[test]
fn colors_are_stripped_as_read_strips_them() {
    for line in [
        &b"\x1b[31mERROR\x1b[0m: red"[..],
        b"\x1b[1;38;5;208mbold\x1b[m\ttab \x1b[2K",
        b"caf\xc3\xa9 \x1b[?25l\x1b[?25h",
        b"\x1b[ q spaced intermediates",
    ] {
        assert_eq!(
            strip_colors(line).as_deref(),
            Some(output::readable(line).as_str()),
            "{line:?}"
        );
    }
    for other in [
        &b"\x1b]0;title\x07x"[..],
        b"10%\r20%",
        b"\x1b(B",
        b"\x1b[31",
        b"bad \xff \x1b[0m",
        b"\x1b[0m\x08",
    ] {
        assert_eq!(strip_colors(other), None, "{other:?}");
    }
}

#[test]
fn empty_matches_find_each_line_once() {
    let text = b"one\n\x1b[1mtwo\x1b[0m\nthree\n\nfive";
    for pattern in ["", "^", "$", "x*"] {
        let found = search_in(text, pattern, 0, 0..0);
        let offsets: Vec<u64> = found.matches.iter().map(|m| m.line.offset).collect();
        assert_eq!(offsets, [0, 4, 16, 22, 23], "{pattern:?}");
    }
    let found = search_in(text, "^$", 0, 0..0);
    assert_eq!(lines(&found), vec![(4, 22, String::new())]);
}

#[test]
fn a_pattern_across_lines_goes_line_by_line() {
    let found = search_in(b"a\nb\nab\n", r"a\s*b", 0, 0..0);
    assert_eq!(lines(&found), vec![(3, 4, "ab".into())]);
}

#[test]
fn a_long_line_is_searched_in_pieces() {
    let mut bytes = vec![b'x'; 3 * MAX_LINE];
    bytes[MAX_LINE + 10..MAX_LINE + 16].copy_from_slice(b"NEEDLE");
    bytes.extend_from_slice(b"\nNEEDLE\n");
    let found = search_in(&bytes, "NEEDLE", 0, 0..0);
    let got = lines(&found);
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].0, got[0].1), (1, MAX_LINE as u64));
    assert!(got[0].2.contains("NEEDLE") && got[0].2.len() < 2 * SHOWN);
    assert_eq!((got[1].0, got[1].1), (2, 3 * MAX_LINE as u64 + 1));
}

#[test]
fn buffers_join_without_losing_lines_or_context() {
    let line = "0123456789abcdef".repeat(4) + "\n";
    let mut text = line.repeat(BUF / line.len() - 1);
    text.push_str("before\nmatch here\nafter\n");
    text.push_str(&line.repeat(BUF / line.len()));
    text.push_str("match again\n");
    let found = search_in(text.as_bytes(), "match", 1, 0..0);
    let m = &found.matches;
    assert_eq!(m.len(), 2);
    let first = BUF / line.len();
    assert_eq!(m[0].line.line as usize, first + 1);
    assert_eq!(m[0].before[0].text, "before");
    assert_eq!(m[0].after[0].text, "after");
    assert_eq!(m[1].line.line as usize, first + 3 + BUF / line.len());
    assert_eq!(
        m[1].line.offset as usize,
        text.len() - "match again\n".len()
    );
    assert_eq!(m[1].before[0].text, line.trim_end());
}

#[test]
fn past_the_gap_numbers_are_lower_bounds() {
    let mut bytes = b"head match\nhe".to_vec();
    bytes.extend(vec![0u8; 100]);
    bytes.extend_from_slice(b"ad\ntail match\n");
    let found = search_in(&bytes, "match", 0, 13..113);
    let m = &found.matches;
    assert_eq!(m.len(), 2);
    assert_eq!((m[0].line.line, m[0].line.line_at_least), (1, false));
    assert_eq!((m[1].line.line, m[1].line.offset), (4, 116));
    assert!(m[1].line.line_at_least);
}

#[test]
fn a_search_stops_at_its_most_matches_and_says_where_to_go_on() {
    let text = "hit\n".repeat(10);
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    let regex = compile("hit").unwrap();
    let search = Search {
        regex: &regex,
        from: 0,
        to: text.len() as u64,
        gap: 0..0,
        context: 0,
        max_matches: 3,
        max_text: 1 << 20,
        redact: true,
    };
    let found = search.run(&file).unwrap();
    assert_eq!(found.matches.len(), 3);
    assert!(found.truncated);
    assert_eq!(found.next_from, Some(12));
}

#[test]
fn huge_patterns_are_refused_quickly() {
    let began = std::time::Instant::now();
    assert!(compile(r"\w{1000}\w{1000}\w{1000}").is_err());
    assert!(compile("(a").is_err());
    assert!(began.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn a_hole_past_the_known_gap_is_passed() {
    let mut file = tempfile::tempfile().unwrap();
    let line = "full speed line with some words ERROR maybe\n";
    file.write_all(line.repeat((1 << 20) / line.len()).as_bytes())
        .unwrap();
    let tail = line.repeat((10 << 20) / line.len());
    std::os::unix::fs::FileExt::write_all_at(&file, tail.as_bytes(), 100 << 20).unwrap();
    let to = (100 << 20) + tail.len() as u64;
    let regex = compile("ERROR").unwrap();
    let search = Search {
        regex: &regex,
        from: 3_000_000,
        to,
        gap: (1 << 20)..(2 << 20),
        context: 0,
        max_matches: 2,
        max_text: 1 << 20,
        redact: true,
    };
    let found = search.run(&file).unwrap();
    assert_eq!(found.matches.len(), 2, "{found:?}");
    assert_eq!(found.matches[0].line.offset, 100 << 20);
    assert!(found.matches[0].line.line_at_least);
}
