//! L2 residency in plan order: which bytes a kernel reads from L2 rather than device memory.
//!
//! Kernels run one after another, so a tensor that one kernel writes or reads is, for a while,
//! in L2 when a later kernel reads it: an unfused chain on small tensors re-reads its
//! intermediates from L2. The model is a least-recently-used cache of whole tensors with the
//! profile's reuse capacity (`l2_reuse_bytes`): after each kernel, every tensor it read or
//! wrote is the most recent, and the oldest bytes leave first. A kernel streams a tensor from its
//! start, so when only `r` of a tensor's `b` bytes are resident, reading the `b - r` missing
//! bytes evicts the oldest bytes, which are the resident part itself; so do the lines the kernel
//! writes meanwhile, `w / a` of them per byte it reads (`w` written, `a` read in all):
//! `max(0, r - (b - r) (1 + w / a))` bytes hit (`2r - b` for a kernel that only reads). On the
//! H100 (fidelity run of 2026-11-27, 250 generated programs, 4,702 kernels re-priced) this took
//! the share of kernels within 15% from 76.8% to 79.2%: elementwise kernels that read and write
//! a 33.5 MB tensor had been priced with 19 MB of hits and ran as if they had none (26 us, 21.7
//! predicted), while kernels that only read it ran as `2r - b` has them. The plan's timed runs
//! start with L2 flushed, and so does the model.
//!
//! Written lines stay in L2 (`l2_dirty_bytes` of them) until a later kernel's reads and writes
//! take their place, and that kernel writes them back: `write_backs`. The flush before a timed
//! run writes twice L2's size, so the first kernel starts with L2 full of written lines.
//! Invariant: only the predicted times of a plan in order use this; the fusion search weighs
//! kernels without it (a kernel's cost there does not depend on its neighbours).

use crate::cost::profile::DeviceProfile;
use crate::plan::dag::Dag;
use crate::plan::Template;
use crate::search::fuse::Fusion;

/// One kernel's device-memory accesses: (reads, writes), each a list of (tensor, bytes).
pub type Access = (Vec<(usize, u64)>, Vec<(usize, u64)>);

/// Bytes each kernel reads from L2, for kernels given in plan order.
pub fn l2_hits(kernels: &[Access], capacity: u64) -> Vec<u64> {
    // Resident tensors, least recent first: (tensor, resident bytes).
    let mut cache: Vec<(usize, u64)> = Vec::new();
    let mut hits = Vec::with_capacity(kernels.len());
    for (reads, writes) in kernels {
        let mut hit = 0;
        let read: u64 = reads.iter().map(|r| r.1).sum();
        let written: u64 = writes.iter().map(|w| w.1).sum();
        // Lines taken per byte read past the resident part: its own, and the writes'.
        let taken = 1.0 + written as f64 / read.max(1) as f64;
        for &(t, b) in reads {
            let r = cache.iter().find(|c| c.0 == t).map_or(0, |c| c.1.min(b));
            hit += if r >= b { b } else { (r as f64 - (b - r) as f64 * taken).max(0.0) as u64 };
        }
        for &(t, b) in reads.iter().chain(writes) {
            cache.retain(|c| c.0 != t);
            cache.push((t, b));
        }
        let mut total: u64 = cache.iter().map(|c| c.1).sum();
        while total > capacity {
            let out = cache[0].1.min(total - capacity);
            cache[0].1 -= out;
            total -= out;
            if cache[0].1 == 0 {
                cache.remove(0);
            }
        }
        hits.push(hit);
    }
    hits
}

/// Bytes each kernel reads from L2, for kernels given in plan order, by reuse distance: a read
/// line hits with a chance that is 1 where fewer than `near` distinct bytes were touched since
/// its last touch, 0 where more than `far`, and falls linearly between.
///
/// Every kernel streams all its tensors together from their starts, so the line at position
/// `p` (0 to 1) of tensor `t` (`b` bytes), last touched by kernel `j` and read by kernel `k`,
/// has seen, since, the rest of kernel `j`'s tensors from `p` on, every tensor the kernels
/// between touched, and kernel `k`'s tensors up to `p`: a distance linear in `p`, from
/// `d0 = b + S(j, between)` at the tensor's first line to `d1 = b + S(between, k)` at its last,
/// where `S` sums the distinct tensors of those kernels other than `t`. The hit bytes are `b`
/// times the chance averaged over `p`. A chain of kernels on tensors of 24 MB (each reads the
/// last one's result and writes one as large) then sees `d0 = d1 = 48 MB`, beyond what the
/// whole-tensor form (`l2_hits`) could tell from a tensor that stayed resident.
pub fn l2_hits_by_distance(kernels: &[Access], near: u64, far: u64) -> Vec<u64> {
    // Every tensor's last touch (kernel, bytes), and the bytes of last touches by kernel in a
    // Fenwick tree: the distinct bytes touched in kernels `a..b` are those whose last touch
    // (before the kernel at hand) lies there, a difference of two prefix sums, so each read
    // costs a logarithm of the plan's length, not a walk back over it.
    let mut last: std::collections::HashMap<usize, (usize, u64)> = std::collections::HashMap::new();
    let mut tree = Fenwick::new(kernels.len());
    let mut hits = Vec::with_capacity(kernels.len());
    for (k, access) in kernels.iter().enumerate() {
        let touched = distinct_touches(access);
        let mut hit = 0.0;
        for &(t, b) in &access.0 {
            let Some(&(j, bt)) = last.get(&t) else { continue };
            // Distinct bytes touched since kernel j (t's own last touch excluded), and those
            // of this kernel's other tensors not touched since kernel j.
            let since_j = tree.range(j, k) - bt;
            let between = tree.range(j + 1, k);
            let fresh: u64 = touched
                .iter()
                .filter(|&&(u, _)| u != t && last.get(&u).is_none_or(|&(ju, _)| ju <= j))
                .map(|&(_, bu)| bu)
                .sum();
            let (d0, d1) = (b + since_j, b + between + fresh);
            hit += b as f64 * mean_hit_chance(d0 as f64, d1 as f64, near as f64, far as f64);
        }
        for &(t, b) in &touched {
            if let Some((j, bt)) = last.insert(t, (k, b)) {
                tree.add(j, -(bt as i64));
            }
            tree.add(k, b as i64);
        }
        hits.push(hit.round() as u64);
    }
    hits
}

/// A kernel's distinct tensors (read or written), each with the most bytes it touches of it.
fn distinct_touches((reads, writes): &Access) -> Vec<(usize, u64)> {
    let mut touched: Vec<(usize, u64)> = Vec::new();
    for &(t, b) in reads.iter().chain(writes) {
        match touched.iter_mut().find(|u| u.0 == t) {
            Some(u) => u.1 = u.1.max(b),
            None => touched.push((t, b)),
        }
    }
    touched
}

/// A Fenwick tree of byte counts by kernel index.
struct Fenwick(Vec<i64>);

impl Fenwick {
    fn new(n: usize) -> Self {
        Fenwick(vec![0; n + 1])
    }

    fn add(&mut self, i: usize, v: i64) {
        let mut i = i + 1;
        while i < self.0.len() {
            self.0[i] += v;
            i += i & i.wrapping_neg();
        }
    }

    /// The sum over indices below `i`.
    fn prefix(&self, i: usize) -> i64 {
        let (mut i, mut s) = (i.min(self.0.len() - 1), 0);
        while i > 0 {
            s += self.0[i];
            i -= i & i.wrapping_neg();
        }
        s
    }

    /// The sum over indices `a..b` (as bytes: never negative).
    fn range(&self, a: usize, b: usize) -> u64 {
        if b <= a {
            return 0;
        }
        (self.prefix(b) - self.prefix(a)).max(0) as u64
    }
}

/// The hit chance of `l2_hits_by_distance` averaged over distances spread evenly from `d0` to
/// `d1`: the integral of the chance over that range over its length.
fn mean_hit_chance(d0: f64, d1: f64, near: f64, far: f64) -> f64 {
    let width = far - near;
    let chance = |d: f64| ((far - d) / width).clamp(0.0, 1.0);
    // The integral of the chance from 0 to d.
    let integral = |d: f64| {
        if d <= near {
            d
        } else if d >= far {
            near + width / 2.0
        } else {
            near + (d - near) - (d - near).powi(2) / (2.0 * width)
        }
    };
    let (lo, hi) = if d0 <= d1 { (d0, d1) } else { (d1, d0) };
    if hi - lo < 1.0 {
        chance(lo)
    } else {
        (integral(hi) - integral(lo)) / (hi - lo)
    }
}

/// For kernels in plan order with their L2 hits, the bytes of earlier kernels' writes each
/// writes back to device memory less the bytes of its own it leaves in L2 for later kernels
/// (negative when it leaves more than it writes back), where L2 holds `dirty` written bytes.
///
/// A kernel that starts with `d` written bytes in L2 takes lines for its misses and its writes
/// (`a` bytes), writing back the written ones it displaces, oldest first; it ends with its own
/// writes `w` plus what it did not displace, at most `dirty`: `min(dirty, w + (d - a)+)`. Its
/// write traffic is then `d + w - end` where the cost model counts `w`. The first kernel starts
/// with `dirty` (the flush). In the steady state of a long copy (and of the calibration probes
/// of copy bandwidth and of the elementwise and row templates, which write at least `dirty`)
/// start and end are equal and the kernel pays its own writes, as calibrated.
pub fn write_backs(kernels: &[Access], hits: &[u64], dirty: u64) -> Vec<i64> {
    let mut start = dirty;
    kernels
        .iter()
        .zip(hits)
        .map(|((reads, writes), &hit)| {
            let read: u64 = reads.iter().map(|r| r.1).sum();
            let written: u64 = writes.iter().map(|w| w.1).sum();
            let taken = read.saturating_sub(hit) + written;
            let end = dirty.min(written + start.saturating_sub(taken));
            let delta = start as i64 - end as i64;
            start = end;
            delta
        })
        .collect()
}

/// Predicted time of each kernel of a fusion state, in plan order (`Fusion::ordered`), with
/// the reads that hit L2 charged at L2 bandwidth when the profile models L2, and the written
/// bytes L2 holds written back by the kernels that displace them where the profile says how
/// many it holds.
pub fn ordered_times(dag: &Dag, fusion: &Fusion, profile: &DeviceProfile) -> Vec<f64> {
    let groups = fusion.ordered();
    let access: Vec<Access> = groups
        .iter()
        .map(|g| {
            let reads = g.cost.reads.iter().map(|&r| (r, dag.bytes(r))).collect();
            let writes = g.members.iter().filter(|&&m| fusion.is_written(m)).map(|&m| (m, dag.bytes(m))).collect();
            (reads, writes)
        })
        .collect();
    let hits = match (profile.l2_reuse_bytes, profile.l2_reuse_limit_bytes) {
        (Some(near), Some(far)) => l2_hits_by_distance(&access, near, far),
        (Some(capacity), None) => l2_hits(&access, capacity),
        (None, _) => vec![0; groups.len()],
    };
    let backs = match profile.l2_dirty_bytes {
        Some(dirty) => write_backs(&access, &hits, dirty),
        None => vec![0; groups.len()],
    };
    groups
        .iter()
        .zip(hits.into_iter().zip(backs))
        .map(|(g, (hit, back))| {
            let back = if priced_by_write_backs(g.cost.template) { back } else { 0 };
            g.cost.predict_us_hit(dag, profile, fusion.group_write_bytes(g), hit, back)
        })
        .collect()
}

/// Whether a kernel of template `t` is priced with the write-backs of `write_backs`: the
/// templates whose bandwidth efficiencies are measured without them (elementwise and row
/// kernels in the steady state, column kernels with L2 clean: `eqfuse calibrate`). The gemm
/// and attention rates are measured on single kernels after the flush, write-backs included
/// (cuBLASLt's by size), and keep them; their writes still count for the kernels after them.
fn priced_by_write_backs(t: Template) -> bool {
    matches!(t, Template::Elementwise | Template::RowReduce | Template::ColReduce)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_read_again_while_it_fits_hits() {
        // x (10) read, then y written from it, then y read: y and x both fit in 30.
        let k = vec![(vec![(0, 10)], vec![(1, 10)]), (vec![(1, 10)], vec![(2, 10)]), (vec![(0, 10)], vec![])];
        assert_eq!(l2_hits(&k, 30), vec![0, 10, 10]);
    }

    #[test]
    fn streaming_a_tensor_larger_than_the_cache_evicts_its_own_resident_part() {
        // 20 bytes in a cache of 15: 15 resident, reading the 5 missing evicts 5 of them.
        let k = vec![(vec![(0, 20)], vec![]), (vec![(0, 20)], vec![])];
        assert_eq!(l2_hits(&k, 15), vec![0, 10]);
        // Half or less resident: nothing hits.
        assert_eq!(l2_hits(&k, 10), vec![0, 0]);
        // A kernel writing as much as it reads takes a line for each write too: with 15 of 20
        // resident, its 5 misses and their 5 writes evict 10 of the 15.
        let k = vec![(vec![(0, 20)], vec![]), (vec![(0, 20)], vec![(1, 20)])];
        assert_eq!(l2_hits(&k, 15), vec![0, 5]);
        // A tensor wholly resident hits whatever the kernel writes.
        let k = vec![(vec![(0, 10)], vec![]), (vec![(0, 10)], vec![(1, 40)])];
        assert_eq!(l2_hits(&k, 15), vec![0, 10]);
    }

    #[test]
    fn a_kernel_writes_back_what_earlier_kernels_wrote_as_it_displaces_it() {
        let dirty = 16;
        // After the flush (16 written bytes in L2): a kernel reading 40 displaces them all and
        // writes nothing: it writes back 16. The next, reading 40 too, finds L2 clean.
        let reads = |n: u64| (vec![(0, n)], vec![]);
        let k = vec![reads(40), (vec![(1, 40)], vec![])];
        assert_eq!(write_backs(&k, &[0, 0], dirty), vec![16, 0]);
        // A kernel writing 40 after a clean L2 leaves 16 of them there: it pays 24 of its 40;
        // a kernel that then reads 8 displaces 8 of them; one reading 40 the other 8.
        let k = vec![reads(40), (vec![(1, 40)], vec![(2, 40)]), reads(8), reads(40)];
        assert_eq!(write_backs(&k, &[0; 4], dirty), vec![16, -16, 8, 8]);
        // A long copy in the steady state pays its own writes, as calibrated.
        let copy = (vec![(0, 64)], vec![(1, 64)]);
        assert_eq!(write_backs(&[copy.clone(), copy], &[0, 0], dirty), vec![0, 0]);
        // Reads that hit L2 take no lines.
        let k = vec![(vec![(0, 40)], vec![])];
        assert_eq!(write_backs(&k, &[40], dirty), vec![0]);
    }

    #[test]
    fn reuse_distances_grow_with_the_bytes_touched_since_a_tensors_last_touch() {
        // A chain: kernel 0 reads x (24) and writes a (24); kernel 1 reads a and writes b (24).
        // Every line of a comes back after 48 bytes: within `near` it all hits, beyond `far`
        // none, halfway between half of it.
        let chain = vec![(vec![(0, 24)], vec![(1, 24)]), (vec![(1, 24)], vec![(2, 24)])];
        assert_eq!(l2_hits_by_distance(&chain, 48, 96), vec![0, 24]);
        assert_eq!(l2_hits_by_distance(&chain, 16, 48), vec![0, 0]);
        assert_eq!(l2_hits_by_distance(&chain, 32, 64), vec![0, 12]);
        // A kernel that only reads a finds its first line after 48 bytes and its last after
        // 24 (only a itself since): with near 24 and far 48, its chance falls from 1 to 0
        // along it, half of it on average.
        let reader = vec![(vec![(0, 24)], vec![(1, 24)]), (vec![(1, 24)], vec![])];
        assert_eq!(l2_hits_by_distance(&reader, 24, 48), vec![0, 12]);
        // Tensors the kernels between touched push the reads further; one touched twice counts
        // once; a tensor never touched before misses.
        let between = vec![
            (vec![], vec![(0, 10)]),
            (vec![(1, 10)], vec![(2, 10)]),
            (vec![(1, 10), (2, 10)], vec![]),
            (vec![(0, 10), (3, 10)], vec![]),
        ];
        // Tensor 0: written by kernel 0 (d0 = 10), then 1 and 2 touched (20), then kernel 3
        // touches 3 (10): from 30 to 40.
        assert_eq!(l2_hits_by_distance(&between, 40, 80), vec![0, 0, 20, 10]);
        assert_eq!(l2_hits_by_distance(&between, 20, 30), vec![0, 0, 20, 0]);
    }

    /// The distances as defined, walking back over the kernels: the reference for the Fenwick
    /// tree's sums, on pseudo-random plans.
    #[test]
    fn reuse_distances_match_a_walk_back_over_the_kernels() {
        fn walk(kernels: &[Access], near: u64, far: u64) -> Vec<u64> {
            let touched = |k: usize| distinct_touches(&kernels[k]);
            let distinct = |ks: &[usize], t: usize| {
                let mut seen: Vec<usize> = Vec::new();
                let mut total = 0;
                for &k in ks {
                    for (u, b) in touched(k) {
                        // A tensor's bytes as its latest touch among `ks` has them.
                        if u != t && !seen.contains(&u) {
                            seen.push(u);
                            let latest = ks.iter().rev().find_map(|&m| touched(m).into_iter().find(|x| x.0 == u));
                            total += latest.map_or(b, |x| x.1);
                        }
                    }
                }
                total
            };
            (0..kernels.len())
                .map(|k| {
                    let mut hit = 0.0;
                    for &(t, b) in &kernels[k].0 {
                        let Some(j) = (0..k).rev().find(|&j| touched(j).iter().any(|u| u.0 == t)) else { continue };
                        let first: Vec<usize> = (j..k).collect();
                        let mut last: Vec<usize> = (j + 1..k).collect();
                        last.push(k);
                        let (d0, d1) = (b + distinct(&first, t), b + distinct(&last, t));
                        hit += b as f64 * mean_hit_chance(d0 as f64, d1 as f64, near as f64, far as f64);
                    }
                    hit.round() as u64
                })
                .collect()
        }
        let mut seed = 12345u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..50 {
            let sizes: Vec<u64> = (0..12).map(|_| 1 + next(40)).collect();
            let kernels: Vec<Access> = (0..20)
                .map(|_| {
                    let reads = (0..next(4)).map(|_| next(12) as usize).map(|t| (t, sizes[t])).collect();
                    let writes = (0..next(3)).map(|_| next(12) as usize).map(|t| (t, sizes[t])).collect();
                    (reads, writes)
                })
                .collect();
            assert_eq!(l2_hits_by_distance(&kernels, 30, 90), walk(&kernels, 30, 90), "{kernels:?}");
        }
    }

    #[test]
    fn the_mean_hit_chance_is_the_chance_averaged_over_the_distances() {
        for (d0, d1) in [(0.0, 10.0), (30.0, 50.0), (50.0, 30.0), (10.0, 90.0), (45.0, 45.0)] {
            let n = 100_000;
            let chance = |d: f64| ((60.0 - d) / 20.0).clamp(0.0, 1.0);
            let mean = (0..n).map(|i| chance(d0 + (d1 - d0) * (i as f64 + 0.5) / n as f64)).sum::<f64>() / n as f64;
            assert!((mean_hit_chance(d0, d1, 40.0, 60.0) - mean).abs() < 1e-6, "{d0} {d1}");
        }
    }

    #[test]
    fn older_tensors_leave_first() {
        let k = vec![
            (vec![], vec![(0, 10)]),
            (vec![], vec![(1, 10)]),
            (vec![], vec![(2, 10)]),
            (vec![(0, 10), (2, 10)], vec![]),
        ];
        // Capacity 20: tensor 0 was evicted by tensor 2; tensor 2 is resident.
        assert_eq!(l2_hits(&k, 20), vec![0, 0, 0, 10]);
    }
}
