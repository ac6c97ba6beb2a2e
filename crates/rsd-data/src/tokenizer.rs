//! The project's tokenizer type: a Hugging Face `tokenizer.json` behind one small interface, so the
//! engine can be swapped.
//!
//! The engine is the `tokenizers` 1.0 pipeline encoder (`canonicalize_str` + `from_json`,
//! `encode_into`): several times faster than `tokenizers` 0.22 with identical ids
//! (docs/BENCHMARKS.md). For a `tokenizer.json` it cannot load we fall back to 0.22 and say so.

use std::path::Path;

use rsd_common::safe_fs::{read_regular, MAX_METADATA_BYTES};
use serde_json::Value;
use tokenizers::pipeline::{EncodeOptions, PipelineToken, PipelineTokenizer};

use crate::error::{DataError, Result};

/// The Qwen3 tokenizer (Apache-2.0), compressed into the binary so `rsd-data` works out of the box.
const BUNDLED_QWEN3: &[u8] = include_bytes!("../../../assets/tokenizers/qwen3/tokenizer.json.zst");
/// Name of the bundled tokenizer, as `--tokenizer` accepts it and manifests record it.
pub const BUNDLED_NAME: &str = "bundled:qwen3";
/// The bundled Qwen3 tokenizer's `tokenizer_config.json` (its chat template and special tokens),
/// for `pack --chat` without `--tokenizer`.
pub const BUNDLED_QWEN3_CONFIG: &str =
    include_str!("../../../assets/tokenizers/qwen3/tokenizer_config.json");

enum Engine {
    Pipeline(Box<PipelineTokenizer>),
    Legacy(Box<tokenizers_v0::Tokenizer>),
}

/// A loaded tokenizer with its identity (name, sha256) and document delimiters.
pub struct Tokenizer {
    engine: Engine,
    name: String,
    sha256: String,
    vocab_size: u64,
    bos: Option<u32>,
    eos: Option<u32>,
    /// The `tokenizer.json` bytes (copied into the shard directory).
    json: Vec<u8>,
    /// Set when the fast engine could not load the file and the legacy one is in use.
    pub fallback_reason: Option<String>,
}

/// Which special token goes around each document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delimiter {
    /// Take it from the tokenizer (its post-processor template for BOS; a known end-of-text token for EOS).
    Auto,
    /// No token.
    None,
    /// This token (by its text, e.g. `<|endoftext|>`, or by a numeric id).
    Token(String),
}

impl Delimiter {
    /// Parse `auto`, `none`, a token string or an id.
    pub fn parse(s: &str) -> Delimiter {
        match s {
            "auto" => Delimiter::Auto,
            "none" => Delimiter::None,
            other => Delimiter::Token(other.to_string()),
        }
    }
}

/// A BOS/EOS id for messages: the id, or `none` as `--bos`/`--eos` spell its absence.
pub fn id_or_none(id: Option<u32>) -> String {
    id.map_or_else(|| "none".to_string(), |id| id.to_string())
}

/// The most bytes of text handed to the tokenizer in one call (see [`Tokenizer::encode_into`]):
/// what one call then holds is bounded (tens of MiB for a megabyte-long word), whatever the
/// document's size.
pub const ENCODE_PIECE_BYTES: usize = 1 << 20;

/// Where the first piece of `text` ends: all of it when it has at most `max` bytes; else before
/// the last space between two ASCII letters or digits in the second half of its first `max`
/// bytes; else at the last character boundary within them (never 0).
fn piece_end(text: &str, max: usize) -> usize {
    if text.len() <= max {
        return text.len();
    }
    let mut end = max;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    if end == 0 {
        // `max` is smaller than the first character: the piece is that character.
        return text.chars().next().map_or(text.len(), char::len_utf8);
    }
    let bytes = text.as_bytes();
    // `p + 1 <= end < text.len()`: both neighbours exist.
    (end / 2..end)
        .rev()
        .find(|&p| {
            p > 0
                && bytes[p] == b' '
                && bytes[p - 1].is_ascii_alphanumeric()
                && bytes[p + 1].is_ascii_alphanumeric()
        })
        .unwrap_or(end)
}

/// Start-of-document tokens, looked for when the post-processor template names none (some copies of
/// the Llama-3 tokenizer ship with a bare ByteLevel post-processor).
const BOS_CANDIDATES: &[&str] = &["<|begin_of_text|>", "<s>", "<bos>"];
/// End-of-document tokens of the tokenizers people use, in the order we look for them.
const EOS_CANDIDATES: &[&str] = &[
    "<|end_of_text|>",
    "<|endoftext|>",
    "</s>",
    "<eos>",
    "<|eos|>",
];

impl Tokenizer {
    /// Load `spec`: a path to a `tokenizer.json`, or [`BUNDLED_NAME`].
    pub fn load(spec: &str, bos: &Delimiter, eos: &Delimiter) -> Result<Tokenizer> {
        let (name, bytes) = if spec == BUNDLED_NAME || spec == "bundled" {
            let bytes = zstd::decode_all(BUNDLED_QWEN3).map_err(|e| DataError::Tokenizer {
                name: BUNDLED_NAME.into(),
                what: format!("bundled copy is damaged: {e}"),
            })?;
            (BUNDLED_NAME.to_string(), bytes)
        } else {
            let path = Path::new(spec);
            let path = if path.is_dir() {
                path.join("tokenizer.json")
            } else {
                path.to_path_buf()
            };
            // A regular file of bounded size: a FIFO or a device named as a tokenizer is refused.
            let bytes = read_regular(&path, MAX_METADATA_BYTES, "tokenizer.json")?;
            (path.display().to_string(), bytes)
        };
        Self::from_bytes(&name, &bytes, bos, eos)
    }

    /// Load from the bytes of a `tokenizer.json`; `name` is used in messages and the manifest.
    pub fn from_bytes(
        name: &str,
        bytes: &[u8],
        bos: &Delimiter,
        eos: &Delimiter,
    ) -> Result<Tokenizer> {
        let err = |what: String| DataError::Tokenizer {
            name: name.to_string(),
            what,
        };
        let text = std::str::from_utf8(bytes)
            .map_err(|e| err(format!("not UTF-8 at byte {}", e.valid_up_to())))?;
        let json: Value = serde_json::from_str(text).map_err(|e| {
            err(format!(
                "not valid JSON (line {}, column {}): {e}",
                e.line(),
                e.column()
            ))
        })?;
        let sha256 = rsd_common::digest::sha256_hex(bytes);
        let vocab_size = vocab_size(&json)
            .ok_or_else(|| err("no model.vocab or added_tokens: not a tokenizer.json".into()))?;

        // The fast encoder can load some files it then cannot encode with (e.g. a `Split` regex
        // with look-around needs a backend it was built without), so a short probe text covering
        // letters, digits, spaces, punctuation and non-ASCII must encode too.
        const PROBE: &str = "Hello, World! 42 + 3.14\n\tüñïçødé — 漢字 🙂 'll don't  end";
        let (engine, fallback_reason) = match tokenizers::canonicalize_str(text)
            .map_err(|e| e.to_string())
            .and_then(|canonical| tokenizers::from_json(&canonical).map_err(|e| e.to_string()))
            .and_then(|t| {
                let mut probe = Vec::new();
                t.encode_into(PROBE, &plain_encode(), &mut probe)
                    .map(|_| t)
                    .map_err(|e| format!("it loads but cannot encode: {e}"))
            }) {
            Ok(t) => (Engine::Pipeline(Box::new(t)), None),
            Err(reason) => {
                let legacy = tokenizers_v0::Tokenizer::from_bytes(bytes)
                    .map_err(|e| err(format!("cannot be loaded by the fast encoder ({reason}) nor by tokenizers 0.22 ({e})")))?;
                (Engine::Legacy(Box::new(legacy)), Some(reason))
            }
        };
        let mut tok = Tokenizer {
            engine,
            name: name.to_string(),
            sha256,
            vocab_size,
            bos: None,
            eos: None,
            json: bytes.to_vec(),
            fallback_reason,
        };
        let special = added_tokens(&json);
        let find = |candidates: &[&str]| {
            candidates
                .iter()
                .find(|c| special.iter().any(|s| s == *c))
                .map(|s| s.to_string())
        };
        let auto_bos = template_bos(&json).or_else(|| find(BOS_CANDIDATES));
        tok.bos = tok.resolve_delimiter(bos, auto_bos.as_deref(), "BOS")?;
        let auto_eos = find(EOS_CANDIDATES);
        tok.eos = tok.resolve_delimiter(eos, auto_eos.as_deref(), "EOS")?;
        Ok(tok)
    }

    fn resolve_delimiter(
        &self,
        want: &Delimiter,
        auto: Option<&str>,
        what: &str,
    ) -> Result<Option<u32>> {
        let token = match want {
            Delimiter::None => return Ok(None),
            Delimiter::Auto => match auto {
                Some(t) => t.to_string(),
                None => return Ok(None),
            },
            Delimiter::Token(t) => t.clone(),
        };
        if let Ok(id) = token.parse::<u32>() {
            if (id as u64) < self.vocab_size {
                return Ok(Some(id));
            }
        }
        self.token_to_id(&token).map(Some).ok_or_else(|| DataError::Tokenizer {
            name: self.name.clone(),
            what: format!("{what} token \"{token}\" is not in the vocabulary; pass an id, a token it has, or `none`"),
        })
    }

    /// The id of a token string, if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.engine {
            Engine::Pipeline(t) => t.get_added_vocabulary().token_to_id(token).or_else(|| {
                // Plain vocabulary entries: encode and accept a single-id result that decodes back.
                let mut out = Vec::new();
                t.encode_into(token, &plain_encode(), &mut out).ok()?;
                (out.len() == 1).then(|| out[0].id())
            }),
            Engine::Legacy(t) => t.token_to_id(token),
        }
    }

    /// Append the ids of `text` (no BOS/EOS; special-token literals in the text become their ids,
    /// as Hugging Face tokenizers do by default).
    ///
    /// Text longer than [`ENCODE_PIECE_BYTES`] is encoded in pieces of at most that size, so that
    /// the tokenizer's working memory is bounded whatever the document: a BPE tokenizer holds
    /// tens of bytes per byte of a word it merges, and a document that is one 200 MiB word would
    /// take gigabytes. Pieces end before a space between two ASCII letters or digits, where the
    /// pre-tokenizers of byte-level BPE tokenizers (GPT-2, Llama 3, Qwen) cut the text anyway, so
    /// their ids are the same as in one call; only a piece with no such space (a single word of
    /// a megabyte) is cut where it reaches the size, which can change the ids next to that cut.
    pub fn encode_into(
        &self,
        text: &str,
        scratch: &mut Vec<PipelineToken>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        self.encode_in_pieces(text, ENCODE_PIECE_BYTES, scratch, out)
    }

    /// [`Tokenizer::encode_into`] with pieces of at most `max` bytes.
    fn encode_in_pieces(
        &self,
        text: &str,
        max: usize,
        scratch: &mut Vec<PipelineToken>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let mut rest = text;
        while !rest.is_empty() {
            let cut = piece_end(rest, max);
            self.encode_piece(&rest[..cut], scratch, out)?;
            rest = &rest[cut..];
        }
        Ok(())
    }

    /// [`Tokenizer::encode_into`] of one piece, in one call to the engine.
    fn encode_piece(
        &self,
        text: &str,
        scratch: &mut Vec<PipelineToken>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        match &self.engine {
            Engine::Pipeline(t) => {
                scratch.clear();
                t.encode_into(text, &plain_encode(), scratch).map_err(|e| {
                    DataError::Tokenizer {
                        name: self.name.clone(),
                        what: format!("encode failed: {e}"),
                    }
                })?;
                out.extend_from_slice(PipelineToken::cast_slice(scratch));
            }
            Engine::Legacy(t) => {
                let enc = t
                    .encode_fast(text, false)
                    .map_err(|e| DataError::Tokenizer {
                        name: self.name.clone(),
                        what: format!("encode failed: {e}"),
                    })?;
                out.extend_from_slice(enc.get_ids());
            }
        }
        Ok(())
    }

    /// A document's ids: BOS, the text's ids, EOS.
    pub fn encode_document(
        &self,
        text: &str,
        scratch: &mut Vec<PipelineToken>,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        out.extend(self.bos);
        self.encode_into(text, scratch, &mut out)?;
        out.extend(self.eos);
        Ok(out)
    }

    /// Text for `ids` (special tokens included).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let r = match &self.engine {
            Engine::Pipeline(t) => t.decode(ids, false).map_err(|e| e.to_string()),
            Engine::Legacy(t) => t.decode(ids, false).map_err(|e| e.to_string()),
        };
        r.map_err(|e| DataError::Tokenizer {
            name: self.name.clone(),
            what: format!("decode failed: {e}"),
        })
    }

    /// Name (path or bundled name).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// sha256 of the `tokenizer.json` bytes.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
    /// Number of ids (largest id + 1).
    pub fn vocab_size(&self) -> u64 {
        self.vocab_size
    }
    /// BOS id put before each document.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    /// EOS id put after each document.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// The `tokenizer.json` bytes this tokenizer was loaded from.
    pub fn json_bytes(&self) -> &[u8] {
        &self.json
    }
    /// Which engine encodes: `pipeline` (fast) or `legacy` (tokenizers 0.22).
    pub fn engine_name(&self) -> &'static str {
        match self.engine {
            Engine::Pipeline(_) => "pipeline (tokenizers 1.0.0-rc.3)",
            Engine::Legacy(_) => "legacy (tokenizers 0.22)",
        }
    }
}

/// Turns pre-tokenized ids (MDS) back into text for re-tokenizing with another tokenizer.
///
/// Decoding is `tokenizers` 0.22's `decode(ids, skip_special_tokens = true)`, the very code behind
/// Python's `Tokenizer.decode(ids, skip_special_tokens=True)`, so a re-tokenized pack is what the
/// same steps give in Python. Special tokens are dropped: the document delimiters of the source
/// (Llama-3's BOS/EOS) are replaced by the target's, added around the re-encoded text.
pub struct SourceDecoder {
    /// The source tokenizer (its identity and vocabulary).
    pub tokenizer: Tokenizer,
    decoder: tokenizers_v0::Tokenizer,
}

impl SourceDecoder {
    /// Wraps a loaded source tokenizer.
    pub fn new(tokenizer: Tokenizer) -> Result<SourceDecoder> {
        let decoder =
            tokenizers_v0::Tokenizer::from_bytes(tokenizer.json_bytes()).map_err(|e| {
                DataError::Tokenizer {
                    name: tokenizer.name().to_string(),
                    what: format!("cannot be loaded for decoding by tokenizers 0.22: {e}"),
                }
            })?;
        Ok(SourceDecoder { tokenizer, decoder })
    }

    /// The text of `ids`, special tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decoder
            .decode(ids, true)
            .map_err(|e| DataError::Tokenizer {
                name: self.tokenizer.name().to_string(),
                what: format!("decode failed: {e}"),
            })
    }
}

/// Largest id in `model.vocab` (map or Unigram list) and `added_tokens`, plus one.
fn vocab_size(json: &Value) -> Option<u64> {
    let mut max: Option<u64> = None;
    let mut bump = |id: u64| max = Some(max.map_or(id, |m: u64| m.max(id)));
    match json.pointer("/model/vocab") {
        Some(Value::Object(map)) => map.values().filter_map(Value::as_u64).for_each(&mut bump),
        Some(Value::Array(list)) if !list.is_empty() => bump(list.len() as u64 - 1),
        _ => {}
    }
    if let Some(Value::Array(added)) = json.get("added_tokens") {
        added
            .iter()
            .filter_map(|t| t.get("id").and_then(Value::as_u64))
            .for_each(&mut bump);
    }
    max.map(|m| m + 1)
}

/// The contents of the special added tokens (auto-detection only trusts these: `</s>` or `<s>` can
/// also be ordinary BPE entries).
fn added_tokens(json: &Value) -> Vec<String> {
    let Some(Value::Array(added)) = json.get("added_tokens") else {
        return vec![];
    };
    added
        .iter()
        .filter(|t| t.get("special").and_then(Value::as_bool).unwrap_or(false))
        .filter_map(|t| t.get("content").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// The special token a TemplateProcessing post-processor puts first (Llama-3's `<|begin_of_text|>`).
fn template_bos(json: &Value) -> Option<String> {
    let single = json.pointer("/post_processor/single").or_else(|| {
        // Sequence post-processors (Llama-3 wraps ByteLevel + TemplateProcessing in one).
        json.pointer("/post_processor/processors")?
            .as_array()?
            .iter()
            .find_map(|p| p.get("single"))
    })?;
    let first = single.as_array()?.first()?;
    first
        .pointer("/SpecialToken/id")?
        .as_str()
        .map(str::to_string)
}

/// How documents are encoded: no template BOS/EOS (the packer adds them as configured), special-token
/// literals in the text still becoming their ids.
fn plain_encode() -> EncodeOptions {
    EncodeOptions {
        add_special_tokens: false,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundled() -> Tokenizer {
        Tokenizer::load(BUNDLED_NAME, &Delimiter::None, &Delimiter::None).unwrap()
    }

    fn encode(tok: &Tokenizer, text: &str, max: usize) -> Vec<u32> {
        let (mut scratch, mut out) = (vec![], vec![]);
        tok.encode_in_pieces(text, max, &mut scratch, &mut out)
            .unwrap();
        out
    }

    #[test]
    fn pieces_end_before_a_space_between_words_and_on_char_boundaries() {
        assert_eq!(piece_end("short", 10), 5);
        assert_eq!(piece_end("hello world again", 12), 11);
        // No space between words: cut at the size, on a character boundary.
        assert_eq!(piece_end("ééééé", 5), 4);
        assert_eq!(piece_end("漢字", 1), 3);
        assert_eq!(piece_end("a  b", 3), 3);
    }

    #[test]
    fn text_encoded_in_pieces_has_the_ids_of_one_call() {
        let tok = bundled();
        let text =
            "The quick brown fox, 42 times: ünïcode 漢字 don't stop.\n\tNext line  two  spaces "
                .repeat(200);
        let whole = encode(&tok, &text, usize::MAX);
        for max in [64, 100, 333, 4096] {
            assert_eq!(encode(&tok, &text, max), whole, "pieces of {max} bytes");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Any text, any piece size: the pieces cover the text exactly, on character boundaries.
        #[test]
        fn pieces_cover_the_text(text in "\\PC{0,300}", max in 1usize..64) {
            let mut rest = text.as_str();
            let mut joined = String::new();
            while !rest.is_empty() {
                let cut = piece_end(rest, max);
                proptest::prop_assert!(cut > 0 && rest.is_char_boundary(cut));
                proptest::prop_assert!(cut <= max.max(4));
                joined.push_str(&rest[..cut]);
                rest = &rest[cut..];
            }
            proptest::prop_assert_eq!(joined, text);
        }
    }
}
