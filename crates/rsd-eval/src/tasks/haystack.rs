//! The text haystacks are cut from: the bundled books, a directory of text files, RULER's essay
//! file, or rsd shards decoded with the model's tokenizer.
use super::*;

/// The text haystacks are cut from: a long run of words.
#[derive(Debug, Clone)]
pub struct Haystack {
    pub(super) words: Vec<String>,
    pub(super) vocabulary: Vec<String>,
    pub(super) sha256: String,
    pub(super) source: String,
}

/// Tokens read from a shard directory used as a haystack (plenty for 1M-token contexts).
const SHARD_HAYSTACK_TOKENS: usize = 4 << 20;

/// The largest haystack text file read (a haystack needs a few MB of words).
const HAYSTACK_FILE_LIMIT: u64 = 1 << 30;

/// Where the bundled haystack lies in an rsd checkout.
const BUNDLED_HAYSTACK: &str = "corpus/books";

impl Haystack {
    /// The bundled books: `corpus/books` of the rsd checkout the binary was built in (found
    /// above the binary, wherever the checkout has moved), else of the current directory.
    pub fn bundled_dir() -> Result<PathBuf> {
        let exe = std::env::current_exe().and_then(std::fs::canonicalize).ok();
        let above_exe = exe.iter().flat_map(|e| e.ancestors().skip(1));
        let cwd = std::env::current_dir().ok();
        above_exe
            .chain(cwd.as_deref())
            .map(|d| d.join(BUNDLED_HAYSTACK))
            .find(|d| d.join("moby-dick.txt").is_file())
            .ok_or_else(|| TaskError::Haystack {
                path: PathBuf::from(BUNDLED_HAYSTACK),
                reason: "the bundled books were not found above the rsd-eval binary or in the \
                         current directory (run from the rsd checkout, or pass --haystack DIR)"
                    .into(),
            })
    }

    /// Reads `path`: RULER's essay file (`PaulGrahamEssays.json`, a JSON object whose `"text"` is
    /// the essays' text, as RULER's download script writes it) or a directory ([`Haystack::from_dir`]).
    pub fn from_path(path: &Path, tokenizer: &TextTokenizer) -> Result<Haystack> {
        if !(path.is_file() && path.extension().is_some_and(|e| e == "json")) {
            return Haystack::from_dir(path, tokenizer);
        }
        let bad = |reason: String| TaskError::Haystack {
            path: path.to_path_buf(),
            reason,
        };
        let raw = rsd_common::safe_fs::read_text(path, HAYSTACK_FILE_LIMIT, "haystack file")
            .map_err(|e| bad(e.to_string()))?;
        let v: serde_json::Value = serde_json::from_str(&raw).map_err(|e| {
            bad(format!(
                "not JSON (line {}, column {}): {e}; expected RULER's essay file, {{\"text\": \"…\"}}",
                e.line(),
                e.column()
            ))
        })?;
        let text = v.get("text").and_then(|t| t.as_str()).ok_or_else(|| {
            bad("expected RULER's essay file: a JSON object with a string field \"text\"".into())
        })?;
        let h = Haystack::from_text(text, &path.display().to_string());
        if h.words.len() < 1000 {
            return Err(bad(format!(
                "field \"text\" has only {} words; a haystack needs at least 1000",
                h.words.len()
            )));
        }
        Ok(h)
    }

    /// Reads a directory of text files (`*.txt`, `*.md`, in name order) or of rsd shards
    /// (`index.json`; their tokens are decoded with `tokenizer`).
    pub fn from_dir(dir: &Path, tokenizer: &TextTokenizer) -> Result<Haystack> {
        let bad = |reason: String| TaskError::Haystack {
            path: dir.to_path_buf(),
            reason,
        };
        let text = if dir.join("index.json").is_file() {
            let set = rsd_shard::ShardSet::open(dir).map_err(|e| bad(e.to_string()))?;
            let mut text = String::new();
            let mut taken = 0;
            for i in 0..set.num_samples() {
                if taken >= SHARD_HAYSTACK_TOKENS {
                    break;
                }
                let s = set.sample(i).map_err(|e| bad(e.to_string()))?;
                let ids: Vec<i64> = s.tokens.to_vec().into_iter().map(i64::from).collect();
                taken += ids.len();
                text.push_str(&tokenizer.decode(&ids)?);
                text.push(' ');
            }
            text
        } else {
            let entries = std::fs::read_dir(dir).map_err(|e| bad(e.to_string()))?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && matches!(p.extension().and_then(|e| e.to_str()), Some("txt" | "md"))
                })
                .collect();
            files.sort();
            let mut text = String::new();
            for f in &files {
                let t = rsd_common::safe_fs::read_text(f, HAYSTACK_FILE_LIMIT, "haystack file")
                    .map_err(|e| bad(e.to_string()))?;
                text.push_str(&t);
                text.push(' ');
            }
            text
        };
        let h = Haystack::from_text(&text, &dir.display().to_string());
        if h.words.len() < 1000 {
            return Err(bad(format!(
                "only {} words of text (no *.txt/*.md files or shards with text?); a haystack needs at least 1000",
                h.words.len()
            )));
        }
        Ok(h)
    }

    /// A haystack from text (whitespace-separated words).
    pub fn from_text(text: &str, source: &str) -> Haystack {
        let words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        let mut hash = Sha256::new();
        for w in &words {
            hash.update(w.as_bytes());
            hash.update(b" ");
        }
        let mut vocabulary: Vec<String> = words
            .iter()
            .map(|w| w.to_lowercase())
            .filter(|w| (3..=10).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase()))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        vocabulary.sort();
        Haystack {
            words,
            vocabulary,
            sha256: hex(&hash.finalize()),
            source: source.to_string(),
        }
    }

    /// SHA-256 of the words (whitespace-normalised text): what identifies the haystack in run.json.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Where it was read from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `n` words from `start`, wrapping around.
    pub(super) fn words_from(&self, start: usize, n: usize) -> impl Iterator<Item = &str> {
        let len = self.words.len();
        (0..n).map(move |i| self.words[(start + i) % len].as_str())
    }
}
