//! Error text made storable: every database accepts what this returns (PostgreSQL refuses
//! U+0000 in `TEXT`), and no error message can grow a row without bound. Pure functions.

/// The longest error text stored for one message of an error chain, in bytes of UTF-8
/// (`last_error` is the chain joined, so at most this many bytes per cause). Longer text is
/// cut at a character boundary and marked.
pub const MAX_ERROR_BYTES: usize = 4096;

/// `text` with every U+0000 replaced by U+FFFD and cut to [`MAX_ERROR_BYTES`]; both changes
/// are recorded in the text itself (`[3 NUL characters replaced]`, `… [truncated from 10000
/// bytes]`), so that a reader of a dead letter knows it is not the original.
pub(crate) fn storable(text: &str) -> String {
    let nul = text.matches('\0').count();
    let mut out = if nul > 0 {
        text.replace('\0', "\u{FFFD}")
    } else {
        text.to_owned()
    };
    let original = out.len();
    if original > MAX_ERROR_BYTES {
        let mut cut = MAX_ERROR_BYTES;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str(&format!("… [truncated from {original} bytes]"));
    }
    if nul > 0 {
        out.push_str(&format!(
            " [{nul} NUL character{} replaced by U+FFFD]",
            if nul == 1 { "" } else { "s" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_replaced_and_said() {
        assert_eq!(
            storable("a\0b"),
            "a\u{FFFD}b [1 NUL character replaced by U+FFFD]"
        );
        assert_eq!(storable("plain"), "plain");
    }

    #[test]
    fn long_text_is_cut_at_a_char_boundary() {
        let s = "é".repeat(3000); // 6,000 bytes
        let out = storable(&s);
        assert!(out.ends_with("… [truncated from 6000 bytes]"), "{out}");
        assert!(out.len() < MAX_ERROR_BYTES + 40);
    }
}
