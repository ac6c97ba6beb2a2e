//! Chat data for SFT (`rsd-data pack --chat`): conversations in the messages format, rendered with
//! the model's chat template, tokenized, and marked token by token as trained on or not.
//!
//! A record's `messages` field (`--text-field`, default `messages`) is a list of
//! `{"role": "system"|"user"|"assistant", "content": "…"}`: a JSON array in JSON Lines, a
//! `list<struct<role, content>>` column or a string column holding that JSON in Parquet and Arrow.
//! Which text is trained on is `rsd_chat`'s to say ([`ChatTemplate::render_for_training`]); this
//! module turns its byte ranges into a per-token mask over the ids of the whole rendering, which
//! are exactly what transformers' `apply_chat_template(…, tokenize=True)` gives.
use std::path::Path;

use rsd_chat::{ChatTemplate, ConversationError, Message, TrainOn};
use serde_json::Value;

use crate::error::{Cause, DataError, Result};
use crate::tokenizer::Tokenizer;

/// How conversations are rendered and masked, and the longest one a row takes.
#[derive(Debug)]
pub struct ChatSetup {
    /// The model's chat template.
    pub template: ChatTemplate,
    /// Which tokens are trained on.
    pub train_on: TrainOn,
    /// The packing length: a conversation longer than this is skipped, never cut.
    pub max_tokens: usize,
}

/// The messages of one record, or an error naming the record and the entry at fault.
pub fn parse_messages(value: Value, path: &Path, location: &str) -> Result<Vec<Message>> {
    let bad = |what: String| DataError::bad_record(path, location, what);
    let Value::Array(list) = value else {
        return Err(bad(format!(
            "the messages are {}, expected a list of {{\"role\", \"content\"}} objects",
            kind(&value)
        )));
    };
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(mut m) = m else {
                return Err(bad(format!(
                    "messages[{i}] is {}, expected an object with \"role\" and \"content\"",
                    kind(&m)
                )));
            };
            let mut field = |name: &str| match m.remove(name) {
                Some(Value::String(s)) => Ok(s),
                Some(other) => Err(bad(format!(
                    "messages[{i}].{name} is {}, expected a string",
                    kind(&other)
                ))),
                None => Err(bad(format!("messages[{i}] has no \"{name}\""))),
            };
            Ok(Message {
                role: field("role")?,
                content: field("content")?,
            })
        })
        .collect()
}

/// The messages held by a text value (a Parquet/Arrow string column, or the JSON a
/// `list<struct<role, content>>` value was read as).
pub fn parse_messages_text(text: &str, path: &Path, location: &str) -> Result<Vec<Message>> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        DataError::bad_record(
            path,
            location,
            format!(
                "the messages are not JSON ({}): expected a list of {{\"role\", \"content\"}} objects",
                crate::error::json_error(&e)
            ),
        )
    })?;
    parse_messages(value, path, location)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// One conversation's ids (the whole rendering, tokenized as one text with special tokens) and
/// its loss mask (1 = a training target), or the reason it cannot be trained on.
pub fn tokenize_conversation(
    messages: &[Message],
    setup: &ChatSetup,
    tok: &Tokenizer,
    scratch: &mut Vec<tokenizers::pipeline::PipelineToken>,
    path: &Path,
    location: &str,
) -> Result<(Vec<u32>, Vec<u8>)> {
    let skip = |cause: Cause, what: String| DataError::Conversation {
        path: path.to_path_buf(),
        location: location.to_string(),
        cause,
        what,
    };
    let rendered = setup
        .template
        .render_for_training(messages, setup.train_on)
        .map_err(|e| {
            let cause = match e {
                ConversationError::UnknownRole { .. } => Cause::UnknownRole,
                ConversationError::NoAssistant | ConversationError::Empty => Cause::NoAssistant,
                ConversationError::Unlocatable { .. } | ConversationError::Template(_) => {
                    Cause::Template
                }
            };
            skip(cause, e.to_string())
        })?;
    let encode = |text: &str, scratch: &mut Vec<_>| -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        tok.encode_into(text, scratch, &mut ids)?;
        Ok(ids)
    };
    let text = &rendered.text;
    let ids = encode(text, scratch)?;
    if ids.len() > setup.max_tokens {
        return Err(skip(
            Cause::TooLong,
            format!(
                "the conversation is {} tokens, longer than --len {} (conversations are never cut)",
                ids.len(),
                setup.max_tokens
            ),
        ));
    }
    // The token index at each span boundary: the ids of the text before it. Encoding the
    // segments between boundaries gives all of them at once when the segments' ids put together
    // are the whole text's ids (boundaries sit next to special tokens, so they almost always
    // are); otherwise each boundary's prefix is encoded on its own.
    let mut cuts: Vec<usize> = rendered
        .trained
        .iter()
        .flat_map(|r| [r.start, r.end])
        .collect();
    cuts.dedup();
    let mut at = Vec::with_capacity(cuts.len());
    let mut joined = Vec::with_capacity(ids.len());
    let mut from = 0;
    for &c in &cuts {
        joined.extend(encode(&text[from..c], scratch)?);
        at.push(joined.len());
        from = c;
    }
    joined.extend(encode(&text[from..], scratch)?);
    if joined != ids {
        at = cuts
            .iter()
            .map(|&c| encode(&text[..c], scratch).map(|v| v.len()))
            .collect::<Result<_>>()?;
    }
    let token_at = |byte: usize| at[cuts.partition_point(|&c| c < byte)];
    let mut mask = vec![0u8; ids.len()];
    for r in &rendered.trained {
        let (a, b) = (token_at(r.start), token_at(r.end).min(ids.len()));
        if a < b {
            mask[a..b].fill(1);
        }
    }
    Ok((ids, mask))
}
