//! `IdBuf`: a growable array of token ids whose storage starts on a 64-byte boundary.
//!
//! Why not `Vec<u16>`: the loader fills these buffers with `pread`, and the kernel copies with
//! `rep movsb`, which on AMD Zen runs at half speed or less when the destination sits 1–32 bytes
//! past the source modulo 4096 (glibc's own `memmove` steers around that case; the kernel's copy
//! does not). A large `Vec` from glibc's allocator starts 16 bytes into a page, exactly such a
//! distance from a page-aligned sample (docs/BENCHMARKS.md, "rsd-loader"). A
//! 64-byte-aligned start keeps every row that starts on a page in the file (fixed-length rows, CP
//! chunks) out of that window.

use std::marker::PhantomData;
use std::ops::Deref;

use rsd_shard::TokenElem;

/// 64 bytes, aligned to 64: the unit of storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

const LINE: usize = std::mem::size_of::<Line>();

/// Token ids (`u16` or `i32`) in storage aligned to 64 bytes. Dereferences to `[T]`. All of the
/// storage is initialised (new lines are zeroed), so reading into it needs no `unsafe` from callers.
pub struct IdBuf<T> {
    lines: Vec<Line>,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: TokenElem> IdBuf<T> {
    /// An empty buffer.
    pub fn new() -> Self {
        IdBuf {
            lines: Vec::new(),
            len: 0,
            _elem: PhantomData,
        }
    }

    /// Ids held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no id is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Ids the storage holds without growing.
    pub fn capacity(&self) -> usize {
        self.lines.len() * LINE / std::mem::size_of::<T>()
    }

    /// Drop every id; keep the storage.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Make room for exactly `additional` more ids (no doubling).
    pub fn reserve_exact(&mut self, additional: usize) {
        let need = self.len + additional;
        if need > self.capacity() {
            let lines = (need * std::mem::size_of::<T>()).div_ceil(LINE);
            self.lines.resize(lines, Line([0; LINE]));
        }
    }

    /// Make room for `additional` more ids, at least doubling when it grows.
    fn reserve(&mut self, additional: usize) {
        let need = self.len + additional;
        if need > self.capacity() {
            self.reserve_exact(need.max(2 * self.capacity()) - self.len);
        }
    }

    /// All of the storage as ids (initialised: zeros or earlier contents).
    fn storage_mut(&mut self) -> &mut [T] {
        let n = self.capacity();
        // SAFETY: `lines` is `n * size_of::<T>()` initialised bytes, aligned to 64 ≥ align_of::<T>();
        // `T` is u16 or i32 (sealed `TokenElem`), for which every bit pattern is valid.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), n) }
    }

    /// The `n` slots after the last id, to be filled and then kept with [`IdBuf::commit`].
    pub fn tail_mut(&mut self, n: usize) -> &mut [T] {
        self.reserve(n);
        let len = self.len;
        &mut self.storage_mut()[len..len + n]
    }

    /// Keep the `n` slots after the last id (filled through [`IdBuf::tail_mut`]).
    pub fn commit(&mut self, n: usize) {
        assert!(self.len + n <= self.capacity(), "commit past the storage");
        self.len += n;
    }

    /// Append `ids`.
    pub fn extend_from_slice(&mut self, ids: &[T]) {
        self.tail_mut(ids.len()).copy_from_slice(ids);
        self.commit(ids.len());
    }

    /// Grow or shrink to `n` ids, filling new slots with `value`.
    pub fn resize(&mut self, n: usize, value: T) {
        if n > self.len {
            self.tail_mut(n - self.len).fill(value);
        }
        self.len = n;
    }

    /// Remove and return the last id.
    pub fn pop(&mut self) -> Option<T> {
        let last = self.last().copied()?;
        self.len -= 1;
        Some(last)
    }
}

impl<T: TokenElem> Deref for IdBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: as in `storage_mut`; `len <= capacity()` is kept by every method.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: TokenElem> Default for IdBuf<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: TokenElem> Clone for IdBuf<T> {
    fn clone(&self) -> Self {
        let mut c = Self::new();
        c.extend_from_slice(self);
        c
    }
}

impl<T: TokenElem + PartialEq> PartialEq for IdBuf<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: TokenElem + std::fmt::Debug> std::fmt::Debug for IdBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: TokenElem> From<&[T]> for IdBuf<T> {
    fn from(ids: &[T]) -> Self {
        let mut b = Self::new();
        b.extend_from_slice(ids);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_ids_like_a_vec_in_aligned_storage() {
        let mut b: IdBuf<u16> = IdBuf::new();
        let mut v: Vec<u16> = Vec::new();
        for round in 0..3u16 {
            for i in 0..100u16 {
                b.extend_from_slice(&[i, round]);
                v.extend_from_slice(&[i, round]);
            }
            b.resize(b.len() + 37, 9);
            v.resize(v.len() + 37, 9);
            assert_eq!(b.pop(), v.pop());
            assert_eq!(&b[..], &v[..]);
            assert_eq!(b.as_ptr() as usize % 64, 0, "64-byte aligned");
            b.resize(5, 0);
            v.truncate(5);
            assert_eq!(&b[..], &v[..]);
        }
        let cap = b.capacity();
        b.clear();
        assert!(b.is_empty() && b.pop().is_none());
        assert_eq!(b.capacity(), cap, "clear keeps the storage");
        let mut w: IdBuf<i32> = IdBuf::new();
        w.reserve_exact(3);
        assert_eq!(w.capacity(), 16, "one 64-byte line");
        w.tail_mut(2).copy_from_slice(&[-1, 7]);
        assert!(w.is_empty(), "not kept before commit");
        w.commit(2);
        assert_eq!(&w[..], &[-1, 7]);
        assert_eq!(w.clone(), IdBuf::from(&[-1, 7][..]));
        assert_eq!(format!("{w:?}"), "[-1, 7]");
    }
}
