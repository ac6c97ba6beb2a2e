//! Megatron's `.idx` layout (`MMIDIDX`, version 1), read without copying and written in one go.
//!
//! ```text
//! 0   9  magic  b"MMIDIDX\0\0"
//! 9   8  u64    version = 1
//! 17  1  u8     dtype code (uint16 = 8, int32 = 4)
//! 18  8  u64    sequence count  n
//! 26  8  u64    document count  d  (= samples + 1: the length of the index array)
//! 34  4n i32    sequence lengths, in tokens
//! ..  8n i64    sequence byte offsets into .bin
//! ..  8d i64    document indices: 0, …, n  (sample k = sequences [idx[k], idx[k+1]))
//! ```
//! The arrays start at unaligned offsets, so values are decoded one at a time from the mapped bytes.

use std::path::Path;

use crate::dtype::TokenDtype;
use crate::error::{Result, ShardError};

/// The 9 magic bytes that open every `.idx` file.
pub const IDX_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// The only `.idx` version Megatron has written.
pub const IDX_VERSION: u64 = 1;
const HEADER_LEN: usize = 34;

/// The fixed header of an `.idx` file, checked against the file's exact size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdxHeader {
    /// Token dtype of the matching `.bin`.
    pub dtype: TokenDtype,
    /// Number of sequences (document pieces).
    pub sequence_count: u64,
    /// Length of the document-index array (samples + 1).
    pub document_count: u64,
}

impl IdxHeader {
    /// Decode and check the header of `bytes` (the whole file), naming `path` in errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<IdxHeader> {
        if bytes.len() < HEADER_LEN {
            return Err(ShardError::corrupt(
                path,
                bytes.len() as u64,
                format!(
                    "file is {} bytes, shorter than the {HEADER_LEN}-byte .idx header",
                    bytes.len()
                ),
            ));
        }
        if &bytes[..9] != IDX_MAGIC {
            return Err(ShardError::corrupt(
                path,
                0,
                "bad magic: expected MMIDIDX\\0\\0 (a Megatron .idx file)",
            ));
        }
        let version = u64_at(bytes, 9);
        if version != IDX_VERSION {
            return Err(ShardError::corrupt(
                path,
                9,
                format!("version {version}, expected {IDX_VERSION}"),
            ));
        }
        let dtype = TokenDtype::from_megatron_code(bytes[17]).ok_or_else(|| {
            ShardError::corrupt(
                path,
                17,
                format!("dtype code {}, expected 8 (uint16) or 4 (int32)", bytes[17]),
            )
        })?;
        let header = IdxHeader {
            dtype,
            sequence_count: u64_at(bytes, 18),
            document_count: u64_at(bytes, 26),
        };
        let expected = header.file_len().ok_or_else(|| {
            ShardError::corrupt(
                path,
                18,
                "sequence/document counts overflow: header is damaged",
            )
        })?;
        if bytes.len() as u64 != expected {
            return Err(ShardError::corrupt(
                path,
                bytes.len().min(expected as usize) as u64,
                format!(
                    "file is {} bytes, but the header ({} sequences, {} document indices) needs exactly {expected}",
                    bytes.len(),
                    header.sequence_count,
                    header.document_count
                ),
            ));
        }
        if header.document_count == 0 {
            return Err(ShardError::corrupt(
                path,
                26,
                "document count 0: the index array must hold at least [0]",
            ));
        }
        Ok(header)
    }

    /// The exact size of an `.idx` file with this header.
    pub fn file_len(&self) -> Option<u64> {
        let n = self.sequence_count;
        let d = self.document_count;
        n.checked_mul(12)?
            .checked_add(d.checked_mul(8)?)?
            .checked_add(HEADER_LEN as u64)
    }
    pub(crate) fn lengths_offset(&self) -> usize {
        HEADER_LEN
    }
    pub(crate) fn pointers_offset(&self) -> usize {
        HEADER_LEN + 4 * self.sequence_count as usize
    }
    pub(crate) fn doc_index_offset(&self) -> usize {
        HEADER_LEN + 12 * self.sequence_count as usize
    }
}

/// Encode a whole `.idx` file for sequences of `lengths` tokens grouped into samples by
/// `doc_indices` (which starts at 0 and ends at `lengths.len()`), for elements of Megatron dtype
/// `code` and `elem_size` bytes (a loss mask's index is the token index with uint8 elements).
pub(crate) fn encode(code: u8, elem_size: usize, lengths: &[i32], doc_indices: &[i64]) -> Vec<u8> {
    let n = lengths.len();
    let mut out = Vec::with_capacity(HEADER_LEN + 12 * n + 8 * doc_indices.len());
    out.extend_from_slice(IDX_MAGIC);
    out.extend_from_slice(&IDX_VERSION.to_le_bytes());
    out.push(code);
    out.extend_from_slice(&(n as u64).to_le_bytes());
    out.extend_from_slice(&(doc_indices.len() as u64).to_le_bytes());
    for len in lengths {
        out.extend_from_slice(&len.to_le_bytes());
    }
    let mut pointer: i64 = 0;
    for len in lengths {
        out.extend_from_slice(&pointer.to_le_bytes());
        pointer += *len as i64 * elem_size as i64;
    }
    for doc in doc_indices {
        out.extend_from_slice(&doc.to_le_bytes());
    }
    out
}

pub(crate) fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(b)
}

pub(crate) fn i64_at(bytes: &[u8], offset: usize) -> i64 {
    u64_at(bytes, offset) as i64
}

pub(crate) fn i32_at(bytes: &[u8], offset: usize) -> i32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[offset..offset + 4]);
    i32::from_le_bytes(b)
}
