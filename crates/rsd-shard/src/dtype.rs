use serde::{Deserialize, Serialize};

/// The token id type stored in `.bin` files.
///
/// Megatron has no uint32 code, so vocabularies that do not fit in 16 bits are stored as int32
/// (every real vocabulary fits in 31 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// 2 bytes per token; Megatron code 8.
    Uint16,
    /// 4 bytes per token; Megatron code 4.
    Int32,
}

impl TokenDtype {
    /// The smallest dtype that holds every id below `vocab_size`.
    pub fn for_vocab(vocab_size: u64) -> TokenDtype {
        if vocab_size <= u16::MAX as u64 + 1 {
            TokenDtype::Uint16
        } else {
            TokenDtype::Int32
        }
    }
    /// Bytes per token.
    pub fn size(self) -> usize {
        match self {
            TokenDtype::Uint16 => 2,
            TokenDtype::Int32 => 4,
        }
    }
    /// Megatron's `DType` code, as written in the `.idx` header.
    pub fn megatron_code(self) -> u8 {
        match self {
            TokenDtype::Uint16 => 8,
            TokenDtype::Int32 => 4,
        }
    }
    /// The dtype for a Megatron code, if we support it.
    pub fn from_megatron_code(code: u8) -> Option<TokenDtype> {
        match code {
            8 => Some(TokenDtype::Uint16),
            4 => Some(TokenDtype::Int32),
            _ => None,
        }
    }
    /// The largest id this dtype can store.
    pub fn max_id(self) -> u32 {
        match self {
            TokenDtype::Uint16 => u16::MAX as u32,
            TokenDtype::Int32 => i32::MAX as u32,
        }
    }
    /// The name used in the manifest and in messages.
    pub fn name(self) -> &'static str {
        match self {
            TokenDtype::Uint16 => "uint16",
            TokenDtype::Int32 => "int32",
        }
    }
}
