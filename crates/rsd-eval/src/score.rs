//! RULER's metrics, per item in [0, 1] (RULER reports their mean × 100).
//!
//! * [`string_match_all`]: the fraction of expected strings found in the output (case-insensitive
//!   substring), RULER's metric for NIAH, variable tracking, CWE and FWE.
//! * [`string_match_part`]: 1 if any expected string is found (RULER's metric for its QA tasks).
//! * [`substring_exact_match`]: HELMET's metric for JSON KV: the expected string, normalised as
//!   SQuAD's evaluation normalises answers, inside the normalised output.
//! * [`ordinal_match`]: the ordinal variant asks for one of several values of the same key; the
//!   answer counts only if the asked value is found and no other value of that key comes first
//!   (listing every value would otherwise score 1 under `string_match_all`).
use crate::tasks::Item;

/// RULER's `postprocess_pred`: control characters become newlines, surrounding space goes.
pub fn postprocess(output: &str) -> String {
    output
        .chars()
        .map(|c| if (c as u32) < 0x20 { '\n' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// Fraction of `expected` contained in `output`, case-insensitive; 0 for no expected strings.
pub fn string_match_all(output: &str, expected: &[String]) -> f64 {
    if expected.is_empty() {
        return 0.0;
    }
    let out = output.to_lowercase();
    let hits = expected
        .iter()
        .filter(|r| out.contains(&r.to_lowercase()))
        .count();
    hits as f64 / expected.len() as f64
}

/// 1 if any of `expected` is contained in `output` (case-insensitive), else 0.
pub fn string_match_part(output: &str, expected: &[String]) -> f64 {
    let out = output.to_lowercase();
    let hit = expected.iter().any(|r| out.contains(&r.to_lowercase()));
    if hit {
        1.0
    } else {
        0.0
    }
}

/// SQuAD's answer normalisation, as HELMET applies it: lower case, ASCII punctuation removed,
/// the articles a/an/the removed as words, whitespace collapsed.
pub fn normalize_answer(s: &str) -> String {
    let lower: String = s
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    lower
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// HELMET's `substring_exact_match` for JSON KV: 1 if a normalised expected string is inside the
/// normalised output, or inside the text after its first "corresponding value:" (to the end of
/// that line), as HELMET also scores the parsed output and keeps the better; else 0.
pub fn substring_exact_match(output: &str, expected: &[String]) -> f64 {
    let parsed = {
        let lower = output.to_lowercase();
        match lower.find("corresponding value:") {
            Some(i) => {
                let rest = &output[i + "corresponding value:".len()..];
                rest.split('\n').next().unwrap_or(rest).to_string()
            }
            None => output.split('\n').next().unwrap_or(output).to_string(),
        }
    };
    let hit = |text: &str| {
        let t = normalize_answer(text);
        expected.iter().any(|e| t.contains(&normalize_answer(e)))
    };
    if hit(output) || hit(&parsed) {
        1.0
    } else {
        0.0
    }
}

/// 1 if `expected[0]` is in `output` and none of `distractors` occurs before it, else 0.
pub fn ordinal_match(output: &str, expected: &[String], distractors: &[String]) -> f64 {
    let out = output.to_lowercase();
    let Some(at) = expected.first().and_then(|e| out.find(&e.to_lowercase())) else {
        return 0.0;
    };
    let earlier = distractors
        .iter()
        .filter_map(|d| out.find(&d.to_lowercase()))
        .any(|d| d < at);
    if earlier {
        0.0
    } else {
        1.0
    }
}

/// The score of a model's raw completion of `item`, with the task's metric.
pub fn score(item: &Item, output: &str) -> f64 {
    metric(item.task.name(), output, &item.expected, &item.distractors).unwrap_or(0.0)
}

/// The score of a raw completion for the task named `task`, with RULER's metric for it:
/// `string_match_part` for its QA tasks, ours for the ordinal needles (which need the other
/// values of the key as `distractors`), HELMET's `substring_exact_match` for json_kv,
/// `string_match_all` for the rest. The completion is post-processed as RULER does first (except
/// for json_kv, which HELMET scores raw).
pub fn metric(
    task: &str,
    output: &str,
    expected: &[String],
    distractors: &[String],
) -> Result<f64, String> {
    if task == "json_kv" {
        return Ok(substring_exact_match(output, expected));
    }
    let out = postprocess(output);
    Ok(if task.starts_with("qa_") {
        string_match_part(&out, expected)
    } else if task.starts_with("niah_ordinal_") {
        if distractors.is_empty() {
            return Err(format!(
                "{task} is scored against the key's other values: no \"distractors\" list"
            ));
        }
        ordinal_match(&out, expected, distractors)
    } else {
        string_match_all(&out, expected)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn match_all_counts_the_fraction_found_case_insensitively() {
        let exp = s(&["1234567", "7654321", "ABCDE", "zzz"]);
        assert_eq!(string_match_all(" 1234567 and 7654321, abcde.", &exp), 0.75);
        assert_eq!(string_match_all("nothing", &exp), 0.0);
        assert_eq!(string_match_all("zzz abcde 7654321 1234567", &exp), 1.0);
        assert_eq!(string_match_all("anything", &[]), 0.0);
    }

    #[test]
    fn match_part_needs_one() {
        let exp = s(&["Paris", "France"]);
        assert_eq!(string_match_part("it is paris", &exp), 1.0);
        assert_eq!(string_match_part("it is rome", &exp), 0.0);
    }

    #[test]
    fn ordinal_needs_the_asked_value_before_the_others() {
        let exp = s(&["2222222"]);
        let others = s(&["1111111", "3333333"]);
        assert_eq!(ordinal_match(" 2222222.", &exp, &others), 1.0);
        assert_eq!(ordinal_match(" 2222222, then 1111111", &exp, &others), 1.0);
        assert_eq!(
            ordinal_match(" 1111111, 2222222, 3333333", &exp, &others),
            0.0
        );
        assert_eq!(ordinal_match(" 3333333", &exp, &others), 0.0);
    }

    /// HELMET's normalisation drops hyphens, so a UUID matches with or without them; articles
    /// only go as whole words.
    #[test]
    fn substring_exact_match_normalises_as_helmet() {
        let exp = s(&["0b423716-b76a-41eb-8221-c76e15e9efc2"]);
        assert_eq!(normalize_answer("The  Cat, an apple!"), "cat apple");
        assert_eq!(normalize_answer("theme"), "theme");
        assert_eq!(
            substring_exact_match(" 0B423716-B76A-41eb-8221-c76e15e9efc2\nKey: x", &exp),
            1.0
        );
        assert_eq!(
            substring_exact_match("0b423716b76a41eb8221c76e15e9efc2", &exp),
            1.0
        );
        assert_eq!(substring_exact_match("0b423716-b76a-41eb", &exp), 0.0);
        assert_eq!(
            metric(
                "json_kv",
                " 0b423716-b76a-41eb-8221-c76e15e9efc2",
                &exp,
                &[]
            ),
            Ok(1.0)
        );
    }

    #[test]
    fn postprocess_turns_control_characters_into_newlines_and_trims() {
        assert_eq!(postprocess("  7342\t1\u{0}x \n"), "7342\n1\nx");
    }
}
