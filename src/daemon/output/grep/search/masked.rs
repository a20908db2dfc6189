//! What masking does to a search: where token shapes and private keys lie in a buffer
//! (the lines that masking may change, searched as `read` shows them), the text of a
//! line as shown, and a token that a buffer's start cuts.

use super::{Scan, Segment, TOKEN_CONTEXT};
use crate::daemon::output::grep::shown::render;
use std::borrow::Cow;

impl Scan<'_, '_> {
    /// Where masking may change what `read` shows of `buf` (none without `redact`).
    pub(super) fn sensitive(&self) -> &[(usize, usize)] {
        self.sensitive.get_or_init(|| {
            if !self.search.redact {
                return Vec::new();
            }
            let mut spans = crate::redact::sensitive_spans(&self.buf);
            if let Some((_, end)) = self.token_across(0) {
                spans.insert(0, (0, end));
            }
            // Merged where they overlap: disjoint, in order, so ends are in order too.
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
            for (start, end) in spans {
                match merged.last_mut() {
                    Some(last) if start < last.1 => last.1 = last.1.max(end),
                    _ => merged.push((start, end)),
                }
            }
            merged
        })
    }

    /// The first span of [`Self::sensitive`] that ends after `pos`.
    pub(super) fn sensitive_after(&self, pos: usize) -> Option<(usize, usize)> {
        let spans = self.sensitive();
        spans
            .get(spans.partition_point(|&(_, e)| e <= pos))
            .copied()
    }

    /// Whether masking may change what `read` shows of `buf[start..end]`.
    pub(super) fn is_sensitive(&self, start: usize, end: usize) -> bool {
        let end = end.max(start + 1);
        self.sensitive_after(start).is_some_and(|(s, _)| s < end)
    }

    /// The text a match is looked for in: the line as `read` shows it.
    pub(super) fn match_text(&self, segment: Segment) -> Cow<'_, str> {
        match self.is_sensitive(segment.start, segment.end) {
            true => self.shown_text(segment),
            false => render(&self.buf[segment.start..segment.end]),
        }
    }

    /// The text of a segment as `read` shows it, token shapes and private keys masked
    /// (unless `no_redact`).
    pub(super) fn shown_text(&self, segment: Segment) -> Cow<'_, str> {
        if !self.search.redact {
            return render(&self.buf[segment.start..segment.end]);
        }
        let keys = self
            .keys
            .get_or_init(|| crate::redact::private_key_spans(&self.buf));
        let end = segment.end.max(segment.start + 1);
        if keys.iter().any(|&(s, e)| s < end && segment.start < e) {
            return Cow::Borrowed(crate::redact::PRIVATE_KEY);
        }
        // A token that the segment's start or end cuts (`--from` inside one, a piece of
        // a long line, a running job's unfinished last line) is shown as a marker.
        let (mut start, mut end) = (segment.start, segment.end);
        let mut cut_before = false;
        // No token crosses a line break: a segment that starts a line cuts none.
        let starts_line = start > 0 && self.buf[start - 1] == b'\n';
        let across = match starts_line {
            true => None,
            false => self.token_across(start),
        };
        if let Some((_, token_end)) = across {
            start = token_end.min(end);
            cut_before = true;
        }
        let mut cut_after = false;
        if self.buf.get(end) != Some(&b'\n') {
            if let Some((token_start, _)) = self.token_across(end) {
                end = token_start.max(start);
                cut_after = true;
            } else if let Some(k) = crate::redact::unfinished_token(&self.buf[start..end]) {
                end = start + k;
                cut_after = true;
            }
        }
        let text = render(&self.buf[start..end]);
        let masked = crate::redact::mask_shapes_bytes(text.as_bytes());
        if !cut_before && !cut_after {
            return match masked {
                Cow::Borrowed(_) => text,
                Cow::Owned(masked) => Cow::Owned(String::from_utf8_lossy(&masked).into_owned()),
            };
        }
        let mut out = String::new();
        if cut_before {
            out.push_str(crate::redact::CUT_TOKEN);
        }
        out.push_str(&String::from_utf8_lossy(&masked));
        if cut_after {
            out.push_str(crate::redact::CUT_TOKEN);
        }
        Cow::Owned(out)
    }

    /// The token shape that begins before `buf[at]` and ends after it, as indexes of
    /// `buf` (its start 0 when it began before `buf`).
    pub(super) fn token_across(&self, at: usize) -> Option<(usize, usize)> {
        let hi = (at + TOKEN_CONTEXT).min(self.buf.len());
        if at >= TOKEN_CONTEXT {
            let lo = at - TOKEN_CONTEXT;
            return crate::redact::token_across(&self.buf[lo..hi], at - lo)
                .map(|(s, e)| (lo + s, lo + e));
        }
        let keep = self.before_buf.len().min(TOKEN_CONTEXT - at);
        let mut window = self.before_buf[self.before_buf.len() - keep..].to_vec();
        window.extend_from_slice(&self.buf[..hi]);
        crate::redact::token_across(&window, keep + at)
            .map(|(s, e)| (s.saturating_sub(keep), e - keep))
    }
}
