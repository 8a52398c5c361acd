//! JSON text written by hand (the SQLite store's stored items, the server's acquire answer):
//! the one rule for when a string may be copied between two quotes as it is.

/// Whether `s` reads in JSON exactly as it is between two quotes: it holds no byte that
/// serde_json escapes (a control byte below U+0020, `"`, `\`; nothing else, DEL and
/// non-ASCII included). Every byte is looked at, without an early exit: the compiler turns
/// the loop into vector compares (the strings are short and almost never need an escape).
pub fn is_plain_json_string(s: &str) -> bool {
    !s.bytes()
        .fold(false, |e, b| e | (b < 0x20) | (b == b'"') | (b == b'\\'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A string is plain exactly when serde_json writes it as it is, between quotes.
        #[test]
        fn plain_is_what_serde_json_leaves_alone(
            s in prop_oneof![
                "[a-z0-9_]{0,12}",
                "[a-z\"\\\\\\x00-\\x1f\\x7f\\u{e9}\\u{2028}]{0,10}",
                any::<String>(),
            ]
        ) {
            let serde = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(is_plain_json_string(&s), serde == format!("\"{s}\""));
        }
    }
}
