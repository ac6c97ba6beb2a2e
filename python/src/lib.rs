//! `rsd._rsd`: rsd-loader for Python. The Python package (`python/rsd/__init__.py`) wraps this in
//! `rsd.Loader`, a `torch.utils.data.IterableDataset`; this module knows nothing of torch.
//!
//! A batch crosses as a dict of NumPy arrays over the loader's buffers: nothing is copied (with
//! `int64`, ids are widened once, in place of that copy). When Python lets go of an array, its
//! buffer goes back to the loader and holds a later batch (see [`Buffer`]).
//! The next batch is awaited without the GIL, so the loader's threads and Python run side by side.
//! Every loader error becomes `rsd.LoaderError` carrying the Rust error's message.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, MutexGuard};

use numpy::ndarray::ArrayView2;
use numpy::{Element, IntoPyArray, PyArray2, PyArrayMethods};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rsd_loader::{
    Batch, Batching, Dataset, Loader as RustLoader, LoaderConfig, LoaderState, Parallel, Pipeline,
    Positions, Rank, IGNORE_INDEX,
};

pyo3::create_exception!(
    rsd,
    LoaderError,
    PyException,
    "An error of the rsd loader (a shard, a state, a configuration); the message is the Rust error's."
);

fn loader_error(e: impl std::fmt::Display) -> PyErr {
    LoaderError::new_err(e.to_string())
}

/// A lock is poisoned only by a panic while it was held: the loader cannot go on after that.
fn locked<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| LoaderError::new_err("the loader failed earlier and cannot go on"))
}

/// A batch array's memory while NumPy (and torch, through it) uses it: the base object of the
/// array. When the last view is gone, the buffer is sent back to its loader, which fills it with
/// a later batch. Reusing it matters: a fresh 64K-token row is 64 fresh pages for each of ids,
/// labels and positions, and their page faults, taken by the loader's threads, cost more than
/// the copy itself. The memory is held as raw parts, not as a `Vec`, because Python may write to
/// the array (an in-place edit of the labels) while this object is alive.
#[pyclass(module = "rsd._rsd", frozen)]
struct Buffer {
    ptr: *mut i64,
    len: usize,
    cap: usize,
    /// The element is `i32` (ids as the loader makes them) or `i64` (widened).
    wide: bool,
    home: Sender<Recycled>,
}

// SAFETY: the buffer owns its memory (a leaked `Vec`), touched from Rust only in `Drop`.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

/// A buffer on its way back to the loader.
enum Recycled {
    Narrow(Vec<i32>),
    Wide(Vec<i64>),
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the parts are those of the `Vec` leaked in `Buffer::array`, of the element
        // type `wide` names; no array views the memory any more (this object was their base).
        let back = unsafe {
            if self.wide {
                Recycled::Wide(Vec::from_raw_parts(self.ptr, self.len, self.cap))
            } else {
                Recycled::Narrow(Vec::from_raw_parts(
                    self.ptr.cast::<i32>(),
                    self.len,
                    self.cap,
                ))
            }
        };
        // A loader that is gone takes nothing back: the Vec is freed here.
        let _ = self.home.send(back);
    }
}

impl Buffer {
    /// `v` as a `[rows, len]` NumPy array whose base object returns `v` to `home` when freed.
    fn array<'py, T: Element>(
        py: Python<'py>,
        v: Vec<T>,
        shape: [usize; 2],
        wide: bool,
        home: &Sender<Recycled>,
    ) -> PyResult<Bound<'py, PyArray2<T>>> {
        let mut v = std::mem::ManuallyDrop::new(v);
        let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
        let base = Bound::new(
            py,
            Buffer {
                ptr: ptr.cast(),
                len,
                cap,
                wide,
                home: home.clone(),
            },
        )?;
        // SAFETY: `ptr` holds `len` initialised elements (`shape` multiplies to `len`, checked by
        // the caller), and `base`, the array's base object, keeps them alive and in place.
        unsafe {
            let view = ArrayView2::from_shape_ptr(shape, ptr.cast_const());
            Ok(PyArray2::borrow_from_array(&view, base.into_any()))
        }
    }
}

/// Buffers back from Python, until a batch takes them.
struct Pool {
    returned: Receiver<Recycled>,
    narrow: Vec<Vec<i32>>,
    wide: Vec<Vec<i64>>,
}

impl Pool {
    /// A batch holds three buffers, and the loader keeps its own spares: more than a few batches'
    /// worth here would only hold memory.
    const KEEP: usize = 12;

    /// Take in what Python has freed since the last batch.
    fn collect(&mut self) {
        for back in self.returned.try_iter() {
            match back {
                Recycled::Narrow(v) if self.narrow.len() < Self::KEEP => self.narrow.push(v),
                Recycled::Wide(v) if self.wide.len() < Self::KEEP => self.wide.push(v),
                _ => {}
            }
        }
    }
}

/// One rank's stream of batches (see `rsd.Loader` for the arguments).
#[pyclass(module = "rsd._rsd")]
struct Loader {
    inner: Mutex<RustLoader>,
    /// Buffers that Python has let go of, for later batches (see [`Buffer`]).
    pool: Mutex<Pool>,
    /// Where a [`Buffer`] is sent when freed: `pool`'s receiving end.
    home: Sender<Recycled>,
    int64: bool,
    /// A dataset of the mixture carries a loss mask (chat data): batches get `loss_mask`.
    masked: bool,
    /// Batches carry the layout arrays and sample origins (always with context parallelism).
    meta: bool,
    /// The context-parallel group's size (no `cu_seqlens` above 1).
    cp_size: usize,
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (datasets, *, batch_size=None, token_budget=None, seed=0, epoch=0,
        epochs=None, dp_rank=0, dp_size=1, cp_rank=0, cp_size=1, shuffle=true, positions="auto",
        mask_doc_boundaries=None, workers=2, prefetch=4, verify=false, int64=true, meta=false, state=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        datasets: Vec<(PathBuf, f64)>,
        batch_size: Option<usize>,
        token_budget: Option<usize>,
        seed: u64,
        epoch: u64,
        epochs: Option<u64>,
        dp_rank: usize,
        dp_size: usize,
        cp_rank: usize,
        cp_size: usize,
        shuffle: bool,
        positions: &str,
        mask_doc_boundaries: Option<bool>,
        workers: usize,
        prefetch: usize,
        verify: bool,
        int64: bool,
        meta: bool,
        state: Option<&str>,
    ) -> PyResult<Self> {
        let batching =
            match (batch_size, token_budget) {
                (Some(_), Some(_)) => return Err(PyValueError::new_err(
                    "give micro_batch (rows per step) or token_budget (tokens per step), not both",
                )),
                (None, Some(t)) => Batching::Tokens(t),
                (b, None) => Batching::Samples(b.unwrap_or(1)),
            };
        let positions = match positions {
            "auto" => Positions::Auto,
            "row" => Positions::Row,
            "document" => Positions::Document,
            other => {
                return Err(PyValueError::new_err(format!(
                    "positions={other:?}: expected \"auto\", \"row\" or \"document\""
                )))
            }
        };
        let cfg = LoaderConfig {
            datasets: datasets
                .into_iter()
                .map(|(dir, weight)| Dataset::new(dir, weight))
                .collect(),
            seed,
            epoch,
            epochs,
            parallel: Parallel {
                dp: Rank::new(dp_rank, dp_size),
                cp: Rank::new(cp_rank, cp_size),
            },
            batching,
            shuffle,
            positions,
            mask_doc_boundaries,
            prefetch,
            workers,
            verify,
            ..LoaderConfig::default()
        };
        let state = state
            .map(|s| {
                serde_json::from_str::<LoaderState>(s)
                    .map_err(|e| PyValueError::new_err(format!("the loader state: {e}")))
            })
            .transpose()?;
        // Opening checks every shard's files (and with verify reads them): no GIL needed.
        let inner = py
            .detach(|| match &state {
                Some(s) => RustLoader::resume(cfg, s),
                None => RustLoader::new(cfg),
            })
            .map_err(loader_error)?;
        let masked = (0..inner.config().datasets.len())
            .any(|k| inner.manifest(k).is_some_and(|m| m.loss_mask.is_some()));
        let meta = meta || cp_size > 1;
        let (home, returned) = channel();
        Ok(Loader {
            inner: Mutex::new(inner),
            pool: Mutex::new(Pool {
                returned,
                narrow: Vec::new(),
                wide: Vec::new(),
            }),
            home,
            int64,
            masked,
            meta,
            cp_size,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch as a dict of NumPy arrays and ints; `None` (StopIteration) at the end.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let next = py.detach(|| self.lock().map(|mut l| l.next()))?;
        match next {
            None => Ok(None),
            Some(Err(e)) => Err(loader_error(e)),
            Some(Ok(batch)) => {
                let (dict, rest) = self.to_dict(py, batch)?;
                self.lock()?.recycle(rest);
                Ok(Some(dict))
            }
        }
    }

    /// The loader state after the last batch returned, as JSON (prefetched batches not counted).
    fn state_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.lock()?.state()).map_err(loader_error)
    }

    /// The datasets' packing length (tokens per row before context-parallel slicing).
    #[getter]
    fn seq_len(&self) -> PyResult<u64> {
        Ok(self.lock()?.seq_len())
    }

    /// Samples in each dataset, in the order given.
    #[getter]
    fn dataset_sizes(&self) -> PyResult<Vec<u64>> {
        Ok(self.lock()?.dataset_sizes())
    }
}

impl Loader {
    fn lock(&self) -> PyResult<MutexGuard<'_, RustLoader>> {
        locked(&self.inner)
    }

    /// The batch's arrays moved into NumPy (shaped `[rows, len]` when every row has the same
    /// length, else `[1, total]`), and what is left of the batch for reuse.
    fn to_dict<'py>(&self, py: Python<'py>, mut b: Batch) -> PyResult<(Bound<'py, PyDict>, Batch)> {
        let d = PyDict::new(py);
        let ro = &b.row_offsets;
        let rows = ro.len().saturating_sub(1);
        let len0 = if rows > 0 { ro[1] - ro[0] } else { 0 };
        let shape = if rows > 0 && ro.windows(2).all(|w| w[1] - w[0] == len0) {
            [rows, len0 as usize]
        } else {
            [1, b.tokens.len()]
        };
        let loss_mask: Option<Vec<bool>> = self
            .masked
            .then(|| b.labels.iter().map(|&l| l != IGNORE_INDEX).collect());
        let mut pool = locked(&self.pool)?;
        pool.collect();
        let ids = [&mut b.tokens, &mut b.labels, &mut b.position_ids];
        for (name, slot) in ["input_ids", "labels", "position_ids"].into_iter().zip(ids) {
            let shape = if shape[0] * shape[1] == slot.len() {
                shape
            } else {
                [1, slot.len()]
            };
            if self.int64 {
                // The narrow buffer stays with the batch for the loader to refill.
                let mut wide = pool.wide.pop().unwrap_or_default();
                wide.clear();
                wide.extend(slot.iter().map(|&x| x as i64));
                d.set_item(name, Buffer::array(py, wide, shape, true, &self.home)?)?;
            } else {
                let v = std::mem::replace(slot, pool.narrow.pop().unwrap_or_default());
                d.set_item(name, Buffer::array(py, v, shape, false, &self.home)?)?;
            }
        }
        if let Some(m) = loss_mask {
            d.set_item("loss_mask", m.into_pyarray(py).reshape(shape)?)?;
        }
        let as_i32 = |v: &[u32]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        if self.cp_size <= 1 {
            // Without context parallelism full-row and local coordinates agree: the document
            // pieces are flash-attention's varlen `cu_seqlens`.
            let max = b
                .doc_offsets
                .windows(2)
                .map(|w| w[1] - w[0])
                .max()
                .unwrap_or(0);
            d.set_item("cu_seqlens", as_i32(&b.doc_offsets).into_pyarray(py))?;
            d.set_item("max_seqlen", max)?;
        }
        // Each array costs the consumer a few microseconds a batch (here and in torch): the
        // layout and the origins come when asked for, or when context parallelism needs them.
        if self.meta {
            d.set_item("doc_offsets", as_i32(&b.doc_offsets).into_pyarray(py))?;
            d.set_item("row_offsets", as_i32(&b.row_offsets).into_pyarray(py))?;
            d.set_item(
                "full_row_offsets",
                as_i32(&b.full_row_offsets).into_pyarray(py),
            )?;
            let chunks: Vec<i32> = b
                .chunks
                .iter()
                .flat_map(|c| [c[0] as i32, c[1] as i32])
                .collect();
            d.set_item(
                "chunks",
                chunks.into_pyarray(py).reshape([b.chunks.len(), 2])?,
            )?;
            let samples: Vec<i64> = b
                .samples
                .iter()
                .flat_map(|s| {
                    [
                        s.dataset as i64,
                        s.shard as i64,
                        s.index as i64,
                        s.global as i64,
                        s.epoch as i64,
                    ]
                })
                .collect();
            d.set_item(
                "samples",
                samples.into_pyarray(py).reshape([b.samples.len(), 5])?,
            )?;
        }
        d.set_item("step", b.step)?;
        d.set_item("num_tokens", b.num_tokens)?;
        d.set_item("num_label_tokens", b.num_label_tokens)?;
        Ok((d, b))
    }
}

/// The datasets of a pipeline file (pipelines/*.json) as (directory, weight) pairs, relative
/// directories resolved against `data_root`.
#[pyfunction]
fn read_pipeline(path: PathBuf, data_root: PathBuf) -> PyResult<Vec<(PathBuf, f64)>> {
    let p = Pipeline::read(&path, &data_root).map_err(loader_error)?;
    Ok(p.datasets.into_iter().map(|d| (d.dir, d.weight)).collect())
}

#[pymodule]
fn _rsd(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Loader>()?;
    m.add_function(wrap_pyfunction!(read_pipeline, m)?)?;
    m.add("LoaderError", m.py().get_type::<LoaderError>())?;
    Ok(())
}
