//! Device memory of a run: which tensors share a buffer, by liveness over plan order.
//!
//! Inputs and the tensors that hold outputs keep buffers of their own. Every other tensor a
//! kernel writes (an intermediate) is live from its writer to its last reader; once its last
//! reader has run, its buffer is free for a tensor that a *later* kernel writes (never the
//! reader itself, which may still read while it writes). A new tensor takes the smallest free
//! buffer that holds it (best fit, first such buffer on ties); when none is free and large
//! enough, a new buffer is allocated. Buffers are allocated once, before the first launch, so
//! the run's peak device memory is the sum of every buffer's size (plus kernels' workspace).
//!
//! Invariants (checked by [`MemoryPlan::check`] and the tests): two tensors of one buffer are
//! never live at the same time; a buffer is at least as large as every tensor it holds; inputs
//! and outputs are never shared. The plan is a pure function of the kernels' reads and writes.

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::FusionPlan;

/// One kernel as the allocator sees it: the tensors it reads, and those it writes with sizes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub reads: Vec<String>,
    pub writes: Vec<(String, u64)>,
}

/// Where each tensor of a run lives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Tensors with a buffer of their own (inputs, outputs), with their sizes, in plan order.
    pub pinned: Vec<(String, u64)>,
    /// The size of each shared buffer.
    pub slots: Vec<u64>,
    /// For each intermediate tensor, its shared buffer.
    pub slot_of: BTreeMap<String, usize>,
    /// For each intermediate tensor, (writer, last reader) as kernel indices.
    pub live: BTreeMap<String, (usize, usize)>,
    /// Bytes allocated: every pinned and shared buffer.
    pub peak_bytes: u64,
    /// Bytes one buffer per tensor would allocate.
    pub unshared_bytes: u64,
    /// The most bytes live at once (pinned tensors plus the intermediates live around one
    /// kernel): no allocation that keeps each tensor in one place can use less.
    pub live_bytes: u64,
}

impl MemoryPlan {
    /// Plans the buffers of `steps` (kernels in launch order); `pinned` tensors (inputs and
    /// outputs, with sizes) get buffers of their own.
    pub fn new(steps: &[Step], pinned: &[(String, u64)]) -> MemoryPlan {
        let pinned_names: BTreeSet<&str> = pinned.iter().map(|(n, _)| n.as_str()).collect();
        let mut last_read: BTreeMap<&str, usize> = BTreeMap::new();
        for (k, s) in steps.iter().enumerate() {
            for r in &s.reads {
                last_read.insert(r, k);
            }
        }
        let mut plan = MemoryPlan { pinned: pinned.to_vec(), ..MemoryPlan::default() };
        let mut size: BTreeMap<String, u64> = BTreeMap::new();
        // Free buffers, and the tensors holding the others with the step after which they die.
        let mut free: Vec<usize> = vec![];
        let mut held: Vec<(usize, usize)> = vec![];
        for (k, s) in steps.iter().enumerate() {
            let (dead, alive): (Vec<_>, Vec<_>) = held.into_iter().partition(|&(_, end)| end < k);
            held = alive;
            free.extend(dead.into_iter().map(|(slot, _)| slot));
            for (name, bytes) in &s.writes {
                if pinned_names.contains(name.as_str()) || plan.slot_of.contains_key(name) {
                    continue;
                }
                let end = last_read.get(name.as_str()).copied().filter(|&e| e > k).unwrap_or(k);
                let best = free
                    .iter()
                    .enumerate()
                    .filter(|&(_, &slot)| plan.slots[slot] >= *bytes)
                    .min_by_key(|&(i, &slot)| (plan.slots[slot], i))
                    .map(|(i, _)| i);
                let slot = match best {
                    Some(i) => free.remove(i),
                    None => {
                        plan.slots.push(*bytes);
                        plan.slots.len() - 1
                    }
                };
                held.push((slot, end));
                plan.slot_of.insert(name.clone(), slot);
                plan.live.insert(name.clone(), (k, end));
                size.insert(name.clone(), *bytes);
            }
        }
        let pinned_bytes: u64 = pinned.iter().map(|(_, b)| b).sum();
        plan.peak_bytes = pinned_bytes + plan.slots.iter().sum::<u64>();
        plan.unshared_bytes = pinned_bytes + size.values().sum::<u64>();
        plan.live_bytes = pinned_bytes
            + (0..steps.len())
                .map(|k| plan.live.iter().filter(|(_, &(a, b))| a <= k && k <= b).map(|(n, _)| size[n]).sum::<u64>())
                .max()
                .unwrap_or(0);
        plan
    }

    /// The buffers of a fusion plan's run: its inputs and output tensors pinned.
    pub fn of_plan(plan: &FusionPlan) -> MemoryPlan {
        let steps: Vec<Step> = plan
            .kernels
            .iter()
            .map(|k| Step {
                reads: k.reads.iter().map(|t| t.name.clone()).collect(),
                writes: k.writes.iter().map(|t| (t.name.clone(), t.ty.bytes())).collect(),
            })
            .collect();
        let outputs: BTreeSet<&str> = plan.outputs.iter().map(|(_, t)| t.as_str()).collect();
        let mut pinned: Vec<(String, u64)> = plan.inputs.iter().map(|t| (t.name.clone(), t.ty.bytes())).collect();
        for k in &plan.kernels {
            for w in k.writes.iter().filter(|w| outputs.contains(w.name.as_str())) {
                if !pinned.iter().any(|(n, _)| n == &w.name) {
                    pinned.push((w.name.clone(), w.ty.bytes()));
                }
            }
        }
        MemoryPlan::new(&steps, &pinned)
    }

    /// Says what is wrong, if anything: two tensors of one buffer live at once, or a buffer
    /// smaller than a tensor it holds.
    pub fn check(&self, steps: &[Step]) -> Result<(), String> {
        let size: BTreeMap<&str, u64> =
            steps.iter().flat_map(|s| s.writes.iter().map(|(n, b)| (n.as_str(), *b))).collect();
        for (a, &sa) in &self.slot_of {
            if self.slots[sa] < size[a.as_str()] {
                return Err(format!("buffer {sa} of {} bytes holds `{a}` of {}", self.slots[sa], size[a.as_str()]));
            }
            for (b, &sb) in self.slot_of.range::<String, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
            {
                let ((a0, a1), (b0, b1)) = (self.live[a], self.live[b]);
                if sa == sb && a0 <= b1 && b0 <= a1 {
                    return Err(format!("`{a}` (kernels {a0}..={a1}) and `{b}` ({b0}..={b1}) share buffer {sa}"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(reads: &[&str], writes: &[(&str, u64)]) -> Step {
        Step {
            reads: reads.iter().map(|s| s.to_string()).collect(),
            writes: writes.iter().map(|(n, b)| (n.to_string(), *b)).collect(),
        }
    }

    fn pins(p: &[(&str, u64)]) -> Vec<(String, u64)> {
        p.iter().map(|(n, b)| (n.to_string(), *b)).collect()
    }

    #[test]
    fn a_chain_alternates_two_buffers() {
        // x -> a -> b -> c -> d -> y: each intermediate dies when the next is written.
        let steps = vec![
            step(&["x"], &[("a", 100)]),
            step(&["a"], &[("b", 100)]),
            step(&["b"], &[("c", 100)]),
            step(&["c"], &[("d", 100)]),
            step(&["d"], &[("y", 100)]),
        ];
        let m = MemoryPlan::new(&steps, &pins(&[("x", 100), ("y", 100)]));
        m.check(&steps).unwrap();
        assert_eq!(m.slots, vec![100, 100]);
        assert_eq!((m.slot_of["a"], m.slot_of["b"], m.slot_of["c"], m.slot_of["d"]), (0, 1, 0, 1));
        assert_eq!((m.peak_bytes, m.unshared_bytes, m.live_bytes), (400, 600, 400));
    }

    #[test]
    fn a_reader_never_writes_into_what_it_reads() {
        // `b` is written by the last reader of `a`: it must not take a's buffer.
        let steps = vec![step(&["x"], &[("a", 64)]), step(&["a"], &[("b", 64)]), step(&["b"], &[("y", 64)])];
        let m = MemoryPlan::new(&steps, &pins(&[("x", 64), ("y", 64)]));
        m.check(&steps).unwrap();
        assert_ne!(m.slot_of["a"], m.slot_of["b"]);
    }

    #[test]
    fn best_fit_takes_the_smallest_buffer_that_holds_the_tensor() {
        // At step 2, buffers of 1000 (big) and 200 (small) are free; a tensor of 150 takes
        // the 200 one; at step 3, one of 900 takes the 1000 one (not t's 8) and one of 2000
        // needs a new buffer.
        let steps = vec![
            step(&["x"], &[("big", 1000), ("small", 200)]),
            step(&["big", "small"], &[("t", 8)]),
            step(&["t"], &[("p", 150)]),
            step(&["p"], &[("q", 900), ("r", 2000)]),
            step(&["q", "r"], &[("y", 4)]),
        ];
        let m = MemoryPlan::new(&steps, &pins(&[("x", 4), ("y", 4)]));
        m.check(&steps).unwrap();
        assert_eq!(m.slot_of["p"], m.slot_of["small"]);
        assert_eq!(m.slot_of["q"], m.slot_of["big"]);
        assert_eq!(m.slots[m.slot_of["r"]], 2000);
        assert_eq!(m.slots.len(), 4, "{m:?}");
    }

    #[test]
    fn pinned_tensors_are_never_shared_and_long_lived_ones_stay() {
        // `keep` is read again at the end, so nothing written in between may take its buffer;
        // the output `o` (also read later) keeps its own.
        let steps = vec![
            step(&["x"], &[("keep", 50), ("o", 50)]),
            step(&["o"], &[("a", 50)]),
            step(&["a"], &[("b", 50)]),
            step(&["b", "keep"], &[("y", 50)]),
        ];
        let m = MemoryPlan::new(&steps, &pins(&[("x", 50), ("o", 50), ("y", 50)]));
        m.check(&steps).unwrap();
        assert!(!m.slot_of.contains_key("o") && !m.slot_of.contains_key("x"));
        assert_ne!(m.slot_of["keep"], m.slot_of["a"]);
        assert_ne!(m.slot_of["keep"], m.slot_of["b"]);
        assert_eq!(m.live["keep"], (0, 3));
    }

    #[test]
    fn the_check_catches_overlapping_tensors() {
        let steps = vec![step(&["x"], &[("a", 10), ("b", 10)]), step(&["a", "b"], &[("y", 10)])];
        let mut m = MemoryPlan::new(&steps, &pins(&[("x", 10), ("y", 10)]));
        m.check(&steps).unwrap();
        m.slot_of.insert("b".into(), m.slot_of["a"]);
        assert!(m.check(&steps).unwrap_err().contains("share buffer"));
    }

    #[test]
    fn example_plans_share_buffers_safely() {
        use crate::{load_program, optimize, unfused_plan, DeviceProfile, OptimizeOptions};
        let profile = DeviceProfile::load("h100").unwrap();
        for (file, dims) in [
            ("examples/layernorm.eqf", vec![("R".to_string(), 64), ("C".to_string(), 128)]),
            ("examples/cross_entropy.eqf", vec![("N".to_string(), 16), ("V".to_string(), 64)]),
            ("examples/layernorm_grad.eqf", vec![("R".to_string(), 16), ("C".to_string(), 64)]),
        ] {
            let p = load_program(file, &dims).unwrap();
            let fused = optimize(&p, &OptimizeOptions::new(profile.clone())).unwrap().plan;
            let unfused = unfused_plan(&p, &profile, false).unwrap();
            for plan in [fused, unfused] {
                let m = MemoryPlan::of_plan(&plan);
                let steps: Vec<Step> = plan
                    .kernels
                    .iter()
                    .map(|k| Step {
                        reads: k.reads.iter().map(|t| t.name.clone()).collect(),
                        writes: k.writes.iter().map(|t| (t.name.clone(), t.ty.bytes())).collect(),
                    })
                    .collect();
                m.check(&steps).unwrap_or_else(|e| panic!("{file}: {e}"));
                assert!(m.live_bytes <= m.peak_bytes && m.peak_bytes <= m.unshared_bytes, "{file}: {m:?}");
                for (out, t) in &plan.outputs {
                    assert!(!m.slot_of.contains_key(t), "{file}: output {out} shared");
                }
            }
        }
        // The unfused layernorm is a chain of 9 kernels over [64, 128] tensors: sharing must
        // save buffers there.
        let p = load_program("examples/layernorm.eqf", &[("R".into(), 64), ("C".into(), 128)]).unwrap();
        let m = MemoryPlan::of_plan(&unfused_plan(&p, &profile, false).unwrap());
        assert!(m.peak_bytes < m.unshared_bytes, "{m:?}");
    }
}
