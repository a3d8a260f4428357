//! Strided reads as the memory system sees them, and the elementwise template's tiled path.
//!
//! A warp's loads are served in 32-byte sectors. The elementwise template's lanes run along the
//! iteration space's last axis (`EQ_VEC` consecutive elements a thread, 32 threads a warp), so
//! an input whose contiguous axis is another one (a transpose) has each lane touch a sector of
//! its own, and uses 2 of its 32 bytes for bf16. [`read_traffic`] counts, by enumerating the
//! elements of sampled warps, the sectors each read's lanes touch against the bytes they use;
//! the cost model prices a kernel by them (`caps::elementwise_reads`).
//!
//! Where such a read has a contiguous axis `P` inside the space, [`tiled`] takes the tiled path
//! (`kernels/elementwise.cu`, `EQ_TILED`): a block copies a 32 x 32 tile of the read into shared
//! memory with its lanes along `P`, then computes with lanes along the last axis, so both sides
//! use whole sectors. It is taken where it touches fewer sectors of those reads than the plain
//! path does, counted the same way; the rest of the body keeps its plain accesses, one element a
//! lane.

use std::collections::BTreeSet;

use super::super::lower::{Lowered, Op};
use crate::ir::layout::contiguous;
use crate::plan::Template;

/// Elements of a tile's side (`EQ_TILE`): a warp's lanes, one element each.
pub const TILE: usize = 32;
/// Rows of threads in a tiled block (`EQ_TROWS`): each runs `TILE / TILE_ROWS` rows of a tile.
pub const TILE_ROWS: usize = 8;
/// Bytes of a memory sector, the unit a warp's access is served in.
const SECTOR: usize = 32;
/// Threads of a warp.
const WARP: usize = 32;
/// Warps sampled over the iteration space to count an access's sectors.
const SAMPLES: usize = 8;

/// The tiled path of a kernel: the space's axis `axis` (P) is the tiled reads' contiguous axis,
/// and `accesses` are the accesses read through a tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiled {
    pub axis: usize,
    pub accesses: BTreeSet<usize>,
}

/// What one read's accesses cost the memory system in the path codegen takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReadTraffic {
    /// Index into the kernel's `reads`.
    pub read: usize,
    /// Bytes of sectors touched per byte used (at least 1; the largest over the read's accesses).
    pub sectors_per_byte: f64,
    /// Elements of the iteration space between the first and the last warp that touch one
    /// sector, where later warps use the rest of what the first fetched (a transposed read's
    /// sector holds the elements of the next output rows): the cost model asks whether that
    /// window fits in L2. `None` where no warp uses the rest (it is fetched and wasted).
    pub reuse_elements: Option<u64>,
    /// On the plain path, the bytes of the sectors all the kernel's warps touch (each warp's
    /// sectors once: a read broadcast along an axis is touched again at each index of it, a
    /// value broadcast along a warp's lanes once a warp); `None` through the tile, where a
    /// read's sectors are its bytes times `sectors_per_byte`.
    pub sector_traffic: Option<u64>,
}

/// The element offsets, in elements of its tensor, of an access with `strides` for flat indices
/// `range` of `domain`.
fn offsets<'a>(
    domain: &'a [usize],
    strides: &'a [usize],
    range: std::ops::Range<usize>,
) -> impl Iterator<Item = usize> + 'a {
    range.map(move |i| {
        let mut q = i;
        let mut off = 0;
        for k in (0..domain.len()).rev() {
            off += (q % domain[k]) * strides[k];
            q /= domain[k];
        }
        off
    })
}

/// The sampled groups of `group` consecutive flat elements of a space of `numel` (each one
/// warp's accesses), and how many groups the space has.
fn sampled_groups(numel: usize, group: usize) -> (Vec<std::ops::Range<usize>>, usize) {
    let group = group.max(1);
    let groups = numel.div_ceil(group).max(1);
    let n = SAMPLES.min(groups);
    let picked: BTreeSet<usize> = (0..n).map(|s| s * groups / n).collect();
    (picked.into_iter().map(|g| g * group..(g * group + group).min(numel)).collect(), groups)
}

/// Sectors touched per byte used by the groups of `group` consecutive flat elements starting
/// at sampled places, when each group is one warp's accesses (distinct sectors over its lanes).
fn sampled_ratio(
    numel: usize,
    group: usize,
    bytes: usize,
    sectors: impl Fn(std::ops::Range<usize>) -> (usize, usize),
) -> f64 {
    let (touched, used) =
        sampled_groups(numel, group).0.into_iter().map(sectors).fold((0usize, 0usize), |(t, u), (a, b)| (t + a, u + b));
    if used == 0 {
        1.0
    } else {
        (touched * SECTOR) as f64 / (used * bytes) as f64
    }
}

/// Distinct sectors and distinct elements among `offs` of `bytes`-byte elements.
fn count(offs: impl Iterator<Item = usize>, bytes: usize) -> (usize, usize) {
    let mut elems: Vec<usize> = offs.collect();
    elems.sort_unstable();
    elems.dedup();
    let mut sectors: Vec<usize> = elems.iter().map(|&o| o * bytes / SECTOR).collect();
    sectors.dedup();
    (sectors.len(), elems.len())
}

/// Sectors per byte used of an access read by the plain path, `vec` consecutive elements a lane.
fn plain_ratio(domain: &[usize], strides: &[usize], bytes: usize, vec: usize) -> f64 {
    let numel = domain.iter().product();
    sampled_ratio(numel, WARP * vec, bytes, |r| count(offsets(domain, strides, r), bytes))
}

/// The bytes of the sectors the plain path's warps touch over the whole space, `vec`
/// consecutive elements a lane: the sampled warps' mean times the warps.
fn plain_traffic(domain: &[usize], strides: &[usize], bytes: usize, vec: usize) -> u64 {
    let (sampled, groups) = sampled_groups(domain.iter().product(), WARP * vec);
    let touched: usize = sampled.iter().map(|r| count(offsets(domain, strides, r.clone()), bytes).0).sum();
    (touched as f64 / sampled.len().max(1) as f64 * groups as f64 * SECTOR as f64) as u64
}

/// Sectors per byte used of an access read through the tile along axis `p`: a warp loads
/// `TILE` consecutive elements along `p` at one place of the other axes.
fn tiled_ratio(domain: &[usize], strides: &[usize], bytes: usize, p: usize) -> f64 {
    let run = domain[p].min(TILE);
    let offs: Vec<usize> = (0..run).map(|i| i * strides[p]).collect();
    let (t, u) = count(offs.into_iter(), bytes);
    (t * SECTOR) as f64 / (u * bytes).max(1) as f64
}

/// The accesses the body reads by plain loads (a slice at an offset, a concatenation's operand
/// or a gather is an indexed load, which stays on the plain path).
fn plain_loads(l: &Lowered) -> BTreeSet<usize> {
    let indexed: BTreeSet<usize> = l
        .nodes
        .iter()
        .filter_map(|n| if let Op::IndexLoad { access, .. } = n.op { Some(access) } else { None })
        .collect();
    l.nodes
        .iter()
        .filter_map(|n| if let Op::Load(a) = n.op { Some(a) } else { None })
        .filter(|a| !indexed.contains(a))
        .collect()
}

/// Whether an access is transposed: read with stride 1 along axis `p`, an axis of the space
/// other than its last, along which it is neither contiguous nor broadcast.
fn transposed_along(l: &Lowered, a: usize) -> Option<usize> {
    let r = l.domain.len();
    let s = &l.accesses[a].strides;
    if r < 2 || s[r - 1] <= 1 || l.domain[r - 1] < 2 {
        return None;
    }
    (0..r - 1).find(|&k| s[k] == 1 && l.domain[k] > 1)
}

/// The tiled path of an elementwise kernel whose lanes would be `vec` wide on the plain path,
/// where it applies and touches fewer sectors of the transposed reads than the plain path:
/// no packed mask (`packed`: the kernel reads or writes one; a mask is assembled a warp along the
/// last axis), no scatter and no product.
pub fn tiled(l: &Lowered, vec: usize, packed: bool) -> Option<Tiled> {
    if l.template != Template::Elementwise || packed || l.scatter.is_some() || l.product.is_some() {
        return None;
    }
    let loads = plain_loads(l);
    let axis = loads.iter().find_map(|&a| transposed_along(l, a))?;
    let accesses: BTreeSet<usize> = loads.into_iter().filter(|&a| transposed_along(l, a) == Some(axis)).collect();
    // Sectors per byte used, summed over the kernel's accesses and stores (those off the tile
    // at 1 in either path).
    let others = (l.accesses.len() - accesses.len() + l.stores.len()) as f64;
    let (mut plain, mut tile) = (others, others);
    for &a in &accesses {
        let acc = &l.accesses[a];
        let b = acc.dtype.size();
        plain += plain_ratio(&l.domain, &acc.strides, b, vec);
        tile += tiled_ratio(&l.domain, &acc.strides, b, axis);
    }
    let occupancy = tile_occupancy(l.domain[axis], l.domain[l.domain.len() - 1]);
    (tile / occupancy.sqrt() < plain).then_some(Tiled { axis, accesses })
}

/// The share of a tile's slots that hold elements where the tiled axis P has `p` elements and
/// the last axis `l`: a block walks whole `TILE` x `TILE` tiles (two barriers and every slot's
/// index arithmetic a tile), so a tile over 3 x 2 elements costs a block much of what a full one
/// does for 6 of its 1024 elements. The tiled path's sectors are weighed at its square root, as
/// the tiled kernels of the H200's fidelity runs ran against their price (contiguous: about
/// 1.0x): a share of 0.5 (512 or 768 with 16) 1.34x-1.53x, 0.25 (50257 with 8) 5.1x, 0.0625 (2
/// with 8192) 3.8x, 0.006 (a [16, 2, 50257, 3] transpose swapping its axes of 2 and 3: 3 with 2)
/// 38x (`benches/results/2026-11-28-h200-session19`).
fn tile_occupancy(p: usize, l: usize) -> f64 {
    let share = |n: usize| if n == 0 { 1.0 } else { n as f64 / n.next_multiple_of(TILE) as f64 };
    share(p) * share(l)
}

/// The traffic of each read that touches more sectors than it uses, in the path codegen takes
/// (`tiled`, or the plain path with `vec` lanes).
pub fn read_traffic(l: &Lowered, vec: usize, tiled: Option<&Tiled>) -> Vec<ReadTraffic> {
    let r = l.domain.len();
    let cs = contiguous(&l.domain);
    let mut out: Vec<ReadTraffic> = Vec::new();
    for a in plain_loads(l) {
        let acc = &l.accesses[a];
        let b = acc.dtype.size();
        let ratio = match tiled {
            Some(t) if t.accesses.contains(&a) => tiled_ratio(&l.domain, &acc.strides, b, t.axis),
            // (Off the tile, the tiled path runs one element a lane.)
            Some(_) => plain_ratio(&l.domain, &acc.strides, b, 1),
            None => plain_ratio(&l.domain, &acc.strides, b, vec),
        };
        if ratio <= 1.0 + 1e-9 || r == 0 {
            continue;
        }
        // The rest of a sector lies along the axis of the smallest stride under a sector; a
        // later warp reaches it after that axis's steps in the space (the domain's contiguous
        // stride of the axis per step), a sector holding SECTOR / (stride x bytes) steps.
        let near = (0..r)
            .filter(|&k| l.domain[k] > 1 && acc.strides[k] > 0 && acc.strides[k] * b < SECTOR)
            .min_by_key(|&k| acc.strides[k]);
        let reuse_elements = near.map(|k| (SECTOR / (acc.strides[k] * b)) as u64 * cs[k] as u64);
        let sector_traffic = match tiled {
            Some(t) if t.accesses.contains(&a) => None,
            Some(_) => Some(plain_traffic(&l.domain, &acc.strides, b, 1)),
            None => Some(plain_traffic(&l.domain, &acc.strides, b, vec)),
        };
        let traffic = ReadTraffic { read: acc.read, sectors_per_byte: ratio, reuse_elements, sector_traffic };
        match out.iter_mut().find(|t| t.read == acc.read) {
            Some(t) if t.sectors_per_byte >= ratio => {}
            Some(t) => *t = traffic,
            None => out.push(traffic),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_bf16_reads_touch_a_sector_an_element() {
        // out[i, j] = x[j, i], x [4096, 2048] bf16: lanes along j read x with stride 2048.
        let (dom, s) = ([2048usize, 4096], [1usize, 2048]);
        assert!((plain_ratio(&dom, &s, 2, 8) - 16.0).abs() < 1e-9);
        // Through the tile a warp reads 32 consecutive elements: 2 whole sectors.
        assert!((tiled_ratio(&dom, &s, 2, 0) - 1.0).abs() < 1e-9);
        // A contiguous f32 read uses whole sectors; a broadcast row as many as it touches.
        assert!((plain_ratio(&dom, &[4096, 1], 4, 4) - 1.0).abs() < 1e-9);
        assert!((plain_ratio(&dom, &[0, 1], 4, 4) - 1.0).abs() < 1e-9);
        // Every other f32 element (a step-2 slice): half of each sector.
        assert!((plain_ratio(&[64, 512], &[1024, 2], 4, 4) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn tile_occupancy_is_the_share_of_slots_holding_elements() {
        assert_eq!(tile_occupancy(8192, 8192), 1.0);
        assert_eq!(tile_occupancy(3, 2), 6.0 / 1024.0);
        assert_eq!(tile_occupancy(48, 8192), 0.75);
        assert_eq!(tile_occupancy(50257, 8), 50257.0 / 50272.0 * 0.25);
    }
}
