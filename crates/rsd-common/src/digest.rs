//! sha256, as manifests, run files and checkpoints record it: lowercase hex of the bytes, or of
//! a file read in 1 MiB pieces.
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::hex(&Sha256::digest(bytes))
}

/// The length and sha256 of the regular file at `path`, read in 1 MiB pieces (a checkpoint's
/// weights need not fit in memory twice). A FIFO or a device is refused, not read (which would
/// block, or never end).
pub fn sha256_file(path: &Path) -> std::io::Result<(u64, [u8; 32])> {
    let mut file = crate::safe_fs::open_regular(path).map_err(|e| match e {
        crate::safe_fs::FsError::Io { source, .. } => source,
        other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
    })?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok((len, hasher.finalize().into()));
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
}

/// A model directory's weights as evaluations and training records name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelWeights {
    /// The sha256 of each `*.safetensors` file's lowercase hex sha256, in file-name order (one
    /// file or a sharded checkpoint alike); a directory without weights has the digest of
    /// nothing.
    pub sha256: String,
    /// How many `*.safetensors` files there are.
    pub files: usize,
}

/// The digest of a model directory's weights ([`ModelWeights`]).
pub fn model_weights(dir: &Path) -> std::io::Result<ModelWeights> {
    let mut weights: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    weights.sort();
    let mut all = Sha256::new();
    for w in &weights {
        let (_, digest) = sha256_file(w)?;
        all.update(crate::hex(&digest).as_bytes());
    }
    Ok(ModelWeights {
        sha256: crate::hex(&all.finalize()),
        files: weights.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_and_its_bytes_have_the_same_digest() {
        // sha256("abc"), FIPS 180-2's example.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_hex(b"abc"), abc);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let big: Vec<u8> = (0..(3 << 20) + 7).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &big).unwrap();
        let (len, digest) = sha256_file(&path).unwrap();
        assert_eq!(
            (len, crate::hex(&digest)),
            (big.len() as u64, sha256_hex(&big))
        );
    }

    #[test]
    fn a_models_weights_digest_is_of_its_files_digests_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.safetensors"), b"second").unwrap();
        std::fs::write(dir.path().join("a.safetensors"), b"first").unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let want =
            sha256_hex(format!("{}{}", sha256_hex(b"first"), sha256_hex(b"second")).as_bytes());
        let got = model_weights(dir.path()).unwrap();
        assert_eq!((got.sha256.as_str(), got.files), (want.as_str(), 2));
    }
}
