//! Error text for people: libtorch's C++ exception context left out.
//!
//! A libtorch error carries, after its one-line message, the C++ source location and a stack of
//! some 30 native frames ("Exception raised from … (most recent call first):", "frame #0: …").
//! That helps whoever debugs libtorch, not someone whose run stopped, so binaries print the first
//! line only, unless [`BACKTRACE_ENV`]`=1` asks for the whole text.

/// The environment variable that keeps the full text (`RSD_BACKTRACE=1`).
pub const BACKTRACE_ENV: &str = "RSD_BACKTRACE";

/// Whether a line starts libtorch's C++ exception context.
fn is_native_context(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("Exception raised from ") || l.starts_with("frame #")
}

/// The first line of `text` when the text carries a C++ backtrace (`None` when it has none, so
/// multi-line messages of our own stay whole).
pub fn without_native_backtrace(text: &str) -> Option<&str> {
    if !text.lines().any(is_native_context) {
        return None;
    }
    Some(text.lines().next().unwrap_or("").trim_end())
}

/// The most characters of one line of an error a binary prints: a message quoting a value read
/// from a file (a 300 KB line, a name) stays a screen, whatever the library that wrote it.
pub const MAX_LINE_CHARS: usize = 2000;

/// `text` as a binary should print it: summarised by [`without_native_backtrace`] with a hint,
/// unless `full` (the text unchanged); then, either way, with terminal control characters
/// escaped (a name read from a file cannot rewrite the screen), numbers of more than 40
/// characters in scientific notation (a value of `1e300` read from a file is not printed as 301
/// digits: [`crate::printable::short_numbers`]) and every line cut after [`MAX_LINE_CHARS`]
/// characters.
pub fn for_user(text: &str, full: bool) -> String {
    let text = match without_native_backtrace(text) {
        Some(first) if !full => {
            format!("{first} ({BACKTRACE_ENV}=1 shows libtorch's full message)")
        }
        _ => text.to_string(),
    };
    crate::printable::cut_lines(&crate::printable::short_numbers(&text), MAX_LINE_CHARS)
}

/// [`for_user`] with `full` read from [`BACKTRACE_ENV`].
pub fn for_user_from_env(text: &str) -> String {
    let full = std::env::var(BACKTRACE_ENV).is_ok_and(|v| v == "1");
    for_user(text, full)
}

/// An error and its chain of causes (`messages`, outermost first) as one line: each cause the
/// line does not already quote is appended after ": " (library errors often embed their source,
/// e.g. `PATH: No such file or directory`), then [`for_user_from_env`].
pub fn one_line(messages: impl IntoIterator<Item = String>) -> String {
    let mut line = String::new();
    for m in messages {
        if line.is_empty() {
            line = m;
        } else if !line.contains(&m) {
            line = format!("{line}: {m}");
        }
    }
    for_user_from_env(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_appends_only_causes_not_quoted() {
        let chain = ["reading x: gone".to_string(), "gone".into(), "disk".into()];
        assert_eq!(one_line(chain), "reading x: gone: disk");
    }

    const TORCH: &str = "libtorch: Internal torch error: index out of range in self\n\
        Exception raised from operator() at /pytorch/aten/src/ATen/native/TensorAdvancedIndexing.cpp:1190 (most recent call first):\n\
        frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f in libc10.so)\n\
        frame #1: <unknown function> + 0x1234 (0x7f in libtorch_cpu.so)\n";

    #[test]
    fn a_torch_error_is_cut_to_its_first_line() {
        assert_eq!(
            without_native_backtrace(TORCH),
            Some("libtorch: Internal torch error: index out of range in self")
        );
        let short = for_user(TORCH, false);
        assert!(short.starts_with("libtorch: Internal torch error: index out of range in self ("));
        assert!(short.contains("RSD_BACKTRACE=1") && !short.contains("frame #"));
        assert_eq!(for_user(TORCH, true), TORCH);
    }

    #[test]
    fn control_characters_are_escaped_and_long_lines_cut() {
        let msg = format!("x.toml: bad\x1b[2J name\n{}", "v".repeat(300_000));
        let shown = for_user(&msg, false);
        assert!(
            shown.starts_with("x.toml: bad\\u{1b}[2J name\nvvv"),
            "{shown}"
        );
        assert!(shown.len() < MAX_LINE_CHARS + 200, "{}", shown.len());
        assert!(shown.ends_with(&format!("({} more characters)", 300_000 - MAX_LINE_CHARS)));
    }

    #[test]
    fn messages_without_a_backtrace_stay_whole() {
        let ours = "rank 1 failed:\nsee its log";
        assert_eq!(without_native_backtrace(ours), None);
        assert_eq!(for_user(ours, false), ours);
    }
}
