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
use minijinja::machinery::{CompiledTemplate, Instruction, Instructions, TemplateConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, Error as JinjaError, ErrorKind, Value};
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

mod bounds;

/// The budget of one rendering, in minijinja's fuel: one unit per instruction and per 64 bytes
/// of data the template creates or writes (more for containers turned into text). A real chat
/// template spends a few thousand on a conversation; a runaway one (nested loops of 100,000, a
/// list doubled in a loop) stops here, in well under a second, instead of running for hours or
/// holding gigabytes. Conversations longer than [`FUEL_FREE_BYTES`] get more (see
/// [`fuel_for`]).
const FUEL: u64 = 1_000_000;

/// Message bytes the base [`FUEL`] covers; beyond them each 8 bytes of the messages add one
/// unit, so a long honest conversation can be copied and written out several times over.
const FUEL_FREE_BYTES: usize = 1 << 20;

/// Rendered bytes allowed beyond the message itself (a template's own text around it, several
/// times over for templates that repeat the system prompt): past that the template is producing
/// output, not formatting a prompt.
const RENDER_SLACK: usize = 1 << 20;

/// The fuel of a rendering of messages of `content_bytes` bytes in all.
fn fuel_for(content_bytes: usize) -> u64 {
    FUEL + (content_bytes.saturating_sub(FUEL_FREE_BYTES) / 8) as u64
}

/// A compiled chat template with the special tokens it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    compiled: CompiledTemplate<'static>,
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
        env.set_syntax(syntax.clone());
        // Python's methods, and what a template builds, bounded (see `bounds`).
        bounds::install(&mut env);
        env.set_fuel(Some(FUEL));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let compiled = compile(text, syntax).map_err(|e| template_err(source_name, &e))?;
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
            compiled,
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
        let content_bytes: usize = messages.iter().map(|m| m.content.len()).sum();
        let limit = 4 * content_bytes + RENDER_SLACK;
        let fuel = fuel_for(content_bytes);
        // The environment is shared by every rendering; a long conversation gets its own copy
        // with more fuel.
        let long_env;
        let env = if fuel == FUEL {
            &self.env
        } else {
            long_env = {
                let mut e = self.env.clone();
                e.set_fuel(Some(fuel));
                e
            };
            &long_env
        };
        let mut rendered = String::new();
        let result = minijinja::machinery::eval(
            env,
            &self.compiled.instructions,
            Value::from_pairs(ctx),
            &self.compiled.blocks,
            &mut minijinja::machinery::make_string_output(&mut rendered),
            AutoEscape::None,
        )
        .map(|_| ());
        match result {
            Ok(()) if rendered.len() <= limit => Ok(rendered),
            Ok(()) => Err(ChatError::Template {
                source_name: self.source_name.clone(),
                message: format!(
                    "the rendering is {} bytes, more than {limit} (4 × the messages' \
                     {content_bytes} + 1 MiB): the template writes far more than a prompt",
                    rendered.len()
                ),
            }),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(ChatError::Template {
                source_name: self.source_name.clone(),
                message: format!(
                    "rendering stopped after {fuel} template steps (one per instruction and \
                     per 64 bytes of data the template builds or writes): the template runs far \
                     longer, or builds far more, than formatting a conversation takes (a \
                     runaway loop?) ({})",
                    jinja_message(&e)
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

/// Compiles a template the way minijinja's `Environment` does, then has every `+` and `~`
/// call the bounded [`bounds::add`] and [`bounds::concat`] instead (minijinja offers no other
/// hook for its operators; see the `bounds` module).
///
/// The text is kept for the life of the process (compiled templates borrow it, and a template
/// is compiled once per run; it is a few KB).
fn compile(text: &str, syntax: SyntaxConfig) -> Result<CompiledTemplate<'static>, JinjaError> {
    let source: &'static str = Box::leak(text.to_string().into_boxed_str());
    let config = TemplateConfig {
        syntax_config: syntax,
        default_auto_escape: std::sync::Arc::new(|_: &str| AutoEscape::None),
    };
    let mut compiled = CompiledTemplate::new(NAME, source, &config)?;
    bound_operators(&mut compiled.instructions);
    bound_chained_comparisons(&mut compiled.instructions);
    for block in compiled.blocks.values_mut() {
        bound_operators(block);
        bound_chained_comparisons(block);
    }
    Ok(compiled)
}

/// Has every link but the last of a chained comparison (`a < b < c`, `a == b == c`) check its
/// operands as the plain comparisons do (see [`bounds::chained_operands`]) before minijinja
/// compares them.
///
/// minijinja compiles `a < b < c` into `a, b, CompareAndPreserve(<), JumpIfFalseOrPop(fail),
/// c, Lt, Jump(end), fail: Swap, DiscardTop, end:`: `CompareAndPreserve` leaves `b` under the
/// result for the next link, which no single call can do, and its operator is of a type the
/// `unstable_machinery` API does not name. The final `Lt` is rewritten by [`bound_operators`];
/// each `CompareAndPreserve` at `i` becomes a `Jump` to code appended after the template's own:
///
/// ```text
/// k:   CallFunction(rsd:chained, 2)   a, b  ->  [b, a]   (or the error: nested too deep)
/// k+1: UnpackList(2)                  [b, a] -> a, b
/// k+2: CompareAndPreserve(<)          minijinja's own instruction, moved here
/// k+3: Jump(i + 1)
/// ```
///
/// Nothing is inserted, so no jump target of the template moves. The appended code is
/// preceded by a `Jump` past its end, so the template's own code, which ends by running off
/// the end of its instructions (blocks too; macros `Return`), still ends there. Each appended
/// instruction carries the location of the instruction it replaces, for error messages.
fn bound_chained_comparisons(instructions: &mut Instructions<'static>) {
    let mut sites = Vec::new();
    let mut len: u32 = 0;
    while let Some(instr) = instructions.get(len) {
        if matches!(instr, Instruction::CompareAndPreserve(_)) {
            sites.push(len);
        }
        len += 1;
    }
    if sites.is_empty() {
        return;
    }
    // Patched to the end once the checks are appended.
    let stop = instructions.add(Instruction::Jump(u32::MAX));
    let mut end = stop + 1;
    for site in sites {
        let Some(compare) = instructions.get(site).cloned() else {
            continue;
        };
        let span = instructions
            .get_span(site)
            .filter(|s| *s != minijinja::machinery::Span::default());
        let line = instructions
            .get_line(site)
            .and_then(|l| u16::try_from(l).ok())
            .unwrap_or(0);
        let mut add = |instr| match span {
            Some(span) => instructions.add_with_span(instr, span),
            None => instructions.add_with_line(instr, line),
        };
        let check = add(Instruction::CallFunction(bounds::CHAINED, Some(2)));
        add(Instruction::UnpackList(2));
        add(compare);
        end = add(Instruction::Jump(site + 1)) + 1;
        if let Some(instr) = instructions.get_mut(site) {
            *instr = Instruction::Jump(check);
        }
    }
    if let Some(instr) = instructions.get_mut(stop) {
        *instr = Instruction::Jump(end);
    }
}

fn bound_operators(instructions: &mut Instructions<'static>) {
    // A call takes its arguments from the stack in the order these instructions take their
    // operands (and, with no count given, pops the count first, as a list built from an
    // unpacking does). A literal too large for a call's u16 count is left as it is: it nests
    // one level only.
    let call = |name: &'static str, n: Option<usize>| match n.map(u16::try_from) {
        None => Some(Instruction::CallFunction(name, None)),
        Some(Ok(n)) => Some(Instruction::CallFunction(name, Some(n))),
        Some(Err(_)) => None,
    };
    let mut pc = 0;
    while let Some(instr) = instructions.get_mut(pc) {
        let bounded = match instr {
            Instruction::Add => call(bounds::ADD, Some(2)),
            Instruction::StringConcat => call(bounds::CONCAT, Some(2)),
            Instruction::BuildList(n) => call(bounds::LIST, *n),
            Instruction::BuildTuple(n) => call(bounds::TUPLE, *n),
            // `a in b` takes the item, then the container, as the call does.
            Instruction::Eq => call(bounds::COMPARISONS[0], Some(2)),
            Instruction::Ne => call(bounds::COMPARISONS[1], Some(2)),
            Instruction::Lt => call(bounds::COMPARISONS[2], Some(2)),
            Instruction::Lte => call(bounds::COMPARISONS[3], Some(2)),
            Instruction::Gt => call(bounds::COMPARISONS[4], Some(2)),
            Instruction::Gte => call(bounds::COMPARISONS[5], Some(2)),
            Instruction::In => call(bounds::COMPARISONS[6], Some(2)),
            Instruction::BuildMap(pairs) => pairs
                .checked_mul(2)
                .and_then(|n| call(bounds::MAP, Some(n))),
            _ => None,
        };
        if let Some(bounded) = bounded {
            *instr = bounded;
        }
        pc += 1;
    }
}

/// minijinja's message, with the line; minijinja names the template by its registered name,
/// ours is the file it came from.
fn jinja_message(e: &JinjaError) -> String {
    e.to_string().replace(&format!("(in {NAME}:"), "(line ")
}

fn template_err(source_name: &str, e: &JinjaError) -> ChatError {
    ChatError::Template {
        source_name: source_name.to_string(),
        message: jinja_message(e),
    }
}

/// HF templates' way of refusing input (`{{ raise_exception('…') }}`). A message that is not
/// a string is turned into text only once its size is paid for (a lazy list of 10^8 items
/// would be written out whole).
fn raise_exception(state: &minijinja::State, message: Value) -> Result<Value, JinjaError> {
    if message.as_str().is_none() {
        bounds::pay_for_text(state, &message)?;
    }
    Err(JinjaError::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

/// `strftime_now(format)`: the current UTC time, as Python's `strftime` formats it.
fn strftime_now(state: &minijinja::State, format: Value) -> Result<Value, JinjaError> {
    if format.as_str().is_none() {
        bounds::pay_for_text(state, &format)?;
    }
    let format = format.to_string();
    strftime(&format, chrono::Utc::now(), |bytes| {
        bounds::ensure_output(state, bytes, "strftime_now")
    })
    .map(Value::from)
}

/// `format` at `t`; a directive chrono does not know is a template error, not a panic. A
/// directive writes up to 35 bytes for 2 (`%+`), so the text is built one directive at a time
/// and `room` asked before the text grows past each further 64 KiB.
fn strftime(
    format: &str,
    t: chrono::DateTime<chrono::Utc>,
    room: impl Fn(u64) -> Result<(), JinjaError>,
) -> Result<String, JinjaError> {
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.contains(&Item::Error) {
        return Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            format!(
                "strftime_now: unsupported format {:?}",
                rsd_common::printable::shortened(format)
            ),
        ));
    }
    let mut out = String::new();
    let mut checked_to = 0usize;
    for item in items {
        use std::fmt::Write;
        write!(out, "{}", t.format_with_items(std::iter::once(item))).map_err(|e| {
            JinjaError::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}"))
        })?;
        if out.len() >= checked_to {
            checked_to = out.len() + (64 << 10);
            room(checked_to as u64)?;
        }
    }
    Ok(out)
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
        // Nested loops of 100,000: out of fuel, in well under a second (~0.1 s in a debug build):
        // the 30 s bound is a margin for a loaded machine, far below the loops' 10^10 steps.
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "loops.jinja", None).unwrap();
        let started = std::time::Instant::now();
        let e = t.render_user("hi").unwrap_err().to_string();
        assert!(e.starts_with("chat template loops.jinja:"), "{e}");
        assert!(e.contains("template steps"), "{e}");
        assert!(started.elapsed().as_secs() < 30);
        // Output that grows without end: every 64 bytes written cost a unit of fuel, so it
        // stops at 64 MB, before it is held whole.
        let src = "{% for i in range(1000) %}{% for j in range(1000) %}{{ messages[0].content * 1000 }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "big.jinja", None).unwrap();
        let e = t.render_user("0123456789").unwrap_err().to_string();
        assert!(e.starts_with("chat template big.jinja:"), "{e}");
        assert!(
            e.contains("rendering stopped after 1000000 template steps"),
            "{e}"
        );
        // Output within the fuel but far more than a prompt: refused with its size.
        let t = ChatTemplate::new("{{ 'x' * 2000000 }}", "long.jinja", None).unwrap();
        let e = t.render_user("0123456789").unwrap_err().to_string();
        assert!(
            e.starts_with("chat template long.jinja:")
                && e.contains("the rendering is 2000000 bytes, more than 1048616"),
            "{e}"
        );
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

    /// The rewrite of chained comparisons: every `CompareAndPreserve` left runs after the
    /// check of its operands, the template's own code still ends where it did (a jump to the
    /// end of the instructions included), and blocks are rewritten too.
    #[test]
    fn chained_comparisons_check_their_operands_in_code_appended_after_the_template() {
        let syntax = || SyntaxConfig::builder().build().unwrap();
        let src = "{% if 0 < messages|length < 2 %}one{% endif %}";
        let before = {
            let config = TemplateConfig {
                syntax_config: syntax(),
                default_auto_escape: std::sync::Arc::new(|_: &str| AutoEscape::None),
            };
            CompiledTemplate::new(NAME, src, &config).unwrap()
        };
        let len = |i: &Instructions<'_>| (0..).take_while(|&pc| i.get(pc).is_some()).count() as u32;
        let old_len = len(&before.instructions);
        let compiled = compile(src, syntax()).unwrap();
        let i = &compiled.instructions;
        // One link checked: the end marker and four appended instructions.
        assert_eq!(len(i), old_len + 5);
        assert!(matches!(i.get(old_len), Some(Instruction::Jump(end)) if *end == old_len + 5));
        let at = |pc: u32| i.get(pc).unwrap();
        let mut checked = 0;
        for pc in 0..len(i) {
            if matches!(at(pc), Instruction::CompareAndPreserve(_)) {
                checked += 1;
                assert!(pc > old_len);
                assert!(
                    matches!(at(pc - 2), Instruction::CallFunction(name, Some(2)) if *name == bounds::CHAINED)
                );
                assert!(matches!(at(pc - 1), Instruction::UnpackList(2)));
                let Instruction::Jump(back) = at(pc + 1) else {
                    panic!("no jump back after the link at {pc}");
                };
                assert!(matches!(at(back - 1), Instruction::Jump(to) if *to == pc - 2));
                assert!(matches!(at(*back), Instruction::JumpIfFalseOrPop(_)));
                assert_eq!(i.get_line(pc - 2), i.get_line(back - 1));
            }
        }
        assert_eq!(checked, 1);
        // The `if` jumps to the old end, now the marker that skips the appended code.
        let t = ChatTemplate::new(src, "t.jinja", None).unwrap();
        assert_eq!(t.render_user("a").unwrap(), "one");
        let two = [msg("user", "a"), msg("assistant", "b")];
        assert_eq!(t.render(&two, false).unwrap(), "");
        // No chained comparison, nothing appended.
        let plain = compile("{{ 1 < 2 }}{{ 1 < 2 and 2 < 3 }}", syntax()).unwrap();
        let direct = CompiledTemplate::new(
            NAME,
            "{{ 1 < 2 }}{{ 1 < 2 and 2 < 3 }}",
            &TemplateConfig {
                syntax_config: syntax(),
                default_auto_escape: std::sync::Arc::new(|_: &str| AutoEscape::None),
            },
        )
        .unwrap();
        assert_eq!(len(&plain.instructions), len(&direct.instructions));
        // Blocks and macros, three links each, and the line of a refused link.
        // (Operands that are all constants are folded by minijinja's compiler.)
        let src = "{% block b %}{{ 0 < messages|length < 2 < 4 }}{{ 1 < messages|length < 0 < 4 }}{% endblock %}{% macro f(x) %}{{ x == x == x != 1 }}{% endmacro %}{{ f(2) }}";
        let compiled = compile(src, syntax()).unwrap();
        let links = |i: &Instructions<'_>| {
            (0..)
                .map_while(|pc| i.get(pc))
                .filter(|instr| matches!(instr, Instruction::CompareAndPreserve(_)))
                .count()
        };
        assert_eq!(links(&compiled.instructions), 2);
        assert_eq!(compiled.blocks.values().map(links).sum::<usize>(), 4);
        let t = ChatTemplate::new(src, "t.jinja", None).unwrap();
        assert_eq!(t.render_user("a").unwrap(), "TrueFalseTrue");
        let src = "{% set a = namespace() %}{% set a.x = a %}\n{% block b %}\n{{ 1 < a < 2 }}{% endblock %}";
        let e = ChatTemplate::new(src, "t.jinja", None)
            .unwrap()
            .render_user("a")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("chat template t.jinja: invalid operation: a chained comparison: lists and maps nested more than 256 deep")
                && e.contains("(line 3)"),
            "{e}"
        );
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let secs = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        let t = chrono::DateTime::from_timestamp(secs, 0).unwrap();
        assert_eq!(
            strftime("%d %b %Y, %A %H:%M:%S %j %y %m %B %a %%", t, |_| Ok(())).unwrap(),
            "26 Jul 2024, Friday 13:05:09 208 24 07 July Fri %"
        );
        assert!(strftime("%Q", t, |_| Ok(())).is_err());
        // Every directive is formatted on its own, as chrono formats them together.
        let all = "%Y-%m-%dT%H:%M:%S%.f %+ %c %s %e";
        assert_eq!(
            strftime(all, t, |_| Ok(())).unwrap(),
            t.format(all).to_string()
        );
        // The room is asked for before the text grows past 64 KiB, and a refusal stops it.
        let e = strftime(&"%+".repeat(10_000), t, |n| {
            if n > 100_000 {
                Err(JinjaError::new(ErrorKind::OutOfFuel, "no room"))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfFuel);
    }
}
