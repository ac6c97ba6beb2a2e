//! `rsd-data inspect`: a summary of a shard directory that a person can read.

use std::fmt::Write;

use rsd_shard::ShardSet;

use crate::error::Result;
use crate::tokenizer::Tokenizer;

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
    let m = set.manifest();
    let t = &m.totals;
    let mut out = String::new();
    let _ = writeln!(out, "{}", set.dir().display());
    let _ = writeln!(
        out,
        "  created by   {}  ({})",
        m.created_by,
        m.command.join(" ")
    );
    let _ = writeln!(
        out,
        "  tokenizer    {} (vocab {}, sha256 {}…, BOS {:?}, EOS {:?})",
        m.tokenizer.name,
        m.tokenizer.vocab_size,
        &m.tokenizer.sha256[..12.min(m.tokenizer.sha256.len())],
        m.tokenizer.bos_id,
        m.tokenizer.eos_id
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
    let _ = writeln!(
        out,
        "  documents    {} ({} pieces; {} skipped)",
        t.documents, t.pieces, t.skipped_documents
    );
    let slots = t.samples * m.seq_len;
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
            s.spec, s.path, s.format, s.files, s.documents, s.bytes
        );
    }
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
    for &g in show {
        if g >= set.num_samples() {
            let _ = writeln!(
                out,
                "\nsample {g}: out of range ({} samples)",
                set.num_samples()
            );
            continue;
        }
        let s = set.sample(g)?;
        let (shard, local) = set.locate(g)?;
        let _ = writeln!(
            out,
            "\nsample {g} (shard {}, index {local}): {} tokens, pieces {:?}",
            m.shards[shard].prefix,
            s.tokens.len(),
            s.pieces
        );
        match tokenizer {
            Some(tok) => {
                let ids = s.tokens.to_vec();
                let text = tok.decode(&ids[..ids.len().min(chars * 2)])?;
                let clipped: String = text.chars().take(chars).collect();
                let _ = writeln!(
                    out,
                    "{clipped}{}",
                    if text.chars().count() > chars {
                        " …"
                    } else {
                        ""
                    }
                );
            }
            None => {
                let ids = s.tokens.to_vec();
                let _ = writeln!(
                    out,
                    "ids {:?} … (no matching tokenizer to decode with: pass --tokenizer)",
                    &ids[..ids.len().min(32)]
                );
            }
        }
    }
    Ok(out)
}
