//! Strided views: the strides a reshape or broadcast of a view has over the same memory. The
//! planner keeps a view only where these give strides, and codegen indexes by them.

/// Row-major strides of a shape.
pub fn contiguous(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// Strides of `reshape` applied to a strided view, when the new shape can be expressed by
/// strides over the same memory (PyTorch's `computeStride`); `None` otherwise.
pub fn reshape_strides(old: &[usize], strides: &[usize], new: &[usize]) -> Option<Vec<usize>> {
    let numel: usize = old.iter().product();
    if old.is_empty() || numel <= 1 {
        return Some(contiguous(new));
    }
    let mut out = vec![0; new.len()];
    let mut view_d = new.len() as isize - 1;
    let mut base = strides[old.len() - 1];
    let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
    for d in (0..old.len()).rev() {
        tensor_numel *= old[d];
        let chunk_ends = d == 0 || (old[d - 1] != 1 && strides[d - 1] != tensor_numel * base);
        if !chunk_ends {
            continue;
        }
        while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
            out[view_d as usize] = view_numel * base;
            view_numel *= new[view_d as usize];
            view_d -= 1;
        }
        if view_numel != tensor_numel {
            return None;
        }
        if d > 0 {
            base = strides[d - 1];
            tensor_numel = 1;
            view_numel = 1;
        }
    }
    (view_d == -1).then_some(out)
}

/// Strides of `broadcast(x, dims)` for a view `x` of `shape` with `strides`.
pub fn broadcast_strides(shape: &[usize], strides: &[usize], dims: &[usize]) -> Vec<usize> {
    let pad = dims.len() - shape.len().min(dims.len());
    (0..dims.len()).map(|k| if k < pad || shape[k - pad] == 1 { 0 } else { strides[k - pad] }).collect()
}

/// A view's layout in which an axis may be several `(extent, stride)` factors, outermost first:
/// an index along the axis is read in mixed radix over the factors' extents. It describes every
/// chain of transposes, broadcasts and reshapes over row-major memory, including a reshape that
/// merges axes no single stride describes, such as a broadcast head axis merged with the heads
/// (grouped-query attention's `reshape(broadcast(reshape(k, [B, KV, 1, S, D]), [B, KV, G, S,
/// D]), [B, H, S, D])`). Extent-1 factors are dropped, and neighbours that one stride describes
/// are merged, so an axis of at most one factor has the plain stride [`Factored::strides`] gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Factored {
    pub shape: Vec<usize>,
    pub axes: Vec<Vec<(usize, usize)>>,
}

/// Drops extent-1 factors and merges neighbours `(e1, s1), (e2, s2)` with `s1 = e2 * s2`.
fn simplify(factors: impl IntoIterator<Item = (usize, usize)>) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (e, s) in factors {
        if e == 1 {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == e * s => *last = (last.0 * e, s),
            _ => out.push((e, s)),
        }
    }
    out
}

impl Factored {
    /// The row-major layout of `shape`.
    pub fn contiguous(shape: &[usize]) -> Factored {
        let axes = shape.iter().zip(contiguous(shape)).map(|(&n, s)| simplify([(n, s)])).collect();
        Factored { shape: shape.to_vec(), axes }
    }

    /// A layout of plain strides (each axis one factor).
    pub fn of_strides(shape: &[usize], strides: &[usize]) -> Factored {
        let axes = shape.iter().zip(strides).map(|(&n, &s)| simplify([(n, s)])).collect();
        Factored { shape: shape.to_vec(), axes }
    }

    /// Plain strides, when every axis is at most one factor (an axis of extent 1 has stride 0).
    pub fn strides(&self) -> Option<Vec<usize>> {
        self.axes
            .iter()
            .map(|f| match f.as_slice() {
                [] => Some(0),
                [(_, s)] => Some(*s),
                _ => None,
            })
            .collect()
    }

    /// The factors of axes `range`, outermost first, as one mixed-radix index.
    pub fn flat(&self, range: std::ops::Range<usize>) -> Vec<(usize, usize)> {
        simplify(self.axes[range].iter().flatten().copied())
    }

    pub fn transpose(&self, a: usize, b: usize) -> Factored {
        let mut out = self.clone();
        out.shape.swap(a, b);
        out.axes.swap(a, b);
        out
    }

    /// `broadcast(x, dims)`: new leading axes and extent-1 axes widened read with stride 0.
    pub fn broadcast(&self, dims: &[usize]) -> Factored {
        let pad = dims.len() - self.shape.len().min(dims.len());
        let axes = (0..dims.len())
            .map(|k| {
                if k < pad || self.shape[k - pad] == 1 {
                    simplify([(dims[k], 0)])
                } else {
                    self.axes[k - pad].clone()
                }
            })
            .collect();
        Factored { shape: dims.to_vec(), axes }
    }

    /// `reshape(x, new)`: the row-major order of the elements is kept, so the factors of all
    /// axes, read as one mixed-radix index, are cut anew at the new axes' bounds; a factor a
    /// bound falls inside is split, `(e, s)` into `(e / f, s * f), (f, s)`, which needs `f` to
    /// divide `e`. `None` where a bound does not divide a factor.
    pub fn reshape(&self, new: &[usize]) -> Option<Factored> {
        if self.shape.iter().product::<usize>() != new.iter().product::<usize>() {
            return None;
        }
        if new.contains(&0) {
            return Some(Factored::contiguous(new));
        }
        let mut flat = self.flat(0..self.axes.len());
        let mut axes = vec![Vec::new(); new.len()];
        for (d, &need) in new.iter().enumerate().rev() {
            let mut taken: Vec<(usize, usize)> = Vec::new();
            let mut acc = 1;
            while acc < need {
                let (e, s) = flat.pop()?;
                if need % (acc * e) == 0 {
                    taken.push((e, s));
                    acc *= e;
                } else {
                    let f = need / acc;
                    if need % acc != 0 || e % f != 0 {
                        return None;
                    }
                    taken.push((f, s));
                    flat.push((e / f, s * f));
                    acc = need;
                }
            }
            axes[d] = simplify(taken.into_iter().rev());
        }
        flat.is_empty().then(|| Factored { shape: new.to_vec(), axes })
    }
}

/// Cuts the mixed-radix factors of several views of one index space (each outermost first, of
/// one total extent) at a common set of bounds, so that every view has one stride on each
/// piece: the pieces' extents, outermost first, and each view's stride on each. `None` when the
/// views' bounds (the products of their inner factors) do not form a chain in which each
/// divides the next.
pub fn common_factors(views: &[Vec<(usize, usize)>]) -> Option<(Vec<usize>, Vec<Vec<usize>>)> {
    let mut bounds: Vec<usize> = vec![1];
    for v in views {
        let mut p = 1;
        for &(e, _) in v.iter().rev() {
            p *= e;
            bounds.push(p);
        }
    }
    bounds.sort_unstable();
    bounds.dedup();
    if bounds.windows(2).any(|w| w[1] % w[0] != 0) {
        return None;
    }
    let total = *bounds.last().unwrap_or(&1);
    let mut strides = Vec::with_capacity(views.len());
    for v in views {
        if v.iter().map(|f| f.0).product::<usize>() != total {
            return None;
        }
        // Innermost first: each factor with the product of the factors inside it.
        let mut inner = Vec::with_capacity(v.len());
        let mut p = 1;
        for &(e, s) in v.iter().rev() {
            inner.push((p, e, s));
            p *= e;
        }
        let per_piece: Vec<usize> = bounds
            .windows(2)
            .map(|w| {
                let lo = w[0];
                let &(p, _, s) = inner.iter().find(|&&(p, e, _)| p <= lo && lo < p * e).expect("bounds lie inside");
                s * (lo / p)
            })
            .rev()
            .collect();
        strides.push(per_piece);
    }
    let extents = bounds.windows(2).map(|w| w[1] / w[0]).rev().collect();
    Some((extents, strides))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factored_reshapes_agree_with_plain_strides() {
        // Every reshape plain strides describe gives those strides.
        let cases: [(&[usize], &[usize], &[usize]); 4] = [
            (&[4, 6], &[6, 1], &[2, 2, 6]),
            (&[4, 6], &[6, 1], &[24]),
            (&[6, 4], &[1, 6], &[6, 1, 4]),
            (&[2, 3, 4], &[4, 8, 1], &[2, 3, 2, 2]),
        ];
        for (old, s, new) in cases {
            let f = Factored::of_strides(old, s).reshape(new).unwrap();
            let plain = reshape_strides(old, s, new).unwrap();
            let got = f.strides().unwrap();
            for (k, &n) in new.iter().enumerate() {
                if n != 1 {
                    assert_eq!(got[k], plain[k], "{old:?} {s:?} -> {new:?}");
                }
            }
        }
    }

    #[test]
    fn grouped_heads_are_two_factors() {
        // k [2, 3, 5, 4] broadcast to 2 query heads per key head, merged to [2, 6, 5, 4].
        let k = Factored::contiguous(&[2, 3, 5, 4]).reshape(&[2, 3, 1, 5, 4]).unwrap();
        let wide = k.broadcast(&[2, 3, 2, 5, 4]).reshape(&[2, 6, 5, 4]).unwrap();
        assert_eq!(wide.strides(), None);
        assert_eq!(wide.axes[1], vec![(3, 20), (2, 0)]);
        // Element (b, h, s, d) is k[b, h / 2, s, d] for every index.
        for h in 0..6 {
            let off: usize = [(0usize, 1usize), (1, h), (2, 3), (3, 2)]
                .iter()
                .map(|&(a, i)| {
                    let mut i = i;
                    let mut o = 0;
                    for &(e, s) in wide.axes[a].iter().rev() {
                        o += (i % e) * s;
                        i /= e;
                    }
                    o
                })
                .sum();
            assert_eq!(off, 60 + (h / 2) * 20 + 3 * 4 + 2);
        }
        // The queries' contiguous batch and the keys' cut at common bounds.
        let q = Factored::contiguous(&[2, 6, 5, 4]);
        let (extents, strides) = common_factors(&[q.flat(0..2), wide.flat(0..2)]).unwrap();
        assert_eq!(extents, vec![6, 2]);
        assert_eq!(strides, vec![vec![40, 20], vec![20, 0]]);
        // Bounds that do not nest have no common cut.
        assert_eq!(common_factors(&[vec![(6, 1)], vec![(2, 0), (3, 1)], vec![(3, 1), (2, 5)]]), None);
    }
}
