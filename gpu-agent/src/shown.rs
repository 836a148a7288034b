//! What the agent echoes of its clients' and the API server's text, in its answers and its log:
//! a name or message is shown whole up to a bound, and cut beyond it on a character boundary
//! with an ellipsis and the original length (`abc… (3900000 bytes)`), so a 4 MB claim name costs
//! a few hundred bytes of answer and of log, never megabytes.

use std::borrow::Cow;

/// The most bytes of a name (a claim's namespace, name or UID) shown.
pub const MAX_NAME: usize = 256;
/// The most bytes of a message (an error the kubelet or a client is answered with) shown.
pub const MAX_MESSAGE: usize = 4096;

/// `text` whole when it is at most `max` bytes; otherwise its first `max` bytes or fewer (cut
/// on a character boundary), `…`, and its length.
pub fn clip(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    Cow::Owned(format!(
        "{}… ({} bytes)",
        &text[..floor_boundary(text, max)],
        text.len()
    ))
}

/// The largest character boundary of `text` at or below `max` (`text.len()` when shorter).
pub(crate) fn floor_boundary(text: &str, max: usize) -> usize {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// A name as shown: [`clip`] at [`MAX_NAME`].
pub fn name(text: &str) -> Cow<'_, str> {
    clip(text, MAX_NAME)
}

/// A message as shown: [`clip`] at [`MAX_MESSAGE`].
pub fn message(text: &str) -> Cow<'_, str> {
    clip(text, MAX_MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_name_is_shown_whole_and_a_long_one_cut_on_a_char_boundary_with_its_length() {
        assert_eq!(name("claim-a"), "claim-a");
        let exact = "x".repeat(MAX_NAME);
        assert_eq!(name(&exact), exact.as_str());
        let long = format!("{}é{}", "x".repeat(MAX_NAME - 1), "y".repeat(4_000_000));
        let shown = name(&long);
        assert!(shown.len() < MAX_NAME + 40, "{}", shown.len());
        assert!(shown.starts_with(&"x".repeat(MAX_NAME - 1)));
        assert!(
            shown.ends_with(&format!("… ({} bytes)", long.len())),
            "{shown}"
        );
        assert!(!shown.contains('é'), "the cut splits no character");
    }
}
