//! Chat templates: conversations rendered with a model's Jinja template the way transformers'
//! `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=…)` renders
//! them. Evaluation renders a prompt as one user message ([`ChatTemplate::render_user`]); SFT
//! packing renders whole conversations and finds the spans a model is trained on
//! ([`ChatTemplate::render_for_training`]).
//!
//! The template comes from `chat_template.jinja` in the model (or tokenizer) directory, else from
//! `chat_template` in its `tokenizer_config.json` (a string, or HF's list of `{name, template}`
//! where the one named `default` is used), or from a file given explicitly. It is rendered with
//! minijinja set up as transformers sets up Jinja2 (`trim_blocks`, `lstrip_blocks`, loop controls,
//! `raise_exception`, `strftime_now`, Python's string methods through minijinja-contrib's pycompat),
//! with `messages`, `add_generation_prompt` and the special tokens of `tokenizer_config.json`
//! (`bos_token`, `eos_token`, `unk_token`, `pad_token`: strings or `AddedToken` dicts).
use std::path::{Path, PathBuf};

use chrono::format::{Item, StrftimeItems};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// What loading or rendering a chat template can go wrong with.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// `--chat-template` without a template in the directory.
    #[error("{dir} has no chat template (looked for {dir}/chat_template.jinja and the \"chat_template\" key of {dir}/tokenizer_config.json); pass a template file (rsd-eval --chat-template-file, rsd-data pack --chat-template-file)")]
    NotFound {
        /// The model (or tokenizer) directory.
        dir: PathBuf,
    },
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file that is not a regular file, or larger than it may be.
    #[error(transparent)]
    File(#[from] rsd_common::safe_fs::FsError),
    /// tokenizer_config.json is not what it should be.
    #[error("{path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The template does not parse, or rendering it failed (`raise_exception` included).
    #[error("chat template {source_name}: {message}")]
    Template {
        /// Where the template came from (a file, or a key of tokenizer_config.json).
        source_name: String,
        /// minijinja's message (with the line).
        message: String,
    },
}

/// Result alias of this module.
pub type Result<T, E = ChatError> = std::result::Result<T, E>;

const NAME: &str = "chat_template";

/// Steps of the template engine one rendering may take. A real chat template spends a few
/// thousand on a conversation; a runaway one (nested loops of 100,000) stops here instead of
/// running for hours.
const FUEL: u64 = 5_000_000;

/// Rendered bytes allowed beyond the message itself (a template's own text around it, several
/// times over for templates that repeat the system prompt): past that the template is producing
/// output, not formatting a prompt, and rendering stops before it holds gigabytes.
const RENDER_SLACK: usize = 1 << 20;

/// A compiled chat template with the special tokens it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    source_name: String,
    sha256: String,
    bos: Option<String>,
    tokens: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source_name)
            .finish_non_exhaustive()
    }
}

/// A special token of tokenizer_config.json: a string, or an `AddedToken` dict's `content`.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(m) => m.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// The most bytes a chat template or `tokenizer_config.json` may have (real ones hold a few
/// KB; a tokenizer_config.json with every added token, a few MB).
const TEXT_LIMIT: u64 = 64 << 20;

fn read_config(path: &Path) -> Result<Option<Json>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = rsd_common::safe_fs::read_text(path, TEXT_LIMIT, "tokenizer_config.json")?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ChatError::Config {
            path: path.to_path_buf(),
            reason: format!("not valid JSON: {e}"),
        })
}

/// The `chat_template` of a tokenizer_config.json, if it has one.
fn config_template(path: &Path, config: &Json) -> Result<Option<String>> {
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(list)) => {
            let default = list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"));
            match default.and_then(|t| t.get("template")).and_then(Json::as_str) {
                Some(s) => Ok(Some(s.to_string())),
                None => Err(ChatError::Config {
                    path: path.to_path_buf(),
                    reason: "\"chat_template\" is a list of named templates without one named \"default\"".into(),
                }),
            }
        }
        Some(_) => Err(ChatError::Config {
            path: path.to_path_buf(),
            reason: "\"chat_template\" must be a string or a list of {name, template}".into(),
        }),
    }
}

impl ChatTemplate {
    /// The template of a model (or tokenizer) directory: `chat_template.jinja`, else the
    /// `chat_template` of `tokenizer_config.json`; special tokens from that file either way.
    pub fn from_dir(dir: &Path) -> Result<ChatTemplate> {
        let cfg_path = dir.join("tokenizer_config.json");
        let config = read_config(&cfg_path)?;
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            return Self::from_file(&jinja, config.as_ref());
        }
        if let Some(text) = config
            .as_ref()
            .map(|c| config_template(&cfg_path, c))
            .transpose()?
            .flatten()
        {
            let name = format!("\"chat_template\" of {}", cfg_path.display());
            return Self::new(&text, &name, config.as_ref());
        }
        Err(ChatError::NotFound {
            dir: dir.to_path_buf(),
        })
    }

    /// The `chat_template` of a parsed tokenizer_config.json (`name` says where it came from in
    /// messages), with its special tokens; with `file`, that file's template instead.
    pub fn from_config(config: &Json, name: &str, file: Option<&Path>) -> Result<ChatTemplate> {
        if let Some(file) = file {
            return Self::from_file(file, Some(config));
        }
        match config_template(Path::new(name), config)? {
            Some(text) => Self::new(&text, &format!("\"chat_template\" of {name}"), Some(config)),
            None => Err(ChatError::NotFound {
                dir: PathBuf::from(name),
            }),
        }
    }

    /// The template in `path`; special tokens from the tokenizer_config.json of `tokens_from`
    /// (a directory), if it has one.
    pub fn from_file_with_tokens(path: &Path, tokens_from: &Path) -> Result<ChatTemplate> {
        let config = read_config(&tokens_from.join("tokenizer_config.json"))?;
        Self::from_file(path, config.as_ref())
    }

    fn from_file(path: &Path, config: Option<&Json>) -> Result<ChatTemplate> {
        let text = rsd_common::safe_fs::read_text(path, TEXT_LIMIT, "chat template")?;
        Self::new(&text, &path.display().to_string(), config)
    }

    /// Compiles `text` (named `source_name` in errors) with the special tokens of `config` (a
    /// parsed tokenizer_config.json).
    pub fn new(text: &str, source_name: &str, config: Option<&Json>) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        // As transformers' Jinja2 environment.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_err(source_name, &e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(FUEL));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, text.to_string())
            .map_err(|e| template_err(source_name, &e))?;
        let mut tokens = Vec::new();
        for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            if let Some(t) = config.and_then(|c| c.get(key)).and_then(token_text) {
                tokens.push((key, t));
            }
        }
        let bos = tokens
            .iter()
            .find(|(k, _)| *k == "bos_token")
            .map(|(_, t)| t.clone());
        Ok(ChatTemplate {
            env,
            source_name: source_name.to_string(),
            sha256: rsd_common::digest::sha256_hex(text.as_bytes()),
            bos,
            tokens,
        })
    }

    /// Where the template came from.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// SHA-256 of the template's text.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The BOS token's text, if tokenizer_config.json names one.
    pub fn bos(&self) -> Option<&str> {
        self.bos.as_deref()
    }

    /// `content` as the one user message, followed by the generation prompt.
    pub fn render_user(&self, content: &str) -> Result<String> {
        let message = Message {
            role: "user".into(),
            content: content.into(),
        };
        self.render(std::slice::from_ref(&message), true)
    }

    /// `messages` rendered as transformers' `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=add_generation_prompt)` renders them.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let list: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([("role", m.role.as_str()), ("content", m.content.as_str())])
            })
            .collect();
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from(list)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        for (k, t) in &self.tokens {
            ctx.push((k, Value::from(t.as_str())));
        }
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| template_err(&self.source_name, &e))?;
        let content_bytes: usize = messages.iter().map(|m| m.content.len()).sum();
        let limit = 4 * content_bytes + RENDER_SLACK;
        let mut out = CappedOutput {
            bytes: Vec::new(),
            limit,
        };
        match tmpl.render_captured_to(Value::from_pairs(ctx), &mut out) {
            Ok(_) => String::from_utf8(out.bytes).map_err(|_| ChatError::Template {
                source_name: self.source_name.clone(),
                message: "the rendered prompt is not UTF-8".into(),
            }),
            Err(e) if out.bytes.len() >= limit => Err(ChatError::Template {
                source_name: self.source_name.clone(),
                message: format!(
                    "rendering stopped at {limit} bytes (4 × the messages' {content_bytes} + \
                     1 MiB): the template writes far more than a prompt ({e})"
                ),
            }),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(ChatError::Template {
                source_name: self.source_name.clone(),
                message: format!(
                    "rendering stopped after {FUEL} template steps: the template runs far \
                     longer than formatting a conversation takes (a runaway loop?)"
                ),
            }),
            Err(e) => Err(template_err(&self.source_name, &e)),
        }
    }

    /// The conversation rendered whole (no generation prompt), with the byte ranges of the text
    /// a model is trained on, in order.
    ///
    /// An assistant turn's trained text is what the model writes when asked to answer at that
    /// point: the text that rendering `messages[..=i]` adds to rendering `messages[..i]` with the
    /// generation prompt. That is the answer and the tokens that end the turn (`<|im_end|>\n`,
    /// `<|eot_id|>`), and whatever the template opens an answer with beyond the prompt (Qwen3's
    /// empty `<think>` block). Some templates render an earlier turn differently once later
    /// turns follow (Qwen3 drops the `<think>` block of turns before the last question); such a
    /// turn's trained text is located in the whole rendering instead: from the start of its
    /// content to the end of the closing text it had when it was the last turn.
    pub fn render_for_training(
        &self,
        messages: &[Message],
        train_on: TrainOn,
    ) -> std::result::Result<TrainingText, ConversationError> {
        if messages.is_empty() {
            return Err(ConversationError::Empty);
        }
        for (i, m) in messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ConversationError::UnknownRole {
                    message: i,
                    role: m.role.clone(),
                });
            }
        }
        let assistant: Vec<usize> = (0..messages.len())
            .filter(|&i| messages[i].role == "assistant")
            .collect();
        let Some(&last) = assistant.last() else {
            return Err(ConversationError::NoAssistant);
        };
        let text = self.render(messages, false)?;
        let trained = match train_on {
            TrainOn::All => std::iter::once(0..text.len()).collect(),
            TrainOn::Assistant => assistant
                .iter()
                .map(|&i| self.assistant_span(messages, i, &text))
                .collect::<std::result::Result<Vec<_>, _>>()?,
            TrainOn::LastAssistant => vec![self.assistant_span(messages, last, &text)?],
        };
        Ok(TrainingText { text, trained })
    }

    /// The byte range of `full` (the whole conversation rendered) that assistant turn `i`
    /// is trained on (see [`ChatTemplate::render_for_training`]).
    fn assistant_span(
        &self,
        messages: &[Message],
        i: usize,
        full: &str,
    ) -> std::result::Result<std::ops::Range<usize>, ConversationError> {
        let prompt = self.render(&messages[..i], true)?;
        let upto = self.render(&messages[..=i], false)?;
        if upto.starts_with(&prompt) && full.starts_with(&upto) {
            return Ok(prompt.len()..upto.len());
        }
        // The turn renders differently with later turns after it: find its content in `full` by
        // marking the content's start and end, and close it with the text that followed the
        // content when the turn was the last one.
        let unlocatable = || ConversationError::Unlocatable { message: i };
        let marked =
            |at_start: bool, upto_turn: bool| -> std::result::Result<_, ConversationError> {
                let end = if upto_turn { i + 1 } else { messages.len() };
                let mut with_mark = messages[..end].to_vec();
                let c = &mut with_mark[i].content;
                *c = if at_start {
                    format!("{MARK}{c}")
                } else {
                    format!("{c}{MARK}")
                };
                let r = self.render(&with_mark, false)?;
                // Exactly one mark, and the text before it as in the unmarked rendering.
                let at = r.find(MARK).ok_or_else(unlocatable)?;
                if r[at + MARK.len()..].contains(MARK) {
                    return Err(unlocatable());
                }
                Ok((r, at))
            };
        let (r_start, start) = marked(true, false)?;
        let (r_end, end) = marked(false, false)?;
        let (r_upto, end_upto) = marked(false, true)?;
        let closing = &r_upto[end_upto + MARK.len()..];
        if !full.is_char_boundary(start)
            || !full.is_char_boundary(end)
            || full[..start] != r_start[..start]
            || full[..end] != r_end[..end]
            || !full[end..].starts_with(closing)
            || start > end
        {
            return Err(unlocatable());
        }
        Ok(start..end + closing.len())
    }
}

/// A string no conversation holds, used to find where a message's content lands in a
/// rendering (two code points of Unicode's private use area around a tag).
const MARK: &str = "\u{F8FE}rsd-mark\u{F8FF}";

/// The roles a conversation may hold.
pub const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// One message of a conversation (`{"role": …, "content": …}`, the messages format of Tulu-v3
/// and most SFT sets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// Which tokens of a conversation are trained on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrainOn {
    /// Every assistant turn (the default, as Tulu-v3's recipe).
    #[default]
    Assistant,
    /// The last assistant turn only.
    LastAssistant,
    /// The whole rendered conversation.
    All,
}

impl TrainOn {
    /// The name used on the command line and in manifests.
    pub fn name(self) -> &'static str {
        match self {
            TrainOn::Assistant => "assistant",
            TrainOn::LastAssistant => "last-assistant",
            TrainOn::All => "all",
        }
    }
}

/// A conversation rendered for training.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainingText {
    /// The whole conversation, rendered without a generation prompt.
    pub text: String,
    /// Byte ranges of `text` trained on, in order, not overlapping.
    pub trained: Vec<std::ops::Range<usize>>,
}

/// Why a conversation cannot be trained on.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    /// No messages.
    #[error("the conversation has no messages")]
    Empty,
    /// A role outside [`ROLES`].
    #[error("message {message} has role \"{role}\", expected system, user or assistant")]
    UnknownRole {
        /// Index of the message.
        message: usize,
        /// Its role.
        role: String,
    },
    /// Nothing to train on.
    #[error("the conversation has no assistant turn")]
    NoAssistant,
    /// The template renders a turn in a way its trained text cannot be found.
    #[error("message {message}: the chat template renders this assistant turn differently inside the whole conversation, and its text could not be located there")]
    Unlocatable {
        /// Index of the message.
        message: usize,
    },
    /// The template failed.
    #[error(transparent)]
    Template(#[from] ChatError),
}

/// The rendered prompt, refusing to grow past `limit` bytes (the write fails, and with it the
/// rendering).
struct CappedOutput {
    bytes: Vec<u8>,
    limit: usize,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.bytes
                .extend_from_slice(&buf[..self.limit - self.bytes.len()]);
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn template_err(source_name: &str, e: &JinjaError) -> ChatError {
    // minijinja names the template by its registered name; ours is the file it came from.
    let message = e.to_string().replace(&format!("(in {NAME}:"), "(line ");
    ChatError::Template {
        source_name: source_name.to_string(),
        message,
    }
}

/// HF templates' way of refusing input (`{{ raise_exception('…') }}`).
fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

/// `strftime_now(format)`: the current UTC time, as Python's `strftime` formats it.
fn strftime_now(format: String) -> Result<Value, JinjaError> {
    strftime(&format, chrono::Utc::now()).map(Value::from)
}

/// `format` at `t`; a directive chrono does not know is a template error, not a panic.
fn strftime(format: &str, t: chrono::DateTime<chrono::Utc>) -> Result<String, JinjaError> {
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.contains(&Item::Error) {
        return Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        ));
    }
    Ok(t.format_with_items(items.into_iter()).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA3: &str = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}\n{% if add_generation_prompt %}\n<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}\n";

    #[test]
    fn renders_one_user_message_with_the_generation_prompt() {
        let cfg = serde_json::json!({
            "bos_token": {"content": "<|begin_of_text|>", "lstrip": false},
            "eos_token": "<|eot_id|>",
        });
        let t = ChatTemplate::new(LLAMA3, "llama3.jinja", Some(&cfg)).unwrap();
        assert_eq!(t.bos(), Some("<|begin_of_text|>"));
        // trim_blocks drops the newline after each block tag; the template's last newline goes.
        assert_eq!(
            t.render_user("  Hi there?\n").unwrap(),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn python_string_methods_and_raise_exception() {
        let src = "{% if messages[0]['content'].startswith('x') %}{{ raise_exception('no x, please') }}{% endif %}{{ messages[0]['content'].strip().upper() }}";
        let t = ChatTemplate::new(src, "t.jinja", None).unwrap();
        assert_eq!(t.render_user(" ab ").unwrap(), "AB");
        let e = t.render_user("xy").unwrap_err().to_string();
        assert!(e.starts_with("chat template t.jinja:"), "{e}");
        assert!(e.contains("no x, please"), "{e}");
        let e = ChatTemplate::new("{% for m in messages %}", "broken.jinja", None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("chat template broken.jinja:"), "{e}");
        assert!(!e.contains(NAME), "{e}");
    }

    #[test]
    fn runaway_templates_stop_with_an_error_naming_the_file() {
        // Nested loops of 100,000: out of fuel, in well under a second.
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "loops.jinja", None).unwrap();
        let started = std::time::Instant::now();
        let e = t.render_user("hi").unwrap_err().to_string();
        assert!(e.starts_with("chat template loops.jinja:"), "{e}");
        assert!(e.contains("template steps"), "{e}");
        assert!(started.elapsed().as_secs() < 30);
        // Output that grows without end: stopped at the cap, before it is held whole.
        let src = "{% for i in range(1000) %}{% for j in range(1000) %}{{ messages[0].content * 1000 }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "big.jinja", None).unwrap();
        let e = t.render_user("0123456789").unwrap_err().to_string();
        assert!(e.starts_with("chat template big.jinja:"), "{e}");
        assert!(e.contains("rendering stopped at 1048616 bytes"), "{e}");
        // An honest template with a long message is not limited.
        let long = "x".repeat(3 << 20);
        let t = ChatTemplate::new(LLAMA3, "llama3.jinja", None).unwrap();
        assert!(t.render_user(&long).unwrap().len() > long.len());
    }

    #[test]
    fn tokenizer_config_templates_and_named_lists() {
        let dir = tempfile::tempdir().unwrap();
        let e = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("chat_template.jinja") && e.contains("tokenizer_config.json"),
            "{e}"
        );
        let cfg = serde_json::json!({"chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ messages[0].content }}!"},
        ]});
        std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let t = ChatTemplate::from_dir(dir.path()).unwrap();
        assert_eq!(t.render_user("a").unwrap(), "a!");
        assert!(t.source_name().contains("tokenizer_config.json"));
        std::fs::write(
            dir.path().join("chat_template.jinja"),
            "<{{ messages[0].content }}>",
        )
        .unwrap();
        let t = ChatTemplate::from_dir(dir.path()).unwrap();
        assert_eq!(t.render_user("a").unwrap(), "<a>");
    }

    fn msg(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    /// SmolLM2's template (ChatML with a default system prompt).
    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// Qwen3's way with earlier turns, cut down: the last answer after the last question opens
    /// with an empty think block, earlier answers do not.
    const THINKING: &str = "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{% for m in messages %}{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% if loop.index0 > ns.last %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{{ m.content + '<|im_end|>\n' }}{% else %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn trained(t: &TrainingText) -> Vec<&str> {
        t.trained.iter().map(|r| &t.text[r.clone()]).collect()
    }

    #[test]
    fn assistant_turns_are_trained_with_the_tokens_that_end_them() {
        let t = ChatTemplate::new(CHATML, "chatml.jinja", None).unwrap();
        let conv = [
            msg("user", "Hi"),
            msg("assistant", "Hello!"),
            msg("user", "2+2?"),
            msg("assistant", "4"),
        ];
        let r = t.render_for_training(&conv, TrainOn::Assistant).unwrap();
        assert!(r
            .text
            .starts_with("<|im_start|>system\nYou are helpful.<|im_end|>\n"));
        assert_eq!(trained(&r), ["Hello!<|im_end|>\n", "4<|im_end|>\n"]);
        let r = t
            .render_for_training(&conv, TrainOn::LastAssistant)
            .unwrap();
        assert_eq!(trained(&r), ["4<|im_end|>\n"]);
        let r = t.render_for_training(&conv, TrainOn::All).unwrap();
        assert_eq!(trained(&r), [r.text.as_str()]);
    }

    #[test]
    fn turns_a_template_renders_differently_later_are_located_in_the_whole() {
        let t = ChatTemplate::new(THINKING, "thinking.jinja", None).unwrap();
        let conv = [
            msg("user", "Hi"),
            msg("assistant", "Hello!"),
            msg("user", "2+2?"),
            msg("assistant", "4"),
        ];
        let r = t.render_for_training(&conv, TrainOn::Assistant).unwrap();
        assert_eq!(
            r.text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n"
        );
        // The last answer as generated (think block included); the earlier one as it stands.
        assert_eq!(
            trained(&r),
            ["Hello!<|im_end|>\n", "<think>\n\n</think>\n\n4<|im_end|>\n"]
        );
    }

    #[test]
    fn conversations_that_cannot_be_trained_on_say_why() {
        let t = ChatTemplate::new(CHATML, "chatml.jinja", None).unwrap();
        let e = |conv: &[Message]| {
            t.render_for_training(conv, TrainOn::Assistant)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(e(&[]), "the conversation has no messages");
        assert_eq!(
            e(&[msg("user", "Hi")]),
            "the conversation has no assistant turn"
        );
        assert_eq!(
            e(&[msg("user", "Hi"), msg("tool", "x"), msg("assistant", "y")]),
            "message 1 has role \"tool\", expected system, user or assistant"
        );
        let t =
            ChatTemplate::new("{{ raise_exception('no system') }}", "strict.jinja", None).unwrap();
        let e = t
            .render_for_training(
                &[msg("user", "Hi"), msg("assistant", "y")],
                TrainOn::Assistant,
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("chat template strict.jinja:") && e.contains("no system"),
            "{e}"
        );
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let secs = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        let t = chrono::DateTime::from_timestamp(secs, 0).unwrap();
        assert_eq!(
            strftime("%d %b %Y, %A %H:%M:%S %j %y %m %B %a %%", t).unwrap(),
            "26 Jul 2024, Friday 13:05:09 208 24 07 July Fri %"
        );
        assert!(strftime("%Q", t).is_err());
    }
}
