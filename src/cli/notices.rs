//! `bgwork notices`, the pull: claims the session's pending notices, prints them, and
//! acknowledges them once stdout took them (contract §4); and the text of a notice,
//! which the follower (`follow.rs`) prints too.

use super::render::{indent, inert};
use crate::client::Client;
use crate::delivery::Delivery;
use crate::wire::{self, Envelope, NoticesReply, Request, WireError};
use std::io::Write;
use std::process::ExitCode;

/// `notices`: prints the pending notices, then acknowledges them. One that could not
/// be printed (stdout full or gone) is not acknowledged: it stays pending for the next
/// puller, and the call fails.
pub(super) fn pull_notices(
    client: &mut Client,
    envelope: &Envelope,
    json: bool,
) -> Result<ExitCode, WireError> {
    let Request::Notices { wait_s, limit, .. } = envelope.request else {
        unreachable!("called for notices")
    };
    let mut delivery = Delivery::over(client, &envelope.session);
    let claimed = delivery.claim(limit, wait_s)?;
    let reply = claimed.reply();
    let text = match json {
        true => wire::to_json_text(&reply),
        false => notices_text(&reply),
    };
    let mut out = std::io::stdout().lock();
    let printed = out
        .write_all(text.as_bytes())
        .and_then(|()| match text.ends_with('\n') {
            true => Ok(()),
            false => out.write_all(b"\n"),
        })
        .and_then(|()| out.flush());
    if let Err(e) = printed {
        return Err(WireError::new(
            wire::ErrorCode::Unavailable,
            format!("the notices could not be printed ({e}): they stay pending"),
        ));
    }
    delivery.acknowledge(&claimed.ids())?;
    Ok(ExitCode::SUCCESS)
}

pub(super) fn notice_text(notice: &wire::Notice) -> String {
    format!(
        "{} [{}]\n{}",
        inert(&notice.text),
        inert(&notice.id),
        indent(&notice.tail)
    )
}

pub(super) fn notices_text(reply: &NoticesReply) -> String {
    if reply.notices.is_empty() {
        return "no pending notices".to_string();
    }
    reply
        .notices
        .iter()
        .map(notice_text)
        .collect::<Vec<_>>()
        .join("")
}
