//! Strings from data files, made safe to print on a terminal.
//!
//! A manifest, an index or a shard's text may hold anything, terminal control sequences included:
//! `\x1b[2J` clears the screen, `\r` or a backspace overwrites what was printed, OSC sequences set
//! the window title or write the clipboard on some terminals, and bidirectional-override
//! characters make text read differently from how it is stored. Every string that came from data
//! goes through [`printable`] (or [`printable_text`] for multi-line text) before it is printed:
//! control characters are escaped the way Rust's `escape_debug` writes them (`\u{1b}`, `\r`), and
//! everything else — all of printable Unicode — is left as it is, so names stay readable.

use std::borrow::Cow;

/// Whether `c` changes how a terminal shows text rather than being text: a C0 or C1 control
/// character or DEL (`char::is_control`), or a bidirectional formatting character (the marks,
/// embeddings, overrides and isolates of Unicode's bidi algorithm).
fn is_terminal_control(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| is_terminal_control(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if !is_terminal_control(c) || keep(c) {
            out.push(c);
        } else if c.is_control() {
            // `\n`, `\t`, `\r`, `\0`, else `\u{1b}`.
            out.extend(c.escape_debug());
        } else {
            // Bidi characters are not `is_control`; write them as code points.
            out.extend(c.escape_unicode());
        }
    }
    Cow::Owned(out)
}

/// `s` with every terminal control character escaped (newlines and tabs included): for a name,
/// a command, a path or any other one-line string read from data.
pub fn printable(s: &str) -> Cow<'_, str> {
    escape(s, |_| false)
}

/// `s` with every terminal control character escaped except newline and tab: for text that is
/// meant to span lines (a decoded sample, an error with several lines).
pub fn printable_text(s: &str) -> Cow<'_, str> {
    escape(s, |c| c == '\n' || c == '\t')
}

/// The most characters of one value [`shortened`] keeps: enough to recognise a name or a line,
/// few enough that an error quoting a 300 KB line stays one screen.
pub const SHORTENED_CHARS: usize = 200;

/// `s` escaped as by [`printable`] and, when longer than [`SHORTENED_CHARS`] characters, cut to
/// its first ones followed by how much was left out: for quoting a value from a file (a line, a
/// key, a field) in a message.
pub fn shortened(s: &str) -> Cow<'_, str> {
    let total = s.chars().count();
    if total <= SHORTENED_CHARS {
        return printable(s);
    }
    let end = s
        .char_indices()
        .nth(SHORTENED_CHARS)
        .map_or(s.len(), |(i, _)| i);
    Cow::Owned(format!(
        "{}… ({} more characters)",
        printable(&s[..end]),
        total - SHORTENED_CHARS
    ))
}

/// A message of several lines (a parser's error that quotes the offending line under a caret)
/// with every line escaped as by [`printable_text`] and cut as by [`shortened`]: a 300 KB line of
/// a file stays one screen in the message.
pub fn shortened_lines(s: &str) -> String {
    cut_lines(s, SHORTENED_CHARS)
}

/// `s` escaped as by [`printable_text`], each line cut after `max_chars` characters with how
/// much was left out.
pub fn cut_lines(s: &str, max_chars: usize) -> String {
    let cut = |line: &str| {
        let total = line.chars().count();
        if total <= max_chars {
            return printable_text(line).into_owned();
        }
        let end = line
            .char_indices()
            .nth(max_chars)
            .map_or(line.len(), |(i, _)| i);
        format!(
            "{}… ({} more characters)",
            printable_text(&line[..end]),
            total - max_chars
        )
    };
    s.split('\n').map(cut).collect::<Vec<_>>().join("\n")
}

/// The most characters a number keeps in a message before [`short_numbers`] writes it in
/// scientific notation. Rust prints an `f64` without an exponent, so a `1e300` read from a file
/// would be 301 digits; every integer type up to 128 bits fits.
pub const MAX_NUMBER_CHARS: usize = 40;

/// `s` with every number longer than [`MAX_NUMBER_CHARS`] characters (a run of digits and at
/// most one point, not part of a word, a name or a path) in scientific notation: `1e300` instead
/// of a one followed by 300 zeros, `1e-300` instead of 300 zeros after the point. Numbers a
/// message is meant to show, and digits inside names, stay as they are.
pub fn short_numbers(s: &str) -> Cow<'_, str> {
    let bytes = s.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'/';
    // Inside a word or a name (`run-000…`, `/000…`), not a number of its own; a minus after a
    // space or a bracket is a sign.
    let inside_a_name = |i: usize| {
        i > 0 && (is_word(bytes[i - 1]) || (bytes[i - 1] == b'-' && i > 1 && is_word(bytes[i - 2])))
    };
    let mut out: Option<String> = None;
    let (mut i, mut copied) = (0, 0);
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() || inside_a_name(i) {
            i += 1;
            continue;
        }
        let mut start = i;
        while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        // A point before the digits belongs to the number (`.000…1`), unless it follows a word
        // or another point (`file.000…`, `v1.000…`, `..000…`): then the digits are a name's.
        if start > 0 && bytes[start - 1] == b'.' {
            if start > 1 && (is_word(bytes[start - 2]) || bytes[start - 2] == b'.') {
                continue;
            }
            start -= 1;
        }
        // A sentence's full stop is not part of the number.
        let end = if bytes[i - 1] == b'.' { i - 1 } else { i };
        let number = &s[start..end];
        let followed_by_word =
            i < bytes.len() && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_');
        if end - start <= MAX_NUMBER_CHARS || followed_by_word || number.matches('.').count() > 1 {
            continue;
        }
        let Ok(v) = number.parse::<f64>() else {
            continue;
        };
        let o = out.get_or_insert_with(|| String::with_capacity(s.len()));
        o.push_str(&s[copied..start]);
        o.push_str(&format!("{v:e}"));
        copied = end;
    }
    match out {
        None => Cow::Borrowed(s),
        Some(mut o) => {
            o.push_str(&s[copied..]);
            Cow::Owned(o)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_numbers_are_written_with_an_exponent_and_others_are_left_alone() {
        let big = format!("{}", 1e300_f64);
        let tiny = format!("{}", 1e-300_f64);
        let line = format!("x.jsonl:1: field depth: {big} is not a fraction; theta {tiny}.");
        assert_eq!(
            short_numbers(&line),
            "x.jsonl:1: field depth: 1e300 is not a fraction; theta 1e-300."
        );
        let pi = format!("{}", 3.5e200_f64);
        assert_eq!(short_numbers(&format!("[{pi}]")), "[3.5e200]");
        assert_eq!(short_numbers(&format!("got -{big}")), "got -1e300");
        // The sign and a full stop are not counted; a point before the digits is the number's.
        let forty = format!("-2413738051455689{}", "0".repeat(24));
        assert_eq!(short_numbers(&forty), forty);
        assert_eq!(
            short_numbers(&format!("{}5.", "1".repeat(39))),
            format!("{}5.", "1".repeat(39))
        );
        assert_eq!(short_numbers(&format!("x .{}1", "0".repeat(40))), "x 1e-41");
        assert_eq!(short_numbers(&format!("-.{}1", "0".repeat(40))), "-1e-41");
        // Numbers of ordinary length, digits in names and paths, and digests stay as they are.
        let zeros = "0".repeat(60);
        for kept in [
            "u128 max 340282366920938463463374607431768211455".to_string(),
            format!("run-{zeros}/step"),
            format!("/runs/{zeros}"),
            format!("{zeros}abc"),
            format!("x{zeros}"),
            format!("1.2.{zeros}"),
            format!("file.{zeros}"),
            format!("..{zeros}"),
            "6ae952bcf6427bed1084152e0a3fb31e276df160543be1477291bcf46a73b279".to_string(),
        ] {
            assert_eq!(short_numbers(&kept), kept);
        }
    }
    use proptest::prelude::*;

    #[test]
    fn long_values_are_cut_and_say_how_much_was_left_out() {
        assert_eq!(shortened("short\x1b"), "short\\u{1b}");
        let long = "é".repeat(SHORTENED_CHARS + 50);
        let cut = shortened(&long);
        assert!(cut.starts_with(&"é".repeat(SHORTENED_CHARS)));
        assert!(cut.ends_with("… (50 more characters)"), "{cut}");
        assert_eq!(
            shortened(&"x".repeat(SHORTENED_CHARS)).len(),
            SHORTENED_CHARS
        );
    }

    #[test]
    fn each_line_of_a_message_is_cut_on_its_own() {
        let msg = format!(
            "TOML parse error at line 1\n1 | {}\n  | ^\nexpected `=`",
            "k".repeat(300_000)
        );
        let cut = shortened_lines(&msg);
        assert!(cut.len() < 1000, "{}", cut.len());
        assert!(cut.starts_with("TOML parse error at line 1\n1 | kkk"));
        assert!(
            cut.ends_with("more characters)\n  | ^\nexpected `=`"),
            "{cut}"
        );
    }

    #[test]
    fn control_characters_are_escaped_and_text_is_kept() {
        assert_eq!(printable("tok\x1b[2Jen"), "tok\\u{1b}[2Jen");
        assert_eq!(
            printable("a\rb\nc\td\u{7f}e\u{9b}f"),
            "a\\rb\\nc\\td\\u{7f}e\\u{9b}f"
        );
        assert_eq!(printable("abc\u{202e}txt"), "abc\\u{202e}txt");
        // Printable Unicode and quotes are left alone, and nothing is copied.
        let plain = "Grüße, 日本語 \"quoted\" \\ back-slash 🙂";
        assert!(matches!(printable(plain), Cow::Borrowed(p) if p == plain));
        assert_eq!(
            printable_text("line 1\nline\t2\x1b]0;title\x07"),
            "line 1\nline\t2\\u{1b}]0;title\\u{7}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the input, the output holds no control character (bar newline and tab in
        /// text mode) and no bidi override, and input without them comes back unchanged.
        #[test]
        fn output_is_never_a_terminal_control(s in any::<String>()) {
            let one = printable(&s);
            prop_assert!(!one.chars().any(is_terminal_control));
            let text = printable_text(&s);
            prop_assert!(!text.chars().any(|c| is_terminal_control(c) && c != '\n' && c != '\t'));
            if !s.chars().any(is_terminal_control) {
                prop_assert_eq!(one.as_ref(), s.as_str());
            }
        }

        /// Random text of digits, points, signs, letters and separators (and random floats
        /// printed as Rust prints them, among it): no number of the output is longer than
        /// [`MAX_NUMBER_CHARS`] unless it is part of a name, the output is never longer than
        /// the input, a second pass changes nothing, and each number, standing alone, comes back
        /// as itself.
        #[test]
        fn long_numbers_come_back_short_and_equal(
            parts in proptest::collection::vec(prop_oneof![
                "[0-9.]{0,60}",
                "[a-z_/ -]{0,3}",
                any::<f64>().prop_map(|v| format!(" {v} ")),
                Just(" . ".to_string()),
            ], 0..6),
        ) {
            let s = parts.concat();
            let out = short_numbers(&s);
            prop_assert!(out.len() <= s.len(), "{s} -> {out}");
            let again = short_numbers(&out);
            prop_assert_eq!(again.as_ref(), out.as_ref());
            for word in out.split(' ') {
                if let Ok(v) = word.parse::<f64>() {
                    // The sign and a sentence's full stop are not counted.
                    let number = word.strip_prefix('-').unwrap_or(word);
                    let number = number.strip_suffix('.').unwrap_or(number);
                    if number.len() > MAX_NUMBER_CHARS {
                        prop_assert!(!v.is_finite() || word.contains("e"), "{word}");
                    }
                }
            }
            for part in &parts {
                let alone = part.trim();
                if let Ok(v) = alone.parse::<f64>() {
                    if v.is_finite() && !alone.ends_with('.') {
                        let spaced = format!(" {alone} ");
                        let shown = short_numbers(&spaced);
                        prop_assert_eq!(shown.trim().parse::<f64>().ok(), Some(v), "{}", alone);
                    }
                }
            }
        }
    }
}
