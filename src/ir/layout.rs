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
