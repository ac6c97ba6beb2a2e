//! The packer: turning a stream of tokenized documents into samples of the packing length.
//!
//! * `fixed`: one contiguous stream cut into windows of exactly `len` tokens; a document that
//!   crosses a window edge becomes two pieces, so boundaries are still known.
//! * `mixed`: whole documents placed into samples of at most `len` tokens by best fit over a
//!   bounded set of open samples (documents longer than `len` are first cut into `len`-token
//!   samples). Nothing is padded; the unused room is reported.

use serde::{Deserialize, Serialize};

/// How documents become samples: the shard format's pack mode, as recorded in the manifest.
pub use rsd_shard::PackMode as Mode;

/// What happens to the last, partial window in `fixed` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Tail {
    /// Drop it (counted as dropped tokens).
    Drop,
    /// Keep it as a shorter last sample.
    Keep,
    /// Pad it to `--len` with the pad id (the padding is its own, last piece).
    Pad,
}

/// A sample being built or ready to write: tokens and the lengths of the document pieces in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedSample {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Piece lengths, summing to `tokens.len()`.
    pub pieces: Vec<u32>,
    /// Chat data: the loss mask of `tokens` (1 = a training target); empty otherwise.
    pub mask: Vec<u8>,
}

impl PackedSample {
    fn push_piece(&mut self, piece: &[u32], mask: Option<&[u8]>) {
        self.tokens.extend_from_slice(piece);
        self.pieces.push(piece.len() as u32);
        if let Some(m) = mask {
            self.mask.extend_from_slice(m);
        }
    }
    fn room(&self, len: usize) -> usize {
        len - self.tokens.len()
    }
}

/// Counts kept by the packer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackerCounts {
    /// Padding tokens added.
    pub padding_tokens: u64,
    /// Tokens dropped with the tail.
    pub dropped_tokens: u64,
    /// Tokens dropped by `truncate` (the rest of each source sample after its window).
    #[serde(default)]
    pub truncated_tokens: u64,
    /// With `truncate`: the current source sample's window is complete, so its remaining
    /// documents are dropped. Saved with the counts so a resumed pack goes on exactly.
    #[serde(default)]
    pub sample_window_full: bool,
}

/// The packer. Feed documents with [`Packer::push`]; finished samples are appended to `out` in a
/// deterministic order that depends only on the documents.
#[derive(Debug, Clone)]
pub struct Packer {
    mode: Mode,
    len: usize,
    tail: Tail,
    pad_id: u32,
    max_open: usize,
    /// Keep only the first window of each source sample (`fixed` mode).
    truncate: bool,
    /// Samples still open: one partial window in `fixed` mode, up to `max_open` bins in `mixed`.
    open: Vec<PackedSample>,
    /// Counts so far.
    pub counts: PackerCounts,
}

impl Packer {
    /// A packer for samples of `len` tokens. `max_open` bounds the open bins in `mixed` mode (and so
    /// memory: `max_open × len` tokens).
    pub fn new(mode: Mode, len: usize, tail: Tail, pad_id: u32, max_open: usize) -> Packer {
        Packer {
            mode,
            len: len.max(1),
            tail,
            pad_id,
            max_open: max_open.max(1),
            truncate: false,
            open: Vec::new(),
            counts: PackerCounts::default(),
        }
    }

    /// Keep only the first window of each source sample (`fixed` mode; see the module docs).
    /// Source samples are marked with [`Packer::start_sample`].
    pub fn truncating(mut self, truncate: bool) -> Packer {
        self.truncate = truncate;
        self
    }

    /// A new source sample begins (its first document is pushed next). With `truncate`, the
    /// previous sample's window is closed (a partial one by the tail rule); otherwise nothing
    /// happens.
    pub fn start_sample(&mut self, out: &mut Vec<PackedSample>) {
        if self.truncate {
            self.close_open(out);
            self.counts.sample_window_full = false;
        }
    }

    /// Add one document, with its loss mask for chat data (one entry per id; the packer
    /// cuts it where it cuts the ids).
    pub fn push(&mut self, doc: &[u32], mask: Option<&[u8]>, out: &mut Vec<PackedSample>) {
        match self.mode {
            Mode::Fixed if self.truncate => self.push_truncated(doc, mask, out),
            Mode::Fixed => self.push_fixed(doc, mask, out),
            Mode::Mixed => self.push_mixed(doc, mask, out),
        }
    }

    fn push_truncated(&mut self, doc: &[u32], mask: Option<&[u8]>, out: &mut Vec<PackedSample>) {
        if self.counts.sample_window_full {
            self.counts.truncated_tokens += doc.len() as u64;
            return;
        }
        if self.open.is_empty() {
            self.open.push(PackedSample::default());
        }
        let window = &mut self.open[0];
        let take = window.room(self.len).min(doc.len());
        window.push_piece(&doc[..take], mask.map(|m| &m[..take]));
        self.counts.truncated_tokens += (doc.len() - take) as u64;
        if window.room(self.len) == 0 {
            out.push(self.open.remove(0));
            self.counts.sample_window_full = true;
        }
    }

    fn push_fixed(
        &mut self,
        mut doc: &[u32],
        mut mask: Option<&[u8]>,
        out: &mut Vec<PackedSample>,
    ) {
        while !doc.is_empty() {
            if self.open.is_empty() {
                self.open.push(PackedSample::default());
            }
            let window = &mut self.open[0];
            let take = window.room(self.len).min(doc.len());
            window.push_piece(&doc[..take], mask.map(|m| &m[..take]));
            doc = &doc[take..];
            mask = mask.map(|m| &m[take..]);
            if window.room(self.len) == 0 {
                out.push(self.open.remove(0));
            }
        }
    }

    fn push_mixed(&mut self, doc: &[u32], mask: Option<&[u8]>, out: &mut Vec<PackedSample>) {
        // Whole `len`-token chunks of a long document are samples of their own.
        let whole = doc.len() / self.len * self.len;
        for (k, chunk) in doc[..whole].chunks(self.len).enumerate() {
            let mut s = PackedSample::default();
            s.push_piece(chunk, mask.map(|m| &m[k * self.len..(k + 1) * self.len]));
            out.push(s);
        }
        let rest = &doc[whole..];
        let rest_mask = mask.map(|m| &m[whole..]);
        if rest.is_empty() {
            return;
        }
        // Best fit: the open bin with the least room that still fits; ties go to the oldest.
        let best = self
            .open
            .iter()
            .enumerate()
            .filter(|(_, b)| b.room(self.len) >= rest.len())
            .min_by_key(|(i, b)| (b.room(self.len), *i))
            .map(|(i, _)| i);
        let i = match best {
            Some(i) => i,
            None => {
                self.open.push(PackedSample::default());
                self.open.len() - 1
            }
        };
        self.open[i].push_piece(rest, rest_mask);
        if self.open[i].room(self.len) == 0 {
            out.push(self.open.remove(i));
        } else if self.open.len() > self.max_open {
            // Too many open: close the fullest (the oldest among equals).
            let fullest = self
                .open
                .iter()
                .enumerate()
                .min_by_key(|(i, b)| (b.room(self.len), *i))
                .map(|(i, _)| i)
                .unwrap_or(0);
            out.push(self.open.remove(fullest));
        }
    }

    /// Close everything still open, applying the tail rule in `fixed` mode.
    pub fn finish(&mut self, out: &mut Vec<PackedSample>) {
        self.close_open(out);
    }

    fn close_open(&mut self, out: &mut Vec<PackedSample>) {
        let open = std::mem::take(&mut self.open);
        for mut sample in open {
            if sample.tokens.is_empty() {
                continue;
            }
            match (self.mode, self.tail) {
                (Mode::Mixed, _) | (Mode::Fixed, Tail::Keep) => out.push(sample),
                (Mode::Fixed, Tail::Drop) => {
                    self.counts.dropped_tokens += sample.tokens.len() as u64
                }
                (Mode::Fixed, Tail::Pad) => {
                    let pad = vec![self.pad_id; sample.room(self.len)];
                    if !pad.is_empty() {
                        self.counts.padding_tokens += pad.len() as u64;
                        let pad_mask = (!sample.mask.is_empty()).then(|| vec![0u8; pad.len()]);
                        sample.push_piece(&pad, pad_mask.as_deref());
                    }
                    out.push(sample);
                }
            }
        }
    }

    /// The open samples (for a resume journal).
    pub fn open_samples(&self) -> &[PackedSample] {
        &self.open
    }

    /// Restore open samples and counts saved by a journal.
    pub fn restore(&mut self, open: Vec<PackedSample>, counts: PackerCounts) {
        self.open = open;
        self.counts = counts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs() -> Vec<Vec<u32>> {
        // Lengths 3, 9, 1, 4, 12, 2 with distinct ids so pieces can be traced.
        let lens = [3usize, 9, 1, 4, 12, 2];
        let mut next = 0u32;
        lens.iter()
            .map(|&n| {
                let d: Vec<u32> = (next..next + n as u32).collect();
                next += n as u32;
                d
            })
            .collect()
    }

    fn run(
        mode: Mode,
        tail: Tail,
        len: usize,
        max_open: usize,
    ) -> (Vec<PackedSample>, PackerCounts) {
        let mut p = Packer::new(mode, len, tail, 999, max_open);
        let mut out = vec![];
        for d in docs() {
            p.push(&d, None, &mut out);
        }
        p.finish(&mut out);
        (out, p.counts)
    }

    #[test]
    fn fixed_windows_are_the_stream_cut_every_len_tokens() {
        let (out, counts) = run(Mode::Fixed, Tail::Drop, 5, 1);
        let all: Vec<u32> = docs().concat();
        assert_eq!(out.len(), all.len() / 5);
        for (k, s) in out.iter().enumerate() {
            assert_eq!(s.tokens, all[k * 5..k * 5 + 5]);
            assert_eq!(s.pieces.iter().sum::<u32>(), 5);
        }
        // Boundaries: doc lengths 3,9,1,4,12,2 → cuts at 3,12,13,17,29 → window 0 = [3,2], window 1 = [5], …
        assert_eq!(out[0].pieces, vec![3, 2]);
        assert_eq!(out[1].pieces, vec![5]);
        assert_eq!(out[2].pieces, vec![2, 1, 2]);
        assert_eq!(counts.dropped_tokens, (all.len() % 5) as u64);
    }

    #[test]
    fn truncate_keeps_the_first_window_of_each_source_sample() {
        // Source samples: [docs 0, 1] (3 + 9 tokens), [doc 2] (1), [docs 3, 4, 5] (4 + 12 + 2).
        let d = docs();
        let samples: [&[usize]; 3] = [&[0, 1], &[2], &[3, 4, 5]];
        for tail in [Tail::Drop, Tail::Keep] {
            let mut p = Packer::new(Mode::Fixed, 5, tail, 999, 1).truncating(true);
            let mut out = vec![];
            for sample in samples {
                p.start_sample(&mut out);
                for &k in sample {
                    p.push(&d[k], None, &mut out);
                }
            }
            p.finish(&mut out);
            let first = [d[0].clone(), d[1].clone()].concat();
            let third = [d[3].clone(), d[4].clone()].concat();
            let mut want = vec![first[..5].to_vec()];
            if tail == Tail::Keep {
                want.push(d[2].clone()); // the 1-token sample, shorter than a window
            }
            want.push(third[..5].to_vec());
            let got: Vec<Vec<u32>> = out.iter().map(|s| s.tokens.clone()).collect();
            assert_eq!(got, want, "{tail:?}");
            assert_eq!(
                out[0].pieces,
                vec![3, 2],
                "document boundaries inside the window"
            );
            // Sample 0 loses 7 of its 12 tokens, sample 2 loses 13 of its 18.
            assert_eq!(p.counts.truncated_tokens, 7 + 13);
            let dropped = if tail == Tail::Drop { 1 } else { 0 };
            assert_eq!(p.counts.dropped_tokens, dropped);
        }
    }

    #[test]
    fn fixed_tail_keep_and_pad() {
        let total: usize = docs().iter().map(Vec::len).sum(); // 31
        let (kept, _) = run(Mode::Fixed, Tail::Keep, 5, 1);
        assert_eq!(kept.last().unwrap().tokens.len(), total % 5);
        let (padded, counts) = run(Mode::Fixed, Tail::Pad, 5, 1);
        let last = padded.last().unwrap();
        assert_eq!(last.tokens.len(), 5);
        assert_eq!(*last.pieces.last().unwrap() as usize, 5 - total % 5);
        assert!(last.tokens[total % 5..].iter().all(|&t| t == 999));
        assert_eq!(counts.padding_tokens, (5 - total % 5) as u64);
    }

    #[test]
    fn mixed_keeps_documents_whole_unless_longer_than_len() {
        let (out, counts) = run(Mode::Mixed, Tail::Drop, 10, 4);
        assert_eq!(counts, PackerCounts::default());
        let mut seen: Vec<u32> = out.iter().flat_map(|s| s.tokens.clone()).collect();
        seen.sort();
        assert_eq!(seen, docs().concat(), "every token exactly once");
        for s in &out {
            assert!(s.tokens.len() <= 10);
            // Every piece is a whole document, or a chunk of the 12-token one (10 + 2).
            let mut at = 0;
            for &p in &s.pieces {
                let piece = &s.tokens[at..at + p as usize];
                assert!(
                    piece.windows(2).all(|w| w[1] == w[0] + 1),
                    "a piece is contiguous ids: {piece:?}"
                );
                at += p as usize;
            }
        }
        let doc_lens: Vec<u32> = out.iter().flat_map(|s| s.pieces.clone()).collect();
        assert_eq!(doc_lens.iter().filter(|&&p| p == 12).count(), 0);
        assert!(doc_lens.contains(&10) && doc_lens.contains(&2));
    }

    #[test]
    fn mixed_best_fit_fills_bins() {
        // 3+4+2+1 fit in one 10-bin after 9 opens its own: best fit puts 1 with 9.
        let (out, _) = run(Mode::Mixed, Tail::Drop, 10, 8);
        let full = out.iter().filter(|s| s.tokens.len() == 10).count();
        assert!(full >= 2, "{out:?}");
    }

    #[test]
    fn restore_continues_identically() {
        let all = docs();
        let (expected, _) = run(Mode::Mixed, Tail::Drop, 7, 2);
        let mut p = Packer::new(Mode::Mixed, 7, Tail::Drop, 0, 2);
        let mut out = vec![];
        for d in &all[..3] {
            p.push(d, None, &mut out);
        }
        let mut q = Packer::new(Mode::Mixed, 7, Tail::Drop, 0, 2);
        q.restore(p.open_samples().to_vec(), p.counts);
        for d in &all[3..] {
            q.push(d, None, &mut out);
        }
        q.finish(&mut out);
        assert_eq!(out, expected);
    }
}
