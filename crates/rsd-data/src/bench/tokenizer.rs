//! `rsd-data tokenize-bench`: how fast the tokenizer alone encodes some sources' text.

use std::time::Instant;

use rayon::prelude::*;

use crate::error::{DataError, Result};
use crate::paths;
use crate::source::{self, Content, DocumentStream, ReadOptions};
use crate::tokenizer::{Delimiter, Tokenizer, BUNDLED_NAME};

/// What to measure.
#[derive(Debug, Clone)]
pub struct TokenizeBenchRequest {
    /// Sources, as for a pack (`prolong/<subset>` under the corpora data root).
    pub sources: Vec<String>,
    /// Tokenizer (default: the bundled one).
    pub tokenizer: Option<String>,
    /// Tokenizer threads.
    pub workers: usize,
    /// Text read into memory first, at most (whole documents: the last one may cross it).
    pub max_bytes: u64,
    /// Timed passes over the text (at least 1).
    pub repeat: usize,
    /// JSONL field / column holding the text.
    pub text_field: String,
}

/// What was measured.
#[derive(Debug, Clone)]
pub struct TokenizeBenchReport {
    /// The encoder ([`Tokenizer::engine_name`]).
    pub engine: &'static str,
    /// Threads used.
    pub workers: usize,
    /// Documents encoded per pass.
    pub documents: usize,
    /// Text bytes encoded per pass.
    pub bytes: u64,
    /// Tokens per pass.
    pub tokens: usize,
    /// The best pass, in seconds.
    pub best_seconds: f64,
    /// The first pass (what a pack does: each document once, cold tokenizer caches), in seconds.
    pub first_seconds: f64,
}

/// Read up to `max_bytes` of text, then time `repeat` passes of encoding it on `workers` threads.
pub fn run(request: &TokenizeBenchRequest) -> Result<TokenizeBenchReport> {
    let tok = Tokenizer::load(
        request.tokenizer.as_deref().unwrap_or(BUNDLED_NAME),
        &Delimiter::None,
        &Delimiter::None,
    )?;
    let root = paths::data_root(None, paths::CORPORA_DEFAULT);
    let sources = request
        .sources
        .iter()
        .map(|s| source::resolve(s, None, &root, 0))
        .collect::<Result<Vec<_>>>()?;
    let mut texts = vec![];
    let mut bytes = 0u64;
    for doc in DocumentStream::new(sources, ReadOptions::new(&request.text_field)) {
        if let Content::Text(t) = doc?.content.decode()? {
            bytes += t.len() as u64;
            texts.push(t);
        }
        if bytes >= request.max_bytes {
            break;
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(request.workers.max(1))
        .build()
        .map_err(|e| {
            DataError::Config(format!(
                "cannot start {} worker threads: {e}",
                request.workers
            ))
        })?;
    let mut best = f64::INFINITY;
    let mut first = None;
    let mut tokens = 0usize;
    for _ in 0..request.repeat.max(1) {
        let start = Instant::now();
        tokens = pool.install(|| {
            texts
                .par_iter()
                .map_init(Vec::new, |scratch, t| {
                    let mut out = Vec::new();
                    tok.encode_into(t, scratch, &mut out).map(|_| out.len())
                })
                .try_reduce(|| 0, |x, y| Ok(x + y))
        })?;
        let secs = start.elapsed().as_secs_f64();
        first.get_or_insert(secs);
        best = best.min(secs);
    }
    Ok(TokenizeBenchReport {
        engine: tok.engine_name(),
        workers: request.workers,
        documents: texts.len(),
        bytes,
        tokens,
        best_seconds: best,
        first_seconds: first.unwrap_or(best),
    })
}
