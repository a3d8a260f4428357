//! Device memory of a plan: which tensors are live while each kernel runs, the peak, and the
//! tensors saved between kernels (for a joint forward and backward graph: the values the forward
//! keeps for the backward).
//!
//! Liveness over plan order: a program input is live for the whole plan (the caller owns it); an
//! output from the kernel that writes it to the end; any other tensor a kernel writes (an
//! intermediate) from that kernel to the last kernel that reads it, both included. The peak is
//! the largest sum of live tensors' bytes over the kernels (the inputs alone when the plan has
//! none). Kernel workspaces (a column reduction's partial sums) are not tensors and not counted.
//! A saved bool tensor may be stored packed, 1 bit per element ([`packed_bytes`]).
//! Invariant: the report is a pure function of the kernels' reads and writes and the tensors'
//! sizes, so the plan (`FusionPlan::memory`) and the planner's budget search agree.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ir::types::{DType, TensorType};

/// Bytes of a bool tensor stored packed: 1 bit per element, in whole 32-bit words (one word per
/// warp of 32 elements on the GPU).
pub fn packed_bytes(numel: usize) -> u64 {
    numel.div_ceil(32) as u64 * 4
}

/// The words of a packed mask: element `i` (row-major) is bit `i % 32` of word `i / 32`, the bits
/// past the last element zero; the layout generated kernels store and load (`eq_bits` in
/// `kernels/common.cuh`). `None` unless the tensor is bool.
pub fn pack_mask(t: &crate::ir::tensor::Tensor) -> Option<Vec<u32>> {
    if t.dtype != DType::Bool {
        return None;
    }
    let mut words = vec![0u32; t.numel().div_ceil(32)];
    for (i, &v) in t.data.iter().enumerate() {
        if v != 0.0 {
            words[i / 32] |= 1 << (i % 32);
        }
    }
    Some(words)
}

/// The bool tensor of type `ty` that packed words hold (see [`pack_mask`]); `None` when the words
/// are too few for it.
pub fn unpack_mask(words: &[u32], ty: &TensorType) -> Option<crate::ir::tensor::Tensor> {
    let n = ty.numel();
    if words.len() < n.div_ceil(32) || ty.dtype != DType::Bool {
        return None;
    }
    let data = (0..n).map(|i| ((words[i / 32] >> (i % 32)) & 1) as f64).collect();
    crate::ir::tensor::Tensor::new(DType::Bool, ty.shape.clone(), data).ok()
}

/// Whether a tensor of this type is stored packed when it is saved between kernels.
pub fn packable(ty: &TensorType) -> bool {
    ty.dtype == DType::Bool && ty.numel() > 1
}

/// A tensor written by one kernel and read by later ones, never a program output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SavedTensor {
    pub name: String,
    #[serde(flatten)]
    pub ty: TensorType,
    /// Bytes it takes in device memory (packed when `packed`).
    pub bytes: u64,
    /// Stored 1 bit per element (a bool mask), not one byte.
    pub packed: bool,
    /// The kernel that writes it.
    pub written_by: usize,
    /// The last kernel that reads it.
    pub last_read_by: usize,
}

/// The device memory a plan needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryReport {
    /// Most bytes of live device tensors while any one kernel runs.
    pub peak_bytes: u64,
    /// The first kernel at which the peak is reached (`None` for a plan without kernels).
    pub peak_kernel: Option<usize>,
    /// Bytes of the program's inputs (live throughout).
    pub inputs_bytes: u64,
    /// Bytes of the program's outputs that are not inputs.
    pub outputs_bytes: u64,
    /// Tensors saved between kernels, in the order they are written.
    pub saved: Vec<SavedTensor>,
    /// The budget the plan was made under (`--memory-budget`), if any.
    pub budget_bytes: Option<u64>,
    /// Bytes live while each kernel runs, in plan order.
    pub live_bytes: Vec<u64>,
}

impl MemoryReport {
    /// Bytes over `budget` summed over the kernels: what the budget search drives to zero (it
    /// falls with every saved tensor dropped at a kernel over the budget, even where several
    /// kernels share the peak).
    pub fn excess(&self, budget: u64) -> u64 {
        self.live_bytes.iter().map(|&b| b.saturating_sub(budget)).sum::<u64>()
            + self.inputs_bytes.saturating_sub(budget) * self.live_bytes.is_empty() as u64
    }
}

/// What liveness needs of one kernel: the tensors it reads and writes.
pub struct KernelIo<'a> {
    pub reads: Vec<&'a str>,
    pub writes: Vec<&'a str>,
}

/// The memory report of kernels run in order. `ty_of` gives each tensor's type, `packed` whether a
/// saved tensor is stored 1 bit per element.
pub fn liveness(
    kernels: &[KernelIo],
    inputs: &[(&str, &TensorType)],
    outputs: &[&str],
    ty_of: &dyn Fn(&str) -> Option<TensorType>,
    packed: &dyn Fn(&str) -> bool,
) -> MemoryReport {
    let is_input: BTreeMap<&str, u64> = inputs.iter().map(|(n, t)| (*n, t.bytes())).collect();
    let inputs_bytes: u64 = is_input.values().sum();
    let is_output = |n: &str| outputs.contains(&n);
    // (first kernel, last kernel, bytes) of every tensor a kernel writes.
    let mut spans: BTreeMap<&str, (usize, usize, u64)> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for (k, io) in kernels.iter().enumerate() {
        for &w in &io.writes {
            if is_input.contains_key(w) || spans.contains_key(w) {
                continue;
            }
            let ty = ty_of(w);
            let bytes = match &ty {
                Some(t) if !is_output(w) && packed(w) => packed_bytes(t.numel()),
                Some(t) => t.bytes(),
                None => 0,
            };
            let last = if is_output(w) { kernels.len() - 1 } else { k };
            spans.insert(w, (k, last, bytes));
            order.push(w);
        }
        for &r in &io.reads {
            if let Some(s) = spans.get_mut(r) {
                s.1 = s.1.max(k);
            }
        }
    }
    let outputs_bytes = spans.iter().filter(|(n, _)| is_output(n)).map(|(_, s)| s.2).sum();
    let (mut peak_bytes, mut peak_kernel) = (inputs_bytes, None);
    let mut live_bytes = Vec::with_capacity(kernels.len());
    // Bytes becoming live at each kernel and no longer live after it (a sweep, not a sum over
    // every tensor at every kernel: that was quadratic in the program's length).
    let mut starts = vec![0u64; kernels.len() + 1];
    let mut ends = vec![0u64; kernels.len() + 1];
    for s in spans.values() {
        starts[s.0] += s.2;
        ends[s.1 + 1] += s.2;
    }
    let mut running = 0u64;
    for k in 0..kernels.len() {
        running = running + starts[k] - ends[k];
        let live: u64 = inputs_bytes + running;
        live_bytes.push(live);
        if peak_kernel.is_none() || live > peak_bytes {
            peak_bytes = live;
            peak_kernel = Some(k);
        }
    }
    let saved = order
        .into_iter()
        .filter(|n| !is_output(n))
        .filter_map(|n| {
            let (first, last, bytes) = spans[n];
            let ty = ty_of(n)?;
            Some(SavedTensor {
                name: n.to_string(),
                packed: packed(n) && bytes < ty.bytes(),
                ty,
                bytes,
                written_by: first,
                last_read_by: last,
            })
        })
        .collect();
    MemoryReport { peak_bytes, peak_kernel, inputs_bytes, outputs_bytes, saved, budget_bytes: None, live_bytes }
}

/// Parses a byte count: a whole number with an optional unit (`B`, `KB`, `MB`, `GB`, `TB`: powers
/// of 1000; `KiB`, `MiB`, `GiB`, `TiB`: powers of 1024), e.g. `1073741824`, `512MiB`, `1.5GB`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "`{s}` is not a byte count: unknown unit `{other}` (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a byte count (e.g. 1073741824, 512MiB, 1.5GB)"))?;
    let bytes = v * scale;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is not a byte count that fits 64 bits"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32(shape: &[usize]) -> TensorType {
        TensorType::new(DType::F32, shape.to_vec())
    }

    #[test]
    fn intermediates_live_from_writer_to_last_reader() {
        // k0: x -> a; k1: a -> b; k2: a, b -> out. a lives 0..=2, b 1..=2, out 2..=2.
        let x = f32(&[256]);
        let ks = [
            KernelIo { reads: vec!["x"], writes: vec!["a"] },
            KernelIo { reads: vec!["a"], writes: vec!["b"] },
            KernelIo { reads: vec!["a", "b"], writes: vec!["out"] },
        ];
        let ty = |_: &str| Some(f32(&[256]));
        let m = liveness(&ks, &[("x", &x)], &["out"], &ty, &|_| false);
        assert_eq!(m.inputs_bytes, 1024);
        assert_eq!(m.outputs_bytes, 1024);
        assert_eq!(m.peak_bytes, 4 * 1024);
        assert_eq!(m.peak_kernel, Some(2));
        assert_eq!(
            m.saved.iter().map(|s| (s.name.as_str(), s.written_by, s.last_read_by)).collect::<Vec<_>>(),
            [("a", 0, 2), ("b", 1, 2)]
        );
        // Freed after its last reader: with k2 reading only b, a is dead at k2.
        let ks2 = [
            KernelIo { reads: vec!["x"], writes: vec!["a"] },
            KernelIo { reads: vec!["a"], writes: vec!["b"] },
            KernelIo { reads: vec!["b"], writes: vec!["out"] },
        ];
        let m2 = liveness(&ks2, &[("x", &x)], &["out"], &ty, &|_| false);
        assert_eq!(m2.peak_bytes, 3 * 1024);
    }

    #[test]
    fn packed_masks_take_a_bit_per_element() {
        assert_eq!(packed_bytes(1), 4);
        assert_eq!(packed_bytes(32), 4);
        assert_eq!(packed_bytes(33), 8);
        let m = TensorType::new(DType::Bool, vec![1000]);
        let x = f32(&[1000]);
        let ks =
            [KernelIo { reads: vec!["x"], writes: vec!["m"] }, KernelIo { reads: vec!["x", "m"], writes: vec!["o"] }];
        let ty = |n: &str| Some(if n == "m" { m.clone() } else { x.clone() });
        let r = liveness(&ks, &[("x", &x)], &["o"], &ty, &|n| n == "m");
        assert_eq!(r.saved[0].bytes, 128);
        assert!(r.saved[0].packed);
        assert_eq!(r.peak_bytes, 4000 + 128 + 4000);
    }

    #[test]
    fn packed_words_hold_bit_i_mod_32_of_word_i_div_32() {
        use crate::ir::tensor::Tensor;
        let ty = TensorType::new(DType::Bool, vec![3, 23]);
        let t = Tensor::from_fn(&ty, |i| ((i * 7 + i / 5) % 3 == 0) as u8 as f64);
        let words = pack_mask(&t).unwrap();
        assert_eq!(words.len(), 3);
        for i in 0..69 {
            assert_eq!((words[i / 32] >> (i % 32)) & 1 == 1, t.data[i] != 0.0, "element {i}");
        }
        // The bits past the 69th element are zero, and the words give the tensor back.
        assert_eq!(words[2] >> 5, 0);
        assert_eq!(unpack_mask(&words, &ty).unwrap(), t);
        assert!(unpack_mask(&words[..2], &ty).is_none());
        assert!(pack_mask(&Tensor::zeros(&f32(&[4]))).is_none());
        assert_eq!(words.len() as u64 * 4, packed_bytes(69));
    }

    #[test]
    fn byte_counts_parse_with_units() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("2 GiB").unwrap(), 2 << 30);
        assert!(parse_bytes("12 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("-5").is_err());
    }
}
