//! The text haystacks are cut from: the bundled books, a directory of text files, RULER's essay
//! file, or rsd shards decoded with the model's tokenizer.
use super::*;

/// Words held compactly: their text once, separated by single spaces, and where each ends. A
/// `String` per word would cost its 24-byte header and an allocation besides its letters, six
/// to ten times the text of a haystack of short words.
#[derive(Debug, Clone, Default)]
pub(super) struct Words {
    text: String,
    /// `ends[i]`: the byte offset just past word `i` in `text`; word `i` starts one byte past
    /// the previous end (the space), word 0 at 0.
    ends: Vec<usize>,
}

impl Words {
    /// Number of words.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Word `i` (`i < len()`).
    pub(super) fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] + 1 };
        &self.text[start..self.ends[i]]
    }

    /// Words `from..to`, joined by single spaces.
    #[cfg(test)]
    pub(super) fn joined(&self, from: usize, to: usize) -> &str {
        if from >= to {
            return "";
        }
        let start = if from == 0 {
            0
        } else {
            self.ends[from - 1] + 1
        };
        &self.text[start..self.ends[to - 1]]
    }

    fn push(&mut self, w: &str) {
        if !self.ends.is_empty() {
            self.text.push(' ');
        }
        self.text.push_str(w);
        self.ends.push(self.text.len());
    }
}

/// The text haystacks are cut from: a long run of words.
#[derive(Debug, Clone)]
pub struct Haystack {
    pub(super) words: Words,
    pub(super) vocabulary: Vec<String>,
    pub(super) sha256: String,
    pub(super) source: String,
}

/// Tokens read from a shard directory used as a haystack (plenty for 1M-token contexts).
const SHARD_HAYSTACK_TOKENS: usize = 4 << 20;

/// The most text a haystack is read from, per file and in all (a 1M-token context takes about
/// 4 MB of words; RULER's essays are 3 MB). Each word is held as its own string, at several times
/// its size, so this bounds the haystack's memory to a few hundred MB.
pub const HAYSTACK_TEXT_LIMIT: u64 = 32 << 20;

/// Where the bundled haystack lies in an rsd checkout.
const BUNDLED_HAYSTACK: &str = "corpus/books";

/// The `*.txt` and `*.md` files of a haystack directory, in name order. A link among them is
/// followed only to a file inside the directory, rsd's one rule for links in input directories
/// (`rsd_common::safe_fs::input_link_target`): a directory someone shared must not put another
/// file's words into prompts, or into `--dump-prompts`.
fn text_files(dir: &Path) -> rsd_common::safe_fs::Result<Vec<PathBuf>> {
    let io = |e| rsd_common::safe_fs::FsError::Io {
        path: dir.to_path_buf(),
        source: e,
    };
    let root = std::fs::canonicalize(dir).map_err(io)?;
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if !matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("txt" | "md")
        ) {
            continue;
        }
        // A link out is refused; a dangling one is no file and left out below.
        rsd_common::safe_fs::input_link_target(&root, dir, &path)?;
        if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

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
        let raw = rsd_common::safe_fs::read_text(path, HAYSTACK_TEXT_LIMIT, "haystack file")
            .map_err(|e| bad(e.to_string()))?;
        let v: serde_json::Value = serde_json::from_str(&raw).map_err(|e| {
            bad(format!(
                "not JSON (line {}, column {}): {}; expected RULER's essay file, {{\"text\": \"…\"}}",
                e.line(),
                e.column(),
                crate::lines::json_message(&e)
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
                // No more of a sample than the haystack still needs: one huge sample is not
                // decoded whole.
                let wanted = s.tokens.len().min(SHARD_HAYSTACK_TOKENS - taken);
                let ids: Vec<i64> = (0..wanted).map(|k| i64::from(s.tokens.get(k))).collect();
                taken += ids.len();
                text.push_str(&tokenizer.decode(&ids)?);
                text.push(' ');
            }
            text
        } else {
            let files = text_files(dir).map_err(|e| bad(e.to_string()))?;
            let mut text = String::new();
            for f in &files {
                let t = rsd_common::safe_fs::read_text(f, HAYSTACK_TEXT_LIMIT, "haystack file")
                    .map_err(|e| bad(e.to_string()))?;
                if (text.len() + t.len()) as u64 > HAYSTACK_TEXT_LIMIT {
                    return Err(bad(format!(
                        "its *.txt/*.md files hold more than {HAYSTACK_TEXT_LIMIT} bytes of text, \
                         the most a haystack is read from (a 1M-token context takes about 4 MB); \
                         use a directory of fewer files"
                    )));
                }
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
        let mut words = Words::default();
        let mut hash = Sha256::new();
        let mut vocabulary: HashSet<String> = HashSet::new();
        for w in text.split_whitespace() {
            words.push(w);
            hash.update(w.as_bytes());
            hash.update(b" ");
            // A word of 3 to 10 ASCII lowercase letters once lowercased qualifies; lowercasing
            // shrinks a character at most threefold (the Kelvin sign), so longer words cannot.
            if w.len() <= 30 {
                let lower = w.to_lowercase();
                if (3..=10).contains(&lower.len()) && lower.bytes().all(|b| b.is_ascii_lowercase())
                {
                    vocabulary.insert(lower);
                }
            }
        }
        let mut vocabulary: Vec<String> = vocabulary.into_iter().collect();
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
        (0..n).map(move |i| self.words.get((start + i) % len))
    }
}
