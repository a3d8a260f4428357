//! L2 residency in plan order: which bytes a kernel reads from L2 rather than device memory.
//!
//! Kernels run one after another, so a tensor that one kernel writes or reads is, for a while,
//! in L2 when a later kernel reads it: an unfused chain on small tensors re-reads its
//! intermediates from L2. The model is a least-recently-used cache of whole tensors with the
//! profile's reuse capacity (`l2_reuse_bytes`): after each kernel, every tensor it read or
//! wrote is the most recent, and the oldest bytes leave first. A kernel streams a tensor from its
//! start, so when only `r` of a tensor's `b` bytes are resident, reading the `b - r` missing
//! bytes evicts the oldest bytes, which are the resident part itself: `max(0, 2r - b)` bytes
//! hit. The plan's timed runs start with L2 flushed, and so does the model.
//! Invariant: only the predicted times of a plan in order use this; the fusion search weighs
//! kernels without it (a kernel's cost there does not depend on its neighbours).

use crate::cost::profile::DeviceProfile;
use crate::plan::dag::Dag;
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
        for &(t, b) in reads {
            let r = cache.iter().find(|c| c.0 == t).map_or(0, |c| c.1.min(b));
            hit += (2 * r).saturating_sub(b);
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

/// Predicted time of each kernel of a fusion state, in plan order (`Fusion::ordered`), with
/// the reads that hit L2 charged at L2 bandwidth when the profile models L2.
pub fn ordered_times(dag: &Dag, fusion: &Fusion, profile: &DeviceProfile) -> Vec<f64> {
    let groups = fusion.ordered();
    let hits = match profile.l2_reuse_bytes {
        Some(capacity) => {
            let access: Vec<Access> = groups
                .iter()
                .map(|g| {
                    let reads = g.cost.reads.iter().map(|&r| (r, dag.bytes(r))).collect();
                    let writes =
                        g.members.iter().filter(|&&m| fusion.is_written(m)).map(|&m| (m, dag.bytes(m))).collect();
                    (reads, writes)
                })
                .collect();
            l2_hits(&access, capacity)
        }
        None => vec![0; groups.len()],
    };
    groups
        .iter()
        .zip(hits)
        .map(|(g, hit)| g.cost.predict_us_hit(dag, profile, fusion.group_write_bytes(g), hit))
        .collect()
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
