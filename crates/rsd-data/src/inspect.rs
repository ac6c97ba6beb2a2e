//! `rsd-data inspect`: a summary of a shard directory that a person can read.

use std::fmt::Write;

use rsd_common::printable::{printable, printable_text};
use rsd_shard::ShardSet;

use crate::error::Result;
use crate::tokenizer::{id_or_none, Tokenizer};

/// Histogram of `values` in `buckets` power-of-two buckets, as text lines.
fn histogram(title: &str, values: &[u64]) -> String {
    let mut out = format!("{title}\n");
    if values.is_empty() {
        out.push_str("  (none)\n");
        return out;
    }
    let mut counts = std::collections::BTreeMap::<u32, u64>::new();
    for &v in values {
        let bucket = if v == 0 { 0 } else { 64 - v.leading_zeros() };
        *counts.entry(bucket).or_default() += 1;
    }
    let max = counts.values().copied().max().unwrap_or(1);
    for (bucket, count) in counts {
        let (lo, hi) = if bucket == 0 {
            (0, 0)
        } else {
            (1u64 << (bucket - 1), (1u64 << bucket) - 1)
        };
        let bar = "#".repeat(((count * 40).div_ceil(max)) as usize);
        let _ = writeln!(out, "  {lo:>9}–{hi:<9} {count:>9}  {bar}");
    }
    out
}

/// Summary, histograms of sample and piece lengths, and the decoded text of `show` samples.
pub fn report(
    set: &ShardSet,
    tokenizer: Option<&Tokenizer>,
    show: &[u64],
    chars: usize,
) -> Result<String> {
    let mut out = String::new();
    summary(&mut out, set);
    histograms(&mut out, set)?;
    for &g in show {
        sample(&mut out, set, tokenizer, g, chars)?;
    }
    Ok(out)
}

/// `[a, b, c]`: a list of ids or lengths for people.
fn list(values: &[u32]) -> String {
    let items: Vec<String> = values.iter().map(u32::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// What the manifest says: origin, tokenizer, layout, counts, waste, sources. Every string of
/// the manifest may come from anyone: each goes through `printable`, so that terminal control
/// sequences in it are shown escaped instead of acting on the terminal.
fn summary(out: &mut String, set: &ShardSet) {
    let m = set.manifest();
    let t = &m.totals;
    let _ = writeln!(out, "{}", printable(&set.dir().display().to_string()));
    let _ = writeln!(
        out,
        "  created by   {}  ({})",
        printable(&m.created_by),
        printable(&m.command.join(" "))
    );
    // The manifest may come from anyone: its digest need not be 12 ASCII hex digits.
    let sha_start: String = m.tokenizer.sha256.chars().take(12).collect();
    let _ = writeln!(
        out,
        "  tokenizer    {} (vocab {}, sha256 {}…, BOS {}, EOS {})",
        printable(&m.tokenizer.name),
        m.tokenizer.vocab_size,
        printable(&sha_start),
        id_or_none(m.tokenizer.bos_id),
        id_or_none(m.tokenizer.eos_id)
    );
    let _ = writeln!(
        out,
        "  layout       {} mode, length {}, {} tokens, {} shards",
        m.mode,
        m.seq_len,
        m.dtype.name(),
        m.shards.len()
    );
    let _ = writeln!(out, "  samples      {}", t.samples);
    let _ = writeln!(out, "  tokens       {}", t.tokens);
    if let Some(mask) = &m.loss_mask {
        let _ = writeln!(
            out,
            "  loss mask    {} tokens are training targets ({} turns; template {}, sha256 {})",
            mask.trained_tokens,
            printable(&mask.train_on),
            printable(&mask.chat_template),
            printable(&mask.chat_template_sha256)
        );
    }
    let _ = writeln!(
        out,
        "  documents    {} ({} pieces; {} skipped)",
        t.documents, t.pieces, t.skipped_documents
    );
    // Counts from the manifest, unchecked by the reader: saturate rather than overflow.
    let slots = t.samples.saturating_mul(m.seq_len);
    let pct = |x: u64| {
        if slots == 0 {
            0.0
        } else {
            100.0 * x as f64 / slots as f64
        }
    };
    let _ = writeln!(
        out,
        "  waste        {} padding ({:.2}%), {} unused slots ({:.2}%), {} tokens dropped",
        t.padding_tokens,
        pct(t.padding_tokens),
        t.unused_slots,
        pct(t.unused_slots),
        t.dropped_tokens
    );
    for s in &m.sources {
        let _ = writeln!(
            out,
            "  source       {} → {} [{}]: {} files, {} documents, {} bytes",
            printable(&s.spec),
            printable(&s.path),
            printable(&s.format),
            s.files,
            s.documents,
            s.bytes
        );
    }
    for b in &t.bad_inputs {
        let _ = writeln!(
            out,
            "  bad input    {} ×{} skipped with --skip-bad: {}",
            printable(&b.cause),
            b.count,
            printable(&b.first)
        );
    }
}

/// Histograms of sample lengths, pieces per sample and piece lengths (reads every sample's index).
fn histograms(out: &mut String, set: &ShardSet) -> Result<()> {
    let mut sample_lens = Vec::new();
    let mut piece_lens = Vec::new();
    let mut pieces_per_sample = Vec::new();
    for g in 0..set.num_samples() {
        let s = set.sample(g)?;
        sample_lens.push(s.tokens.len() as u64);
        pieces_per_sample.push(s.pieces.len() as u64);
        piece_lens.extend(s.pieces.iter().map(|&p| p as u64));
    }
    out.push('\n');
    out.push_str(&histogram("sample length (tokens)", &sample_lens));
    out.push_str(&histogram("document pieces per sample", &pieces_per_sample));
    out.push_str(&histogram("document piece length (tokens)", &piece_lens));
    Ok(())
}

/// `ids` decoded run by run, the runs its loss mask marks as targets between ⟦ and ⟧.
fn marked_text(tok: &Tokenizer, ids: &[u32], mask: &[u8]) -> Result<String> {
    let mut text = String::new();
    let mut start = 0;
    while start < ids.len() {
        let end = start
            + mask[start..]
                .iter()
                .take_while(|&&m| m == mask[start])
                .count();
        let run = tok.decode(&ids[start..end])?;
        if mask[start] == 1 {
            text.push('⟦');
            text.push_str(&run);
            text.push('⟧');
        } else {
            text.push_str(&run);
        }
        start = end;
    }
    Ok(text)
}

/// Sample `g`: where it is, its pieces, and its text (decoded with `tokenizer`, else its first ids).
fn sample(
    out: &mut String,
    set: &ShardSet,
    tokenizer: Option<&Tokenizer>,
    g: u64,
    chars: usize,
) -> Result<()> {
    if g >= set.num_samples() {
        let _ = writeln!(
            out,
            "\nsample {g}: out of range ({} samples)",
            set.num_samples()
        );
        return Ok(());
    }
    let s = set.sample(g)?;
    let (shard, local) = set.locate(g)?;
    let _ = writeln!(
        out,
        "\nsample {g} (shard {}, index {local}): {} tokens, pieces {}",
        printable(&set.manifest().shards[shard].prefix),
        s.tokens.len(),
        list(&s.pieces)
    );
    let ids = s.tokens.to_vec();
    let mask = set.shards()[shard].mask_of(s.bytes.start, s.bytes.end);
    if let Some(mask) = mask {
        let trained = mask.iter().filter(|&&m| m == 1).count();
        let _ = writeln!(
            out,
            "loss mask: {trained} of {} tokens are training targets (shown between ⟦ and ⟧)",
            ids.len()
        );
    }
    match tokenizer {
        Some(tok) => {
            let shown = &ids[..ids.len().min(chars * 2)];
            let text = match mask {
                Some(mask) => marked_text(tok, shown, &mask[..shown.len()])?,
                None => tok.decode(shown)?,
            };
            let clipped: String = text.chars().take(chars).collect();
            // The text is the data's own: it keeps its lines, not its control sequences.
            let _ = writeln!(
                out,
                "{}{}",
                printable_text(&clipped),
                if text.chars().count() > chars {
                    " …"
                } else {
                    ""
                }
            );
            // The decoder drops ids it does not know without a word: say so.
            let vocab = tok.vocab_size();
            let unknown: Vec<u32> = shown
                .iter()
                .copied()
                .filter(|&id| u64::from(id) >= vocab)
                .collect();
            if let Some(first) = unknown.first() {
                let _ = writeln!(
                    out,
                    "({} of these {} ids are outside the tokenizer's {vocab}-id vocabulary and \
                     are not in the text, e.g. {first}: shards of another tokenizer?)",
                    unknown.len(),
                    shown.len()
                );
            }
        }
        None => {
            let _ = writeln!(
                out,
                "ids {} … (no matching tokenizer to decode with: pass --tokenizer)",
                list(&ids[..ids.len().min(32)])
            );
        }
    }
    Ok(())
}
