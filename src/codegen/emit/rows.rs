//! Rendering for `kernels/rowreduce.cu`: reduction stages (with online softmax pairs), row
//! values in `EqRow`, cached row loads, the epilogue, row stores and global (all-row) results.
//! Invariant: a value is computed in the first stage where everything it depends on is known,
//! so a cached row is read from memory once. One-hot sums along the row (`sum(a * onehot(t))`,
//! cross-entropy's picked value) are no stage: outside strict numerics they are row values,
//! `a` read at column `t` (H200, cross-entropy gradient 8192x32000: 710 -> 568 us,
//! benches/results/2026-11-22-h200-86c34f4-cevariants). A stage over a cached row keeps a
//! per-element value the epilogue needs in the cache in place of the raw value (softmax's
//! `exp(x - max)`), so the epilogue does not compute it again (see [`plan::reuse`]). A row too
//! long for registers is kept in shared memory where its inputs fit there in their storage
//! types ([`row_shape`]), and every pass after the first reads that copy; where two rows fit, a
//! block copies its next row while it works on one (pipelined). On a 9.0 device such a row is
//! instead spread over a cluster of blocks ([`row_cluster`]), each block's segment in
//! registers: the source carries that form as its Hopper path beside the portable one.

use super::*;

/// The plan of a row kernel.
mod plan {
    use super::*;

    /// The plan of a row kernel: levels, stages, cached loads and row values.
    pub(super) struct RowPlan {
        /// Stages that must finish before a node can be computed.
        pub avail: Vec<usize>,
        /// Reductions of each stage, in accumulator order.
        pub stages: Vec<Vec<usize>>,
        /// Cached accesses (by load node), in cache order.
        pub cached: Vec<usize>,
        /// Row values kept in `EqRow`.
        pub row_nodes: Vec<usize>,
        /// Results reduced over all rows, in accumulator order.
        pub globals: Vec<usize>,
        /// Values computed from global results alone (a loss's `silu` or square), in node
        /// order: computed once every row is combined, in `eq_global_store`, not per row.
        pub after_globals: Vec<usize>,
        /// Online pairs: (sum of exp(x - m), its max m), computed in the max's stage.
        pub online: Vec<(usize, usize)>,
        /// One-hot sums (reduction, index, value): computed as row values, the value at the
        /// index's column, instead of in a stage (see [`one_hot`]).
        pub picks: Vec<(usize, usize, usize)>,
        /// Cached values a stage overwrites (cache slot, node, stage): after its accumulation
        /// the stage stores the per-element value `node` into the slot, and the epilogue reads
        /// it there instead of computing it again (see [`reuse`]).
        pub reuse: Vec<(usize, usize, usize)>,
    }

    /// Whether `n` is the same for every column of a row.
    fn row_uniform(l: &Lowered, n: usize, last: usize) -> bool {
        match &l.nodes[n].op {
            Op::Const(_) | Op::Reduce(..) | Op::Global(..) => true,
            Op::Load(a) => l.accesses[*a].strides[last] == 0,
            Op::Coord(k) => *k != last,
            Op::Flat(strides) | Op::Iota(strides) => strides[last] == 0,
            Op::Dropout { .. } => false,
            Op::IndexLoad { access, index, .. } => {
                l.accesses[*access].strides[last] == 0 && index.is_none_or(|ix| row_uniform(l, ix.node, last))
            }
            op => children(op).into_iter().all(|c| row_uniform(l, c, last)),
        }
    }

    /// A one-hot sum along the row, `sum(a * f32(col == t))` or `sum(where(col == t, a, 0))`
    /// with `t` an i32 value the same for the whole row (cross-entropy's picked log-probability
    /// and the gradient's one-hot terms): `(t, a)`. Its value is `a` at column `t` (0 when `t`
    /// is outside the row), read there instead of reduced over the row: every other term is a
    /// zero. Exact for the `where` form; for the product form only while `a` is finite
    /// elsewhere in the row (an infinite or NaN `a` times 0 is NaN), so strict numerics keep
    /// the reduction.
    pub(super) fn one_hot(l: &Lowered, i: usize) -> Option<(usize, usize)> {
        let last = l.domain.len().checked_sub(1)?;
        let Op::Reduce(Reduce::Sum, p) = l.nodes[i].op else { return None };
        if l.nodes[i].dtype != DType::F32 || l.nodes[p].dtype != DType::F32 {
            return None;
        }
        let index = |h: usize| -> Option<usize> {
            let Op::Binary(Binary::Eq, x, y) = l.nodes[h].op else { return None };
            let col = |n: usize| matches!(l.nodes[n].op, Op::Coord(k) if k == last);
            let t = if col(x) {
                y
            } else if col(y) {
                x
            } else {
                return None;
            };
            (l.nodes[t].dtype == DType::I32 && row_uniform(l, t, last)).then_some(t)
        };
        let pick = match l.nodes[p].op {
            Op::Binary(Binary::Mul, x, y) => [(x, y), (y, x)].into_iter().find_map(|(a, b)| match l.nodes[b].op {
                Op::Cast(DType::F32, h) => index(h).map(|t| (t, a)),
                _ => None,
            }),
            Op::Where(h, a, z) if matches!(l.nodes[z].op, Op::Const(c) if c == 0.0) => index(h).map(|t| (t, a)),
            _ => None,
        };
        pick.filter(|&(_, a)| l.nodes[a].dtype == DType::F32)
    }

    /// `online`: whether a `sum(exp(x - amax(x)))` may share its max's stage as an online pair.
    pub(super) fn plan(e: &Emitter, online_pairs: bool) -> RowPlan {
        let l = e.l;
        let r = e.rank();
        let n = l.nodes.len();
        let elem: Vec<bool> = l.nodes.iter().map(|x| r > 0 && x.shape[r - 1] > 1).collect();
        let mut avail = vec![0usize; n];
        let mut stages: Vec<Vec<usize>> = vec![];
        let mut online: Vec<(usize, usize)> = vec![];
        let mut picks: Vec<(usize, usize, usize)> = vec![];
        for i in 0..n {
            let below = children(&l.nodes[i].op).iter().map(|&c| avail[c]).max().unwrap_or(0);
            avail[i] = below;
            if let Some((t, a)) = one_hot(l, i).filter(|_| !e.strict) {
                picks.push((i, t, a));
                continue;
            }
            // Strict numerics keep the two passes the unfused plan makes (max, then the sum).
            let pair = if e.strict || !online_pairs { None } else { online_max(l, i) };
            if let Some(m) = pair.filter(|m| !online.iter().any(|(_, x)| x == m)) {
                let st = avail[m] - 1;
                stages[st].push(i);
                avail[i] = st + 1;
                online.push((i, m));
                continue;
            }
            if let Op::Reduce(..) = l.nodes[i].op {
                if stages.len() <= below {
                    stages.resize(below + 1, vec![]);
                }
                stages[below].push(i);
                avail[i] = below + 1;
            }
        }
        // Stages left empty by one-hot sums go: a value needs the stages before it that remain.
        let kept: Vec<usize> =
            (0..=stages.len()).map(|k| stages[..k].iter().filter(|s| !s.is_empty()).count()).collect();
        avail.iter_mut().for_each(|a| *a = kept[*a]);
        stages.retain(|s| !s.is_empty());
        let live = e.closure(&l.stores.iter().map(|s| s.node).collect::<Vec<_>>(), &e.scope(false));
        let in_stages: Vec<usize> = stages.iter().flatten().map(|&x| children(&l.nodes[x].op)[0]).collect();
        let stage_nodes = e.closure(&in_stages, &e.scope(false));
        let cached: Vec<usize> = stage_nodes
            .iter()
            .copied()
            .filter(|&i| elem[i] && matches!(l.nodes[i].op, Op::Load(_)) && l.nodes[i].dtype.is_float())
            .collect();
        let mut all: BTreeSet<usize> = live.into_iter().collect();
        all.extend(stage_nodes);
        let globals: Vec<usize> = all.iter().copied().filter(|&i| matches!(l.nodes[i].op, Op::Global(..))).collect();
        // Nodes are in topological order: a node after a global depends on one.
        let mut late = vec![false; n];
        for &i in &all {
            late[i] = children(&l.nodes[i].op).iter().any(|&c| late[c] || globals.contains(&c));
        }
        let after_globals: Vec<usize> = all.iter().copied().filter(|&i| late[i]).collect();
        let row_nodes = all
            .into_iter()
            .filter(|&i| !elem[i] && !late[i] && !matches!(l.nodes[i].op, Op::Const(_) | Op::Flat(_) | Op::Global(..)))
            .collect();
        RowPlan { avail, stages, cached, row_nodes, globals, after_globals, online, picks, reuse: vec![] }
    }

    impl RowPlan {
        /// Whether `n` is known only once every row is combined: a global result or a value
        /// computed from them (stored by `eq_global_store`).
        pub fn after_rows(&self, n: usize) -> bool {
            self.globals.contains(&n) || self.after_globals.contains(&n)
        }
    }

    /// Per-element values a cached row's stage computes and the epilogue computes again, kept
    /// in the cache instead (cache slot, node, stage): for each cached load `x`, the last stage
    /// `s` that reads `x` and a float value `y` of `x` that stage computes (softmax's
    /// `exp(x - max)` in its sum's stage) such that the epilogue, given `y`, needs `x` no more.
    /// Stage `s` then overwrites `x` by `y` in the cache once its accumulation has read both,
    /// and the epilogue reads `y` (the same value: same operations, same roundings, strict
    /// numerics included). Of several such `y`, the one that leaves the epilogue least to
    /// compute. `roots`: the epilogue's stored values. Only for rows the row template keeps in
    /// registers (`EQ_CACHED`; a GEMM's row epilogue fetches its row afresh) without online
    /// pairs (a pair's stage computes its exponentials itself).
    /// H200, cross-entropy gradient 8192x32000 (hand variant C2 of C1): 568 -> 548 us,
    /// benches/results/2026-11-22-h200-86c34f4-cevariants.
    pub(super) fn reuse(e: &Emitter, rp: &RowPlan, roots: &[usize]) -> Vec<(usize, usize, usize)> {
        if !rp.online.is_empty() {
            return vec![];
        }
        let (l, r) = (e.l, e.rank());
        let scope = e.row_scope(rp, false);
        let stage: Vec<Vec<usize>> = rp
            .stages
            .iter()
            .map(|reds| e.closure(&reds.iter().map(|&i| children(&l.nodes[i].op)[0]).collect::<Vec<_>>(), &scope))
            .collect();
        let mut epi = scope.clone();
        let mut out = vec![];
        for (k, &x) in rp.cached.iter().enumerate() {
            let Some(s) = (0..stage.len()).rev().find(|&s| stage[s].contains(&x)) else { continue };
            if !e.closure(roots, &epi).contains(&x) {
                continue;
            }
            let mut best: Option<(usize, usize)> = None;
            for &y in &stage[s] {
                let node = &l.nodes[y];
                if y == x
                    || r == 0
                    || node.shape[r - 1] <= 1
                    || node.dtype != DType::F32
                    || matches!(node.op, Op::Load(_) | Op::Const(_) | Op::Flat(_) | Op::Iota(_))
                    || out.iter().any(|&(_, z, _)| z == y)
                    || !e.closure(&[y], &scope).contains(&x)
                {
                    continue;
                }
                let mut with = epi.clone();
                with.refs[y] = Some(String::new());
                let left = e.closure(roots, &with);
                if !left.contains(&x) && best.is_none_or(|(n, _)| left.len() <= n) {
                    best = Some((left.len(), y));
                }
            }
            if let Some((_, y)) = best {
                epi.refs[y] = Some(String::new());
                out.push((k, y, s));
            }
        }
        out
    }
}

impl Emitter<'_> {
    /// The rows and columns of the iteration space (a rank-0 space is one row of one).
    fn rows_cols(&self) -> (usize, usize) {
        let r = self.rank();
        let cols = if r == 0 { 1 } else { self.dim(r - 1) };
        let numel: usize = self.l.domain.iter().product();
        (numel.checked_div(cols).unwrap_or(0), cols)
    }

    /// How the row template cuts each row into segments (`EQ_SEGS`, `kernels/rowreduce.cu`):
    /// where the kernel's outputs are all row values of one reduction stage (sums, means,
    /// maxima and minima, several side by side, an online max and sum of exponentials, with
    /// pointwise prologues and per-row epilogues), outside strict numerics (which keep the
    /// unfused plan's order of summation) and without global results, [`segment_shape`] of
    /// its rows. A kernel that writes per-element values after its reduction (softmax over
    /// one huge row) keeps one block a row: its epilogue needs the whole row's result.
    pub(super) fn segments(&self) -> Option<Segments> {
        if self.strict || self.rank() == 0 || self.l.product.is_some() || !self.epilogue_roots().is_empty() {
            return None;
        }
        let rp = plan::plan(self, true);
        if rp.stages.len() != 1 || !rp.globals.is_empty() {
            return None;
        }
        let (rows, cols) = self.rows_cols();
        segment_shape(rows, cols, self.vec)
    }

    /// The cluster a row is spread over on a 9.0 device (`EQ_CLUSTER`, `kernels/rowreduce.cu`):
    /// [`row_cluster`] of a row kernel that passes over its row more than once (two stages, or
    /// a stage and an epilogue that writes the row: one stage alone streams the row once
    /// wherever it is kept), outside strict numerics (which keep the unfused plan's order of
    /// summation), segmented rows and a gemm's row epilogue.
    pub(super) fn cluster(&self) -> Option<ClusterShape> {
        if self.strict || self.rank() == 0 || self.l.product.is_some() || self.segments().is_some() {
            return None;
        }
        let rp = plan::plan(self, false);
        if rp.stages.is_empty() || (rp.stages.len() < 2 && self.epilogue_roots().is_empty()) {
            return None;
        }
        let (rows, cols) = self.rows_cols();
        // (A load the raw cache cannot keep as loaded, not a vector access, makes it values:
        // every input then counts as f32.)
        let by_value = rp.cached.iter().any(|&i| self.keeps_by_value(i));
        let sizes: Vec<usize> =
            rp.cached.iter().map(|&i| if by_value { 4 } else { self.cached_dtype(i).size() }).collect();
        row_cluster(rows, cols, &sizes, self.vec)
    }

    /// The row kernel: its portable form, and where [`Self::cluster`] spreads its rows over
    /// clusters, that form as the source's Hopper path (`Rendered::sm90a`: compiled for sm_90a
    /// and launched with its own shape on a 9.0 device).
    pub(super) fn rowreduce(&self) -> Result<Rendered> {
        let mut r = self.rowreduce_as(None)?;
        if let Some(c) = self.cluster() {
            r.sm90a = Some(Box::new(self.rowreduce_as(Some(c))?));
        }
        Ok(r)
    }

    /// The row kernel in one form: `cluster` spreads each row over a cluster of blocks.
    fn rowreduce_as(&self, cluster: Option<ClusterShape>) -> Result<Rendered> {
        let mut rp = plan::plan(self, true);
        let (rows, cols) = self.rows_cols();
        let sizes: Vec<usize> = rp.cached.iter().map(|&i| self.cached_dtype(i).size()).collect();
        let segs = if cluster.is_some() { None } else { self.segments() };
        let copyable = rp.cached.iter().all(|&i| self.stageable(i));
        let shape = match (segs, cluster) {
            (Some(s), _) => RowShape {
                row_threads: SEG_THREADS,
                chunks: s.chunks,
                block: SEG_THREADS,
                blocks_per_sm: SEG_BLOCKS_PER_SM,
                keep: RowKeep::Fetched,
            },
            (None, Some(c)) => RowShape {
                row_threads: c.threads,
                chunks: c.chunks,
                block: c.threads,
                blocks_per_sm: c.per_sm,
                keep: RowKeep::Registers,
            },
            (None, None) => row_shape(rows, cols, &sizes, self.vec, self.l.product.is_some(), copyable),
        };
        let (row_threads, chunks, block) = (shape.row_threads, shape.chunks, shape.block);
        let cached = shape.keep == RowKeep::Registers;
        let (smem_row, smem_pipelined) = match shape.keep {
            RowKeep::Shared { bytes, pipelined } => (Some(bytes), pipelined),
            _ => (None, false),
        };
        let smem_online = smem_row.is_some() && cluster_settings().smem_online;
        if (cached || (smem_row.is_some() && !smem_online)) && !rp.online.is_empty() {
            // A row held on chip costs nothing to pass over twice: the max, then the sum of
            // exponentials, as separate stages, is far less arithmetic than the online pair's
            // rescaling (cross-entropy 8192x32000 on an H100, 2026-11-22: 828 million
            // instructions against 473 million, 975 us against 779 us; benches/results/
            // 2026-11-22-h100-*-ce). The cached loads are the same either way.
            rp = plan::plan(self, false);
        }
        // A GEMM's row epilogue (`kernels/gemm.cu`) fetches the row afresh for its epilogue
        // whatever EQ_CACHED says, so only the row template keeps values in the cache, and a
        // raw cache keeps none.
        let raw = cluster.is_some_and(|c| c.raw);
        if cached && self.l.product.is_none() && !raw {
            rp.reuse = plan::reuse(self, &rp, &self.epilogue_roots());
        }
        let ncache = rp.cached.len().max(1);
        let rpb0 = block / row_threads;
        let stage_bytes = rpb0 * chunks * ncache * row_threads * 16;
        let pipelined = cached
            && cluster.is_none()
            && !self.shift
            && rows > 1
            && block * (rp.cached.len() * chunks * self.vec + REGS_BESIDE_CACHE) > REGS_PER_SM / 2
            && stage_bytes <= MAX_STAGE_BYTES
            && rp.cached.iter().all(|&i| self.stageable(i));
        let nacc = rp.stages.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let rpb = block / row_threads;
        let most = if rp.globals.is_empty() { 1 << 24 } else { 4096 };
        let grid = match (segs, cluster) {
            (Some(s), _) => rows * s.segments,
            // (Whole clusters: a grid the cluster's size does not divide does not launch.)
            (None, Some(c)) => rows.min(most / c.blocks) * c.blocks,
            (None, None) => rows.div_ceil(rpb).min(most),
        };
        let nglobal = rp.globals.len();
        let ws: &[(&str, &str)] =
            if nglobal > 0 || segs.is_some() { &[("float", "eq_ws"), ("unsigned int", "eq_count")] } else { &[] };
        let mut d = self.common_defines(&self.name(), ws);
        for (k, v) in [
            ("EQ_ROWS", rows),
            ("EQ_COLS", cols),
            ("EQ_ROW_THREADS", row_threads),
            ("EQ_BLOCK", block),
            ("EQ_VEC", self.vec),
            ("EQ_CHUNKS", chunks),
            ("EQ_NCACHE", ncache),
            ("EQ_CACHED", cached as usize),
            ("EQ_STAGES", rp.stages.len()),
            ("EQ_NACC", nacc),
            ("EQ_NGLOBAL", nglobal),
            ("EQ_PIPELINED", pipelined as usize),
        ] {
            let _ = writeln!(d, "#define {k} {v}");
        }
        if self.shift {
            let _ = writeln!(d, "#define EQ_SHIFT 1");
            // (Lane loops split into whole vectors and the row's edges: not over rows in
            // registers, `Emitter::lane_function`.)
            if !cached {
                let _ = writeln!(d, "#define EQ_SPLIT_LANES 1");
            }
        }
        if let Some(c) = cluster {
            for (k, v) in [("EQ_CLUSTER", c.blocks), ("EQ_MIN_BLOCKS", shape.blocks_per_sm)] {
                let _ = writeln!(d, "#define {k} {v}");
            }
            if c.raw {
                let _ = writeln!(d, "#define EQ_CACHE_RAW 1");
            }
        }
        if let Some(s) = segs {
            for (k, v) in [
                ("EQ_SEGS", s.segments),
                ("EQ_SEG_DEPTH", (SEG_LOADS / ncache).max(1)),
                ("EQ_MIN_BLOCKS", SEG_BLOCKS_PER_SM),
            ] {
                let _ = writeln!(d, "#define {k} {v}");
            }
        }
        if shape.keep == RowKeep::Fetched && segs.is_none() && shape.blocks_per_sm > 1 {
            let _ = writeln!(d, "#define EQ_MIN_BLOCKS {}", shape.blocks_per_sm);
        }
        if let Some(bytes) = smem_row {
            let buffers = if smem_pipelined { 2 } else { 1 };
            for (k, v) in [
                ("EQ_SMEM_CACHE", 1),
                ("EQ_SMEM_ROW_BYTES", bytes / rpb / buffers),
                ("EQ_KEEP_DEPTH", (KEEP_LOADS / ncache).max(1)),
                ("EQ_MIN_BLOCKS", shape.blocks_per_sm),
            ] {
                let _ = writeln!(d, "#define {k} {v}");
            }
            if smem_pipelined {
                let _ = writeln!(d, "#define EQ_SMEM_PIPELINED 1");
            }
        }
        let mut body = String::new();
        body.push_str(&self.row_struct(&rp));
        body.push_str(&self.row_fetch(&rp));
        if raw {
            body.push_str(&self.row_raw_cache(&rp));
        }
        if smem_row.is_some() {
            body.push_str(&self.row_keep_functions(&rp));
        }
        if smem_pipelined {
            body.push_str(&self.row_keep_async(&rp));
        }
        if pipelined {
            body.push_str(&self.row_stage(&rp));
        }
        body.push_str(&self.row_values(&rp, 0, None));
        body.push_str(&self.row_acc(&rp));
        body.push_str(&self.row_accum(&rp));
        body.push_str(&self.row_finish(&rp));
        body.push_str(&self.row_epilogue(&rp));
        body.push_str(&self.row_store(&rp));
        body.push_str(&self.row_globals(&rp, rows));
        let workspace = match segs {
            // Each (row, segment)'s partial accumulators, and an arrival count a row.
            Some(s) => vec![
                ("eq_ws".into(), (rows * s.segments * nacc * 4) as u64, false),
                ("eq_count".into(), (rows * 4) as u64, true),
            ],
            None if nglobal > 0 => {
                vec![("eq_ws".into(), (grid * nglobal * 4) as u64, false), ("eq_count".into(), 4, true)]
            }
            None => vec![],
        };
        let shape = Shape {
            grid: [grid as u32, 1, 1],
            block: [block as u32, 1, 1],
            workspace,
            smem_bytes: if pipelined { stage_bytes as u32 } else { smem_row.unwrap_or(0) as u32 },
            // (A cluster's blocks loop over rows by clusters, each prefetching its segment of
            // the next row as it writes one: one wave of whole resident clusters.)
            wave: pipelined || smem_pipelined || cluster.is_some(),
            cluster: cluster.map_or(0, |c| c.blocks as u32),
        };
        Ok(Rendered { defines: d, body, shape, params: Params { vec: self.vec, row_threads, nacc }, sm90a: None })
    }

    fn row_struct(&self, rp: &plan::RowPlan) -> String {
        let mut t = Text::default();
        t.line(0, "struct EqRow {");
        for &i in &rp.row_nodes {
            t.line(1, format!("{} n{i};", value_type(self.node(i).dtype)));
        }
        t.line(0, "};");
        t.s
    }

    /// A scope where row values come from `rv` and cached loads from `cv`.
    fn row_scope(&self, rp: &plan::RowPlan, lanes: bool) -> Scope {
        let mut s = self.scope(lanes);
        for &i in &rp.row_nodes {
            s.refs[i] = Some(format!("rv.n{i}"));
        }
        if lanes {
            for (k, &i) in rp.cached.iter().enumerate() {
                s.refs[i] = Some(format!("cv[{k}][v]"));
            }
        }
        s
    }

    /// Whether a cached load can be staged through shared memory by `cp.async`: one vector
    /// access of 4, 8 or 16 bytes per lane group.
    fn stageable(&self, i: usize) -> bool {
        let Op::Load(a) = self.node(i).op else { return false };
        let acc: &Access = &self.l.accesses[a];
        let bytes = acc.dtype.size() * self.vec;
        // A packed mask's bits are tested in place, never copied.
        !self.packed_read(acc.read)
            && matches!(self.lanes_of(&acc.strides), Lanes::Vector)
            && matches!(bytes, 4 | 8 | 16)
    }

    /// `eq_stage` (start copying a chunk's cached loads into its staging slots) and
    /// `eq_unstage` (read them back as values), for the pipelined form.
    fn row_stage(&self, rp: &plan::RowPlan) -> String {
        let mut need = BTreeSet::new();
        let (mut st, mut un) = (Text::default(), Text::default());
        for (k, &i) in rp.cached.iter().enumerate() {
            let Op::Load(a) = self.node(i).op else { continue };
            let acc: &Access = &self.l.accesses[a];
            let p = self.param(Some(acc.read), None);
            let off = self.offset(&acc.strides, &mut need);
            let (ty, bytes) = (storage_type(acc.dtype), acc.dtype.size() * self.vec);
            st.line(1, format!("eq_cp_async<{bytes}>(slot + {k} * 16 * EQ_ROW_THREADS, {p} + {off});"));
            un.line(
                1,
                format!(
                    "eq_loadv<{ty}, EQ_VEC>(reinterpret_cast<const {ty}*>(slot + {k} * 16 * EQ_ROW_THREADS), cv[{k}]);"
                ),
            );
        }
        let mut f = Text::default();
        f.line(
            0,
            "__device__ __forceinline__ void eq_stage(EQ_PARAMS, eq_idx row, eq_idx col0, unsigned char* slot) {",
        );
        self.coords(&need, &mut f, 1);
        f.s.push_str(&st.s);
        f.line(0, "}");
        f.line(
            0,
            "__device__ __forceinline__ void eq_unstage(const unsigned char* slot, float (&cv)[EQ_NCACHE][EQ_VEC]) {",
        );
        f.s.push_str(&un.s);
        f.line(0, "}");
        f.s
    }

    /// The storage type of a cached load.
    fn cached_dtype(&self, i: usize) -> DType {
        match self.node(i).op {
            Op::Load(a) => self.l.accesses[a].dtype,
            _ => self.node(i).dtype,
        }
    }

    /// Byte offsets of the cached loads' copies in a row's shared memory: each of the row's
    /// vectors in its storage type, one slab per load, 16-byte aligned.
    fn keep_offsets(&self, rp: &plan::RowPlan) -> Vec<usize> {
        let cols = self.l.domain.last().copied().unwrap_or(1);
        let sizes: Vec<usize> = rp.cached.iter().map(|&i| self.cached_dtype(i).size()).collect();
        keep_slabs(cols, &sizes, self.vec).0
    }

    /// The functions that keep a row in shared memory (`EQ_SMEM_CACHE`): `EqKept` (one
    /// chunk's cached loads as loaded, in registers), `eq_keep_load` (a whole vector's loads
    /// into an `EqKept`), `eq_keep_store` (an `EqKept` into the row's shared memory at vector
    /// `vi`), `eq_keep_edge` (a shifted row's first or last vector, columns outside the row kept
    /// as zeros, copied alone) and `eq_unkeep` (the values of the copy at vector `vi`). Loads
    /// other than vector accesses (gathered or uniform lanes) are fetched as `eq_fetch` fetches
    /// them, and then every cached value is stored in its storage type, which it came from, so
    /// the copy holds the same values either way and no load is made twice.
    fn row_keep_functions(&self, rp: &plan::RowPlan) -> String {
        let offsets = self.keep_offsets(rp);
        let by_value = rp.cached.iter().any(|&i| self.keeps_by_value(i));
        let mut need = BTreeSet::new();
        let mut t = Text::default();
        let (mut fields, mut load, mut store, mut edge, mut unkeep) =
            (Text::default(), Text::default(), Text::default(), Text::default(), Text::default());
        for (k, &i) in rp.cached.iter().enumerate() {
            let Op::Load(a) = self.node(i).op else { continue };
            let acc: &Access = &self.l.accesses[a];
            let ty = storage_type(acc.dtype);
            let at = format!("reinterpret_cast<{ty}*>(keep + {}) + vi * EQ_VEC", offsets[k]);
            if by_value {
                store.line(1, format!("eq_storev<{ty}, EQ_VEC>({at}, r.cv[{k}]);"));
            } else {
                let word = format!("eq_word<EQ_VEC * sizeof({ty})>::t");
                let p = self.param(Some(acc.read), None);
                let off = self.offset(&acc.strides, &mut need);
                fields.line(1, format!("{word} w{k};"));
                load.line(1, format!("r.w{k} = *reinterpret_cast<const {word}*>({p} + {off});"));
                store.line(1, format!("*reinterpret_cast<{word}*>({at}) = r.w{k};"));
                edge.line(1, format!("eq_keepv_row<{ty}, EQ_VEC>({p} + {off}, {at}, col0, EQ_COLS);"));
            }
            unkeep.line(
                1,
                format!(
                    "eq_loadv<{ty}, EQ_VEC>(reinterpret_cast<const {ty}*>(keep + {}) + vi * EQ_VEC, cv[{k}]);",
                    offsets[k]
                ),
            );
        }
        let mut coords = Text::default();
        self.coords(&need, &mut coords, 1);
        t.line(0, "struct EqKept {");
        if by_value {
            t.line(1, "float cv[EQ_NCACHE][EQ_VEC];");
        } else {
            t.s.push_str(&fields.s);
        }
        t.line(0, "};");
        t.line(0, "__device__ __forceinline__ void eq_keep_load(EQ_PARAMS, eq_idx row, eq_idx col0, EqKept& r) {");
        if by_value {
            t.line(1, "eq_fetch(EQ_ARGS, row, col0, r.cv);");
        } else {
            t.s.push_str(&coords.s);
            t.s.push_str(&load.s);
        }
        t.line(0, "}");
        t.line(0, "__device__ __forceinline__ void eq_keep_store(unsigned char* keep, int vi, const EqKept& r) {");
        t.s.push_str(&store.s);
        t.line(0, "}");
        t.line(
            0,
            "__device__ __forceinline__ void eq_keep_edge(EQ_PARAMS, eq_idx row, eq_idx col0, unsigned char* keep, int vi) {",
        );
        if by_value {
            t.line(1, "EqKept r;");
            t.line(1, "eq_fetch(EQ_ARGS, row, col0, r.cv);");
            t.s.push_str(&store.s);
        } else {
            t.s.push_str(&coords.s);
            t.s.push_str(&edge.s);
        }
        t.line(0, "}");
        t.line(
            0,
            "__device__ __forceinline__ void eq_unkeep(const unsigned char* keep, int vi, float (&cv)[EQ_NCACHE][EQ_VEC]) {",
        );
        t.s.push_str(&unkeep.s);
        t.line(0, "}");
        t.s
    }

    /// The functions of a raw cache (`EQ_CACHE_RAW`: a row kept in registers as loaded):
    /// `EqKept` (one chunk's cached loads, each vector as its word), `eq_keep_fetch` (vector
    /// `col0`'s loads into an `EqKept`; a shifted row's partial vectors with zeros outside the
    /// row) and `eq_unpack` (an `EqKept`'s values, as `eq_fetch` gives them). Every cached load
    /// is a vector access ([`Self::cluster`] counts a cache with any other as values).
    fn row_raw_cache(&self, rp: &plan::RowPlan) -> String {
        let mut need = BTreeSet::new();
        let (mut fields, mut fetch, mut unpack) = (Text::default(), Text::default(), Text::default());
        for (k, &i) in rp.cached.iter().enumerate() {
            let Op::Load(a) = self.node(i).op else { continue };
            let acc: &Access = &self.l.accesses[a];
            let ty = storage_type(acc.dtype);
            let word = format!("eq_word<EQ_VEC * sizeof({ty})>::t");
            let p = self.param(Some(acc.read), None);
            let off = self.offset(&acc.strides, &mut need);
            fields.line(1, format!("{word} w{k};"));
            if self.shift {
                fetch.line(1, format!("r.w{k} = eq_loadw_row<{ty}, EQ_VEC>({p} + {off}, col0, EQ_COLS);"));
            } else {
                fetch.line(1, format!("r.w{k} = *reinterpret_cast<const {word}*>({p} + {off});"));
            }
            unpack.line(1, format!("eq_unpackw<{ty}, EQ_VEC>(r.w{k}, cv[{k}]);"));
        }
        let mut t = Text::default();
        t.line(0, "struct EqKept {");
        t.s.push_str(&fields.s);
        t.line(0, "};");
        t.line(0, "__device__ __forceinline__ void eq_keep_fetch(EQ_PARAMS, eq_idx row, eq_idx col0, EqKept& r) {");
        self.coords(&need, &mut t, 1);
        t.s.push_str(&fetch.s);
        t.line(0, "}");
        t.line(0, "__device__ __forceinline__ void eq_unpack(const EqKept& r, float (&cv)[EQ_NCACHE][EQ_VEC]) {");
        t.s.push_str(&unpack.s);
        t.line(0, "}");
        t.s
    }

    /// `eq_keep_async` (the pipelined form of rows kept in shared memory): starts copying the
    /// vector at `col0` of each cached load into the row's shared memory at vector `vi` (as
    /// `eq_keep_store` stores it), of which the first `n` elements come from the row and the
    /// rest are zeros (a shifted row's last vector). Every cached load is [`Self::stageable`].
    fn row_keep_async(&self, rp: &plan::RowPlan) -> String {
        let offsets = self.keep_offsets(rp);
        let mut need = BTreeSet::new();
        let mut copies = Text::default();
        for (k, &i) in rp.cached.iter().enumerate() {
            let Op::Load(a) = self.node(i).op else { continue };
            let acc: &Access = &self.l.accesses[a];
            let (ty, bytes) = (storage_type(acc.dtype), acc.dtype.size() * self.vec);
            let p = self.param(Some(acc.read), None);
            let off = self.offset(&acc.strides, &mut need);
            let at = format!("reinterpret_cast<{ty}*>(keep + {}) + vi * EQ_VEC", offsets[k]);
            copies.line(1, format!("eq_cp_async_n<{bytes}>({at}, {p} + {off}, n * (int)sizeof({ty}));"));
        }
        let mut t = Text::default();
        t.line(
            0,
            "__device__ __forceinline__ void eq_keep_async(EQ_PARAMS, eq_idx row, eq_idx col0, unsigned char* keep, int vi, int n) {",
        );
        self.coords(&need, &mut t, 1);
        t.s.push_str(&copies.s);
        t.line(0, "}");
        t.s
    }

    /// Whether a cached load is copied into shared memory from its values (not a vector access).
    fn keeps_by_value(&self, i: usize) -> bool {
        let Op::Load(a) = self.node(i).op else { return false };
        !matches!(self.lanes_of(&self.l.accesses[a].strides), Lanes::Vector)
    }

    fn row_fetch(&self, rp: &plan::RowPlan) -> String {
        let mut need = BTreeSet::new();
        let mut t = Text::default();
        for (k, &i) in rp.cached.iter().enumerate() {
            let Op::Load(a) = self.node(i).op else { continue };
            let acc: &Access = &self.l.accesses[a];
            let p = self.param(Some(acc.read), None);
            let off = self.offset(&acc.strides, &mut need);
            match self.lanes_of(&acc.strides) {
                Lanes::Vector => t.line(1, format!("{};", self.vector_load(acc.dtype, &p, &off, &format!("cv[{k}]")))),
                Lanes::Uniform => {
                    t.line(1, format!("const float u{k} = eq_val({p}[{off}]);"));
                    t.line(1, format!("for (int v = 0; v < EQ_VEC; ++v) cv[{k}][v] = u{k};"));
                }
                Lanes::Gather(s) if self.shift => {
                    t.line(0, "#pragma unroll");
                    t.line(
                        1,
                        format!(
                            "for (int v = 0; v < EQ_VEC; ++v) cv[{k}][v] = eq_in_row(col0 + v, EQ_COLS) ? eq_val({p}[{off} + {}]) : 0.0f;",
                            lane_term(s)
                        ),
                    );
                }
                Lanes::Gather(s) => {
                    t.line(0, "#pragma unroll");
                    t.line(
                        1,
                        format!("for (int v = 0; v < EQ_VEC; ++v) cv[{k}][v] = eq_val({p}[{off} + {}]);", lane_term(s)),
                    );
                }
            }
        }
        let mut f = Text::default();
        f.line(
            0,
            "__device__ __forceinline__ void eq_fetch(EQ_PARAMS, eq_idx row, eq_idx col0, float (&cv)[EQ_NCACHE][EQ_VEC]) {",
        );
        self.coords(&need, &mut f, 1);
        f.s.push_str(&t.s);
        f.line(0, "}");
        f.s
    }

    /// Row values available after `stage` stages: `eq_row_init` (stage 0) or the tail of
    /// `eq_finish` (`Some(s)`: values of stage s + 1).
    fn row_values(&self, rp: &plan::RowPlan, avail: usize, finish: Option<usize>) -> String {
        let mut scope = self.row_scope(rp, false);
        let mine: Vec<usize> = rp
            .row_nodes
            .iter()
            .copied()
            .filter(|&i| {
                rp.avail[i] == avail
                    && (!matches!(self.node(i).op, Op::Reduce(..)) || rp.picks.iter().any(|p| p.0 == i))
            })
            .collect();
        for &i in &mine {
            scope.refs[i] = None;
        }
        let mut need = BTreeSet::new();
        let mut t = Text::default();
        for &i in &mine {
            if let Some(&(_, ti, a)) = rp.picks.iter().find(|p| p.0 == i) {
                self.pick_lines(&scope, i, ti, a, &mut t);
                scope.refs[i] = Some(format!("rv.n{i}"));
                continue;
            }
            let e = match self.node(i).op {
                Op::Load(a) => {
                    let acc = &self.l.accesses[a];
                    format!("eq_val({}[{}])", self.param(Some(acc.read), None), self.offset(&acc.strides, &mut need))
                }
                _ => self.expr(i, &scope, &mut need),
            };
            t.line(1, format!("rv.n{i} = {e};"));
            scope.refs[i] = Some(format!("rv.n{i}"));
        }
        if finish.is_some() {
            let mut f = Text::default();
            self.coords(&need, &mut f, 1);
            f.s.push_str(&t.s);
            return f.s;
        }
        let mut f = Text::default();
        f.line(0, "__device__ __forceinline__ void eq_row_init(EQ_PARAMS, eq_idx row, EqRow& rv) {");
        self.coords(&need, &mut f, 1);
        f.s.push_str(&t.s);
        f.line(0, "}");
        f.s
    }

    /// A one-hot sum `i` as a row value: `a` evaluated at column `t` from device memory (the
    /// row's cache holds other columns), 0 when `t` is outside the row. `0.0f +` gives the sum's
    /// +0 where `a` is -0.
    fn pick_lines(&self, scope: &Scope, i: usize, ti: usize, a: usize, t: &mut Text) {
        let cols = self.dim(self.rank() - 1);
        let mut s = Scope { refs: scope.refs.clone(), lanes: false };
        let (mut need, mut idx) = (BTreeSet::new(), Text::default());
        let nodes = self.closure(&[ti], &s);
        self.loads(&nodes, &mut s, &mut idx, 2, &mut need);
        self.values(&nodes, &mut s, &mut idx, 2, &mut need);
        t.line(1, "{");
        self.coords(&need, t, 2);
        t.s.push_str(&idx.s);
        t.line(2, format!("const int t{i} = {};", self.operand(ti, "int", &s)));
        t.line(2, format!("rv.n{i} = 0.0f;"));
        t.line(2, format!("if (t{i} >= 0 && t{i} < {cols}) {{"));
        let (mut need, mut val) = (BTreeSet::new(), Text::default());
        let nodes = self.closure(&[a], &s);
        self.loads(&nodes, &mut s, &mut val, 3, &mut need);
        self.values(&nodes, &mut s, &mut val, 3, &mut need);
        let mut at = Text::default();
        self.coords(&need, &mut at, 3);
        at.s.push_str(&val.s);
        if at.s.contains("col0") {
            t.line(3, format!("const eq_idx col0 = (eq_idx)t{i};"));
        }
        t.s.push_str(&at.s);
        t.line(3, format!("rv.n{i} = 0.0f + {};", self.operand(a, "float", &s)));
        t.line(2, "}");
        t.line(1, "}");
    }

    fn row_acc(&self, rp: &plan::RowPlan) -> String {
        let mut t = Text::default();
        t.line(0, "__device__ __forceinline__ void eq_acc_init(int s, float (&acc)[EQ_NACC]) {");
        for (s, reds) in rp.stages.iter().enumerate() {
            let inits: Vec<String> = reds
                .iter()
                .enumerate()
                .map(|(k, &i)| format!("acc[{k}] = {};", reduce_init(self.reduce_of(i))))
                .collect();
            t.line(1, format!("if (s == {s}) {{ {} }}", inits.join(" ")));
        }
        t.line(0, "}");
        t.line(0, "__device__ __forceinline__ void eq_merge(int s, float (&a)[EQ_NACC], const float (&b)[EQ_NACC]) {");
        for (s, reds) in rp.stages.iter().enumerate() {
            t.line(1, format!("if (s == {s}) {{"));
            for (k, &i) in reds.iter().enumerate() {
                if rp.online.iter().any(|&(sum, _)| sum == i) {
                    continue;
                }
                match rp.online.iter().find(|&&(_, m)| m == i).and_then(|&(sum, _)| reds.iter().position(|&x| x == sum))
                {
                    Some(ks) => {
                        for line in online_merge(ks, k, &format!("m{k}")) {
                            t.line(2, line);
                        }
                    }
                    None => t.line(
                        2,
                        format!(
                            "a[{k}] = {};",
                            reduce_combine(self.reduce_of(i), &format!("a[{k}]"), &format!("b[{k}]"), self.strict)
                        ),
                    ),
                }
            }
            t.line(1, "}");
        }
        t.line(0, "}");
        t.s
    }

    fn row_accum(&self, rp: &plan::RowPlan) -> String {
        let mut out = String::from(
            "__device__ __forceinline__ void eq_accum(int s, EQ_PARAMS, eq_idx row, eq_idx col0,\n    \
             float (&cv)[EQ_NCACHE][EQ_VEC], const EqRow& rv, float (&acc)[EQ_NACC]) {\n",
        );
        for (s, reds) in rp.stages.iter().enumerate() {
            let mut scope = self.row_scope(rp, true);
            let is_sum = |i: usize| rp.online.iter().any(|&(sum, _)| sum == i);
            let kept: Vec<(usize, usize)> =
                rp.reuse.iter().filter(|&&(_, _, st)| st == s).map(|&(k, y, _)| (k, y)).collect();
            let inputs: Vec<usize> = reds
                .iter()
                .filter(|&&i| !is_sum(i))
                .map(|&i| children(&self.node(i).op)[0])
                .chain(kept.iter().map(|&(_, y)| y))
                .collect();
            let header = format!("if (s == {s}) {{");
            let f = self.lane_function(&header, 1, &mut scope, &inputs, |e, scope, _| {
                let (mut decls, mut lines, mut after) = (vec![], vec![], vec![]);
                for (k, &red) in reds.iter().enumerate() {
                    if is_sum(red) {
                        continue;
                    }
                    let val = e.operand(children(&e.node(red).op)[0], "float", scope);
                    let pair = rp
                        .online
                        .iter()
                        .find(|&&(_, m)| m == red)
                        .and_then(|&(sum, _)| reds.iter().position(|&x| x == sum));
                    match pair {
                        Some(ks) => {
                            decls.push(format!("float x{k}[EQ_VEC];"));
                            if e.shift {
                                // Lanes outside a shifted row add nothing to the pair.
                                decls.push(format!("for (int v = 0; v < EQ_VEC; ++v) x{k}[v] = -EQ_INF;"));
                            }
                            lines.push(format!("x{k}[v] = {val};"));
                            after.extend(online_update(k, ks, if e.fast_exp { "eq_exp_fast" } else { "expf" }));
                        }
                        None => lines.push(format!(
                            "acc[{k}] = {};",
                            reduce_combine(e.reduce_of(red), &format!("acc[{k}]"), &val, e.strict)
                        )),
                    }
                }
                // Values the epilogue reads from the cache, stored once every use of the
                // slot's raw value in this lane is computed.
                for &(k, y) in &kept {
                    lines.push(format!("cv[{k}][v] = {};", e.operand(y, "float", scope)));
                }
                (decls, lines, after)
            });
            out.push_str(&f);
        }
        out.push_str("}\n");
        out
    }

    fn row_finish(&self, rp: &plan::RowPlan) -> String {
        let cols = self.l.domain.last().copied().unwrap_or(1);
        let mut t = Text::default();
        t.line(
            0,
            "__device__ __forceinline__ void eq_finish(int s, EQ_PARAMS, eq_idx row, const float (&acc)[EQ_NACC], EqRow& rv) {",
        );
        for (s, reds) in rp.stages.iter().enumerate() {
            t.line(1, format!("if (s == {s}) {{"));
            for (k, &i) in reds.iter().enumerate() {
                let v = match self.reduce_of(i) {
                    Reduce::Mean => format!("acc[{k}] / {}", literal(cols as f64, "float")),
                    _ => format!("acc[{k}]"),
                };
                if rp.row_nodes.contains(&i) {
                    t.line(2, format!("rv.n{i} = {};", self.rounded(i, v)));
                }
            }
            let rest = self.row_values(rp, s + 1, Some(s));
            for l in rest.lines() {
                t.line(1, l);
            }
            t.line(1, "}");
        }
        t.line(0, "}");
        t.s
    }

    /// The values the epilogue stores, one per element.
    fn epilogue_roots(&self) -> Vec<usize> {
        self.l.stores.iter().filter(|s| self.store_is_elem(s)).map(|s| s.node).collect()
    }

    fn row_epilogue(&self, rp: &plan::RowPlan) -> String {
        let mut scope = self.row_scope(rp, true);
        for &(k, y, _) in &rp.reuse {
            scope.refs[rp.cached[k]] = None;
            scope.refs[y] = Some(format!("cv[{k}][v]"));
        }
        let stores: Vec<&Store> = self.l.stores.iter().filter(|s| self.store_is_elem(s)).collect();
        let roots = self.epilogue_roots();
        self.lane_function(
            "__device__ __forceinline__ void eq_epilogue(EQ_PARAMS, eq_idx row, eq_idx col0,\n    \
             const float (&cv)[EQ_NCACHE][EQ_VEC], const EqRow& rv) {",
            0,
            &mut scope,
            &roots,
            |e, scope, need| {
                e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), None, need)
            },
        )
    }

    fn store_is_elem(&self, s: &Store) -> bool {
        let r = self.rank();
        r > 0 && s.shape[r - 1] > 1
    }

    fn row_store(&self, rp: &plan::RowPlan) -> String {
        let scope = self.row_scope(rp, false);
        let mut need = BTreeSet::new();
        let mut t = Text::default();
        let last = self.rank().checked_sub(1);
        for st in self.l.stores.iter().filter(|s| !self.store_is_elem(s) && !rp.after_rows(s.node)) {
            let val = self.operand(st.node, value_type(self.node(st.node).dtype), &scope);
            let (line, _) = self.store_row(st, &val, last, &mut need);
            t.line(1, line);
        }
        let mut f = Text::default();
        f.line(0, "__device__ __forceinline__ void eq_row_store(EQ_PARAMS, eq_idx row, const EqRow& rv) {");
        self.coords(&need, &mut f, 1);
        f.s.push_str(&t.s);
        f.line(0, "}");
        f.s
    }

    /// `eq_global` (a row's contribution) and `eq_global_store`, when the kernel has globals.
    fn row_globals(&self, rp: &plan::RowPlan, rows: usize) -> String {
        if rp.globals.is_empty() {
            return String::new();
        }
        let scope = self.row_scope(rp, false);
        let mut t = Text::default();
        t.line(0, "__device__ __forceinline__ void eq_global(const EqRow& rv, float (&g)[EQ_NGLOBAL]) {");
        for (j, &i) in rp.globals.iter().enumerate() {
            let x = children(&self.node(i).op)[0];
            let val = self.operand(x, "float", &scope);
            t.line(
                1,
                format!("g[{j}] = {};", reduce_combine(self.reduce_of(i), &format!("g[{j}]"), &val, self.strict)),
            );
        }
        t.line(0, "}");
        t.line(0, "__device__ __forceinline__ void eq_global_store(EQ_PARAMS, const float (&g)[EQ_NGLOBAL]) {");
        // The combined results, then the values computed from them alone.
        let mut scope = self.scope(false);
        for (j, &i) in rp.globals.iter().enumerate() {
            let val = match self.reduce_of(i) {
                Reduce::Mean => format!("g[{j}] / {}", literal(rows as f64, "float")),
                _ => format!("g[{j}]"),
            };
            t.line(1, format!("const float n{i} = {val};"));
            scope.refs[i] = Some(format!("n{i}"));
        }
        let mut need = BTreeSet::new();
        for &i in &rp.after_globals {
            let ty = value_type(self.node(i).dtype);
            t.line(1, format!("const {ty} n{i} = {};", self.expr(i, &scope, &mut need)));
            scope.refs[i] = Some(format!("n{i}"));
        }
        debug_assert!(need.is_empty(), "a value after a global reads coordinates");
        for st in self.l.stores.iter().filter(|s| rp.after_rows(s.node)) {
            let val = self.operand(st.node, value_type(self.node(st.node).dtype), &scope);
            t.line(1, format!("eq_put({} + 0, {val});", self.param(None, Some(st.write))));
        }
        t.line(0, "}");
        t.s
    }

    /// A store outside any lane loop (one element).
    fn store_row(&self, st: &Store, val: &str, skip: Option<usize>, need: &mut BTreeSet<usize>) -> (String, ()) {
        let r = self.rank();
        let p = self.param(None, Some(st.write));
        let strides: Vec<usize> =
            contiguous(&st.shape).into_iter().zip(&st.shape).map(|(s, &d)| if d == 1 { 0 } else { s }).collect();
        let off = self.offset(&strides, need);
        let pred: Vec<String> = (0..r)
            .filter(|&k| st.shape[k] == 1 && self.dim(k) > 1 && Some(k) != skip)
            .map(|k| {
                need.insert(k);
                format!("c{k} == 0")
            })
            .collect();
        let cond = if pred.is_empty() { String::new() } else { format!("if ({}) ", pred.join(" && ")) };
        (format!("{cond}eq_put({p} + {off}, {val});"), ())
    }
}

/// How a row kernel cuts each of its rows into segments (`kernels/rowreduce.cu`, `EQ_SEGS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Segments {
    /// Segments a row (`EQ_SEGS`, at least 2): one block each.
    pub segments: usize,
    /// Vectors each of a segment's [`SEG_THREADS`] threads reduces (`EQ_CHUNKS`).
    pub chunks: usize,
}

/// Threads of a segment's block (one row's threads).
const SEG_THREADS: usize = 512;
/// Blocks of segments a launch aims at in all: two of [`SEG_THREADS`] an SM of a 132-SM H100
/// or H200, so that every SM streams with about 1024 threads.
const SEG_TARGET_BLOCKS: usize = 264;
/// The fewest vectors a thread of a segment reduces (a segment of 2048 vectors, 32 KB): a
/// shorter row is left one block, whose partials and combine would cost more than it streams.
const SEG_MIN_CHUNKS: usize = 4;
/// Rows are segmented only below this many (a launch of one block a row leaves SMs idle; an
/// H100 has 132, an A100 108).
const SEG_MAX_ROWS: usize = 128;
/// Blocks of a segmented kernel an SM is to hold (`__launch_bounds__`: 64 registers a thread).
const SEG_BLOCKS_PER_SM: usize = 2;
/// 16-byte loads a segment's thread keeps in flight (`EQ_SEG_DEPTH` chunks of all its inputs at
/// a time): two blocks of 512 threads an SM with 4 loads each keep 64 KB in flight an SM, as
/// rows kept in shared memory do ([`KEEP_LOADS`]).
const SEG_LOADS: usize = 4;

/// The segments of `rows` rows of `cols` elements read `vec` elements a vector: with fewer than
/// [`SEG_MAX_ROWS`] rows, each row is cut into segments of whole vectors for every one of
/// [`SEG_THREADS`] threads (at least [`SEG_MIN_CHUNKS`] each) so that the rows' segments make
/// about [`SEG_TARGET_BLOCKS`] blocks; `None` when that leaves one segment a row. A tensor of
/// 8388608 f32 summed to one value (one row of 2097152 vectors): 256 segments of 16 vectors a
/// thread.
pub(super) fn segment_shape(rows: usize, cols: usize, vec: usize) -> Option<Segments> {
    if rows == 0 || rows >= SEG_MAX_ROWS {
        return None;
    }
    let per = row_vectors(cols, vec.max(1));
    let want = SEG_TARGET_BLOCKS.div_ceil(rows);
    let chunks = per.div_ceil(want * SEG_THREADS).max(SEG_MIN_CHUNKS);
    let segments = per.div_ceil(chunks * SEG_THREADS);
    (segments > 1).then_some(Segments { segments, chunks })
}

/// How a row kernel spreads each row over a cluster of blocks (`kernels/rowreduce.cu`,
/// `EQ_CLUSTER`; sm_90).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterShape {
    /// Blocks of a cluster, one row's (`EQ_CLUSTER`, 2 to 8: sm_90's portable cluster size).
    pub blocks: usize,
    /// Threads of each block (`EQ_ROW_THREADS`, the block's one row segment).
    pub threads: usize,
    /// Vectors each thread keeps in registers (`EQ_CHUNKS`).
    pub chunks: usize,
    /// Blocks an SM is to hold (`EQ_MIN_BLOCKS`, `__launch_bounds__`).
    pub per_sm: usize,
    /// Each vector kept as loaded (`EQ_CACHE_RAW`: 16-bit inputs), converted at each use.
    pub raw: bool,
}

/// The most blocks of a cluster (sm_90's portable limit; 16 needs a launch attribute).
pub const MAX_CLUSTER: usize = 8;
/// Threads of a row cluster's blocks an SM is to hold (`__launch_bounds__`: 64 registers a
/// thread), so that an SM's loads of one block's segment overlap other blocks' combines and
/// writes. `EQFUSE_ROW_CLUSTER_SM_THREADS=768` or `512` (for benchmarking) makes it three
/// blocks of 256 threads at 80 registers a thread, or two at 128.
const CLUSTER_THREADS_PER_SM: usize = 1024;
/// Threads a block of a row cluster may have: at least two blocks an SM.
const CLUSTER_BLOCK_THREADS: [usize; 2] = [256, 512];

/// Which rows [`row_cluster`] spreads over clusters: `EQFUSE_ROW_CLUSTER`, read once, to
/// compare the paths on a device (`off`: none; `on`: rows of 16-bit values too; unset or
/// `auto`: the default below). Plans made under either setting are checked alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClusterPolicy {
    Auto,
    On,
    Off,
}

/// The settings of the row template's wide-row paths that the environment may change to
/// compare them on a device (read once): [`ClusterPolicy`], `EQFUSE_ROW_CLUSTER_SM_THREADS`
/// ([`CLUSTER_THREADS_PER_SM`]), `EQFUSE_ROW_SMEM_PIPELINE=off` (rows kept in shared
/// memory never pipelined: [`row_shape`]'s other shapes), `EQFUSE_ROW_SMEM=off`,
/// `EQFUSE_ROW_SMEM_ONLINE=on` and `EQFUSE_ROW_FETCH_THREADS`.
struct RowPathSettings {
    policy: ClusterPolicy,
    threads_per_sm: usize,
    smem_pipeline: bool,
    /// `EQFUSE_ROW_CLUSTER_RAW=off`: 16-bit rows over clusters cached as values, not as loaded.
    raw: bool,
    /// `EQFUSE_ROW_SMEM=off`: rows too long for registers never kept in shared memory, but
    /// fetched by each pass ([`RowKeep::Fetched`]; softmax's max and sum as one online pass).
    smem: bool,
    /// `EQFUSE_ROW_SMEM_ONLINE=on`: rows kept in shared memory take softmax's max and sum as
    /// an online pair (one pass over shared memory fewer, a rescale a vector more).
    smem_online: bool,
    /// `EQFUSE_ROW_FETCH_THREADS=512` or `256`: fetched rows of more vectors than 4 a thread of
    /// that many threads take blocks of that many threads, [`FETCH_THREADS_PER_SM`] threads an
    /// SM, so that an SM's other blocks stream while one combines or starts a row.
    fetch_threads: usize,
}

fn cluster_settings() -> &'static RowPathSettings {
    static SETTINGS: std::sync::OnceLock<RowPathSettings> = std::sync::OnceLock::new();
    SETTINGS.get_or_init(|| RowPathSettings {
        policy: match std::env::var("EQFUSE_ROW_CLUSTER").as_deref() {
            Ok("on") => ClusterPolicy::On,
            Ok("off") => ClusterPolicy::Off,
            _ => ClusterPolicy::Auto,
        },
        threads_per_sm: match std::env::var("EQFUSE_ROW_CLUSTER_SM_THREADS").as_deref() {
            Ok("512") => 512,
            Ok("768") => 768,
            _ => CLUSTER_THREADS_PER_SM,
        },
        smem_pipeline: std::env::var("EQFUSE_ROW_SMEM_PIPELINE").as_deref() != Ok("off"),
        raw: std::env::var("EQFUSE_ROW_CLUSTER_RAW").as_deref() != Ok("off"),
        smem: std::env::var("EQFUSE_ROW_SMEM").as_deref() != Ok("off"),
        smem_online: std::env::var("EQFUSE_ROW_SMEM_ONLINE").as_deref() == Ok("on"),
        fetch_threads: match std::env::var("EQFUSE_ROW_FETCH_THREADS").as_deref() {
            Ok("512") => 512,
            Ok("256") => 256,
            _ => MAX_ROW_THREADS,
        },
    })
}

/// The cluster a row of `cols` elements is spread over, cached inputs of `sizes` bytes an
/// element read `vec` elements a vector: blocks of [`CLUSTER_BLOCK_THREADS`] threads (at least
/// two blocks an SM), each thread keeping `chunks` vectors of each input in registers within
/// what [`CLUSTER_THREADS_PER_SM`] threads an SM leave it (as [`fits_in_registers`] counts
/// them, [`ROW_CACHE_PER_THREAD`] registers of cache at most), the fewest idle vector slots
/// (past the row's end), then the fewest blocks (fewer partials to combine), then the most
/// threads a block; every block holds some of the row. Inputs of 16-bit values are kept as
/// loaded (`raw`: a 16-byte vector in 4 registers), others as f32 values. `None` where no
/// cluster of at most [`MAX_CLUSTER`] blocks holds the row. An f32 row of 128256 (32064
/// vectors of 4): 7 blocks of 512 threads, 9 vectors each; a bf16 row of 50257 (6283 shifted
/// vectors of 8), raw: 5 blocks of 256 threads, 5 vectors each (6400 vector slots), as values
/// 7 blocks of 512 threads of 2 vectors.
pub fn cluster_shape(cols: usize, sizes: &[usize], vec: usize) -> Option<ClusterShape> {
    let vec = vec.max(1);
    let per = row_vectors(cols, vec);
    let shift = !cols.is_multiple_of(vec);
    let beside = if shift { REGS_BESIDE_SHIFTED_CACHE } else { REGS_BESIDE_CACHE };
    let settings = cluster_settings();
    let per_sm_threads = settings.threads_per_sm;
    // (Registers are allocated to a thread in multiples of 8.)
    let regs = REGS_PER_SM / per_sm_threads / 8 * 8;
    let raw = settings.raw && sizes.iter().any(|&s| s < 4);
    // (A raw vector's values live beside the cache while it is used: ptxas spilled a lone bf16
    // softmax row of 50257 at 20 registers of cache and 40 beside.)
    let beside = if raw { beside + RAW_VALUES_REGS } else { beside };
    // Registers one chunk of the thread's cache takes: its vectors as loaded, or as f32 values.
    let chunk_regs: usize =
        if raw { sizes.iter().map(|&s| (s * vec).div_ceil(4)).sum() } else { sizes.len().max(1) * vec };
    let mut shapes = vec![];
    for blocks in 2..=MAX_CLUSTER {
        for threads in CLUSTER_BLOCK_THREADS.into_iter().filter(|&t| 2 * t <= per_sm_threads) {
            let chunks = per.div_ceil(blocks * threads);
            let cached = chunks * chunk_regs;
            if cached <= ROW_CACHE_PER_THREAD && cached + beside <= regs && (blocks - 1) * threads * chunks < per {
                shapes.push(ClusterShape { blocks, threads, chunks, per_sm: per_sm_threads / threads, raw });
            }
        }
    }
    // A raw cache's shapes are ranked by the row a block holds as well as the idle slots
    // (blocks^2 x slots: a block's share of the row over the share of its slots it fills), so
    // that blocks hold what their registers allow: by the idle slots alone a bf16 row of 50257
    // took 7 blocks of 512 threads of 2 vectors, 16 KB a block, too little in flight an SM.
    let rank = |c: &ClusterShape| {
        let slots = c.blocks * c.threads * c.chunks;
        (if raw { c.blocks * slots } else { slots }, c.blocks, std::cmp::Reverse(c.threads))
    };
    shapes.into_iter().min_by_key(rank)
}

/// Registers a raw cache's thread needs beside [`REGS_BESIDE_CACHE`]: one vector's values.
const RAW_VALUES_REGS: usize = 8;

/// The most row elements one thread keeps in registers (`float cache[EQ_CHUNKS][EQ_NCACHE][EQ_VEC]`).
pub const ROW_CACHE_PER_THREAD: usize = 64;
/// The most threads that share one row.
pub const MAX_ROW_THREADS: usize = 1024;

/// Where a row kernel keeps its row's cached inputs (the loads its reduction stages read)
/// between its passes over the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKeep {
    /// In registers (`EQ_CACHED`): the row is read from device memory once.
    Registers,
    /// In `bytes` of dynamic shared memory a block, each input in its storage type
    /// (`EQ_SMEM_CACHE`): the first pass reads the row from device memory, later passes read
    /// shared memory, so the row is read from device memory once.
    Shared {
        /// Dynamic shared memory a block (the launch's `smem_bytes`).
        bytes: usize,
        /// Pipelined (`EQ_SMEM_PIPELINED`): one wave of blocks, each with two buffers a row,
        /// copying its next row while it reduces and writes one.
        pipelined: bool,
    },
    /// Nowhere: each pass fetches the row from device memory again.
    Fetched,
}

/// Where a row kernel over `rows` rows of `cols` elements keeps cached inputs of `sizes` bytes
/// an element, `vec` elements an access ([`row_shape`]'s answer for the row template, inputs
/// read as whole vectors). The cost model asks this (`caps::row_keep`, `cost::row_passes`), so
/// a row it prices as read once is one codegen keeps on chip, and with the same shared memory.
pub fn row_keep(rows: usize, cols: usize, sizes: &[usize], vec: usize) -> RowKeep {
    row_shape(rows, cols, sizes, vec.max(1), false, true).keep
}

/// The cluster a row kernel over `rows` rows of `cols` elements spreads each row over on a 9.0
/// device, its cached inputs of `sizes` bytes an element read `vec` elements a vector: where
/// the row does not fit one block's registers ([`row_keep`]), [`cluster_shape`]. Codegen asks
/// this of a kernel it may cluster (`Emitter::cluster`), the cost model of every row kernel
/// (`caps::row_cluster`).
pub fn row_cluster(rows: usize, cols: usize, sizes: &[usize], vec: usize) -> Option<ClusterShape> {
    if row_keep(rows, cols, sizes, vec) == RowKeep::Registers {
        return None;
    }
    // Measured on an H100 (2026-11-26, benches/results/2026-11-26-h100-session6): clusters ran
    // a 1024 x 128256 f32 log-softmax at 85% of copy bandwidth (557.6 us one block a row ->
    // 413.9 us), but rows of 16-bit values at 21-36% (a 4096 x 50257 bf16 softmax 433.4 ->
    // 1034.5 us; both cross-entropy gradients 1.3-2.5x slower): those keep one block a row
    // until their cluster shape runs at bandwidth.
    match cluster_settings().policy {
        ClusterPolicy::Off => return None,
        ClusterPolicy::Auto if sizes.iter().any(|&s| s < 4) => return None,
        _ => {}
    }
    cluster_shape(cols, sizes, vec)
}

/// The launch shape of a row kernel and where it keeps its row.
pub(super) struct RowShape {
    pub row_threads: usize,
    pub chunks: usize,
    pub block: usize,
    /// Blocks an SM is to hold (`__launch_bounds__`'s minimum: rows in shared memory, fetched rows
    /// of blocks smaller than [`MAX_ROW_THREADS`]).
    pub blocks_per_sm: usize,
    pub keep: RowKeep,
}

/// The launch shape of a row kernel over `rows` rows of `cols` elements whose cached inputs
/// take `sizes` bytes an element (`product`: a gemm's row epilogue, which keeps 4 vectors a
/// thread and nothing in shared memory; `copyable`: every cached input is read as whole
/// vectors, which `cp.async` copies where they are 4, 8 or 16 bytes). A row that fits registers
/// ([`fits_in_registers`]) stays there; otherwise, where its inputs fit [`MAX_ROW_SMEM_BYTES`]
/// in their storage types, shared memory holds them. Pipelined where two of a block's rows fit
/// it, there is more than one row, the row takes a whole block and its inputs are copyable:
/// the one-row-a-block shape (up to 1024 threads), one wave of blocks each looping over its
/// rows with two buffers, the next row's copy in flight while it works on one (with fewer rows
/// than SMs each block has one row, copied whole at once, where the other shapes keep
/// [`KEEP_LOADS`] vectors a thread in flight). Otherwise with [`SMEM_ROW_THREADS`] threads a
/// row where two blocks' rows fit one SM's shared memory (the second block's loads overlap the
/// first's reductions and writes), and the one-row-a-block shape where they do not (one block
/// an SM).
pub(super) fn row_shape(
    rows: usize,
    cols: usize,
    sizes: &[usize],
    vec: usize,
    product: bool,
    copyable: bool,
) -> RowShape {
    let per = row_vectors(cols, vec);
    let (row_threads, chunks) = row_split(per, product);
    let block = row_block(row_threads);
    let shape = |keep, row_threads: usize, blocks_per_sm| RowShape {
        row_threads,
        chunks: per.div_ceil(row_threads).max(1),
        block: row_block(row_threads),
        blocks_per_sm,
        keep,
    };
    if fits_in_registers(sizes.len(), chunks, vec, block, !cols.is_multiple_of(vec)) {
        return shape(RowKeep::Registers, row_threads, 1);
    }
    let settings = cluster_settings();
    if !product && settings.smem {
        let row_bytes = keep_slabs(cols, sizes, vec).1;
        let bytes = |t: usize| row_block(t) / t * row_bytes;
        // (`cp.async` copies 4, 8 or 16 bytes.)
        let copies = copyable && sizes.iter().all(|&s| matches!(s * vec, 4 | 8 | 16));
        if copies
            && rows > 1
            && row_block(row_threads) == row_threads
            && 2 * row_bytes <= MAX_ROW_SMEM_BYTES
            && settings.smem_pipeline
        {
            return shape(RowKeep::Shared { bytes: 2 * row_bytes, pipelined: true }, row_threads, 1);
        }
        let pair = row_threads.min(SMEM_ROW_THREADS);
        let (t, blocks) =
            if 2 * (bytes(pair) + SMEM_BESIDE_ROWS) <= SMEM_PER_SM { (pair, 2) } else { (row_threads, 1) };
        if bytes(t) <= MAX_ROW_SMEM_BYTES {
            return shape(RowKeep::Shared { bytes: bytes(t), pipelined: false }, t, blocks);
        }
    }
    // (A gemm's row epilogue keeps its tile's rows.)
    if !product && row_threads > settings.fetch_threads {
        let t = settings.fetch_threads;
        return shape(RowKeep::Fetched, t, FETCH_THREADS_PER_SM / t);
    }
    shape(RowKeep::Fetched, row_threads, 1)
}

/// Threads of fetched rows' blocks an SM is to hold where `EQFUSE_ROW_FETCH_THREADS` makes
/// them smaller than a block (`__launch_bounds__`: 64 registers a thread, as one block of 1024).
/// Fewer rows in flight an SM keep each row's second read in L2: a bf16 row of 50257 is 100 KB,
/// so 132 SMs of two rows each hold 26 MB of the H100's 50 MB.
const FETCH_THREADS_PER_SM: usize = 1024;

/// The byte offsets of cached inputs of `sizes` bytes an element in a row's shared memory, and
/// the bytes of the row: each input keeps every vector of `vec` elements the row spans
/// (shifted rows' partial first and last included), 16-byte aligned.
fn keep_slabs(cols: usize, sizes: &[usize], vec: usize) -> (Vec<usize>, usize) {
    let per = row_vectors(cols, vec);
    let mut at = 0;
    let offsets = sizes
        .iter()
        .map(|&s| {
            let o = at;
            at += (per * vec * s).next_multiple_of(16);
            o
        })
        .collect();
    (offsets, at)
}

/// The vectors of `vec` elements a row of `cols` spans: one more than whole vectors hold for
/// shifted rows (`vec` does not divide the row; `kernels/rowreduce.cu`), whose first vector
/// starts up to `vec - 1` columns before the row.
fn row_vectors(cols: usize, vec: usize) -> usize {
    if cols.is_multiple_of(vec) {
        cols / vec
    } else {
        (cols + vec - 1).div_ceil(vec)
    }
}

/// The block of a row kernel whose rows take `row_threads` threads each.
fn row_block(row_threads: usize) -> usize {
    row_threads.max(256)
}

/// Whether `ncache` cached inputs of `chunks` vectors of `vec` elements fit a thread's cache:
/// at most [`ROW_CACHE_PER_THREAD`] elements, and with the registers a thread needs beside
/// them within what a thread of a `block`-thread block may have (all of an SM's registers
/// shared by one block, at most 255 a thread), so that the cached row does not spill to local
/// memory. A 1024-thread block has 64 registers a thread: a bf16 row of 50257 at 56 cached
/// elements a thread spilled (100 bytes of spill stores, at half of copy bandwidth on an
/// H100) and is fetched again by each pass instead. Shifted rows (`shift`) need more beside
/// the cache ([`REGS_BESIDE_SHIFTED_CACHE`]).
fn fits_in_registers(ncache: usize, chunks: usize, vec: usize, block: usize, shift: bool) -> bool {
    let cached = ncache * chunks * vec;
    let beside = if shift { REGS_BESIDE_SHIFTED_CACHE } else { REGS_BESIDE_CACHE };
    cached <= ROW_CACHE_PER_THREAD && cached + beside <= (REGS_PER_SM / block).min(MAX_THREAD_REGS)
}

/// Rows of at most this many vectors take one vector per thread (one 16-byte access per input).
const SHORT_ROW_VECTORS: usize = 32;

/// Threads per row and vectors (chunks) per thread for rows of `per` vectors. A row kernel gives
/// a short row (up to [`SHORT_ROW_VECTORS`]) a thread per vector: a warp reads whole rows, 512
/// contiguous bytes an access, and a block holds more rows. Measured on an H100 (2026-11-22,
/// `benches/results/2026-11-22-h100-*-rowshape`): attention's delta (two bf16 rows of 64) 32.9
/// us at 8 threads a row against 40.8 at 2 threads of 4 chunks; a bf16 softmax over 128
/// columns 5.5 us at 16 threads against 7.7 at 4 threads of 4 chunks. Longer rows, and a gemm's
/// row epilogue (whose tile sets its rows), take 4 vectors a thread, up to [`MAX_ROW_THREADS`]
/// threads.
fn row_split(per: usize, product: bool) -> (usize, usize) {
    let row_threads = if !product && per <= SHORT_ROW_VECTORS {
        pow2_at_least(per)
    } else {
        pow2_at_least(per.div_ceil(4)).min(MAX_ROW_THREADS)
    };
    (row_threads, per.div_ceil(row_threads).max(1))
}

/// Registers of an SM (sm_80 and sm_90).
const REGS_PER_SM: usize = 65536;
/// The most registers one thread may have.
const MAX_THREAD_REGS: usize = 255;
/// Registers a row thread needs beside its cached row (indices, accumulators, row values).
const REGS_BESIDE_CACHE: usize = 24;
/// The same for shifted rows, which also hold each row's lead and test their lanes against the
/// row, and prefetch the next row into registers rather than staging it (NVRTC 13.0, sm_90: a
/// cross-entropy gradient over bf16 rows of 32001 at 32 cached elements a thread and 64
/// registers spilled 36 bytes).
const REGS_BESIDE_SHIFTED_CACHE: usize = 40;
/// The most shared memory the pipelined form stages a block's next rows in.
const MAX_STAGE_BYTES: usize = 160 * 1024;
/// Shared memory of an SM (sm_90: 228 KB).
const SMEM_PER_SM: usize = 228 * 1024;
/// The most dynamic shared memory a row kernel keeps its rows in: sm_90's 227 KB a block less
/// the kernel's static reduction scratch. (An sm_80 block has 163 KB, where larger rows would
/// not launch.)
pub const MAX_ROW_SMEM_BYTES: usize = 226 * 1024;
/// Shared memory a block takes beside its rows: the 1 KB the CUDA runtime reserves a block and
/// the kernel's reduction scratch.
const SMEM_BESIDE_ROWS: usize = 2 * 1024;
/// Threads a row kept in shared memory takes where two blocks' rows fit an SM's shared memory
/// (512: two blocks hold 1024 threads of up to 64 registers each, and one block's loads overlap
/// the other's passes over shared memory and its writes). Not measured against the
/// alternative, 1024 (one block of 1024 threads an SM, as for rows too long to pair).
const SMEM_ROW_THREADS: usize = 512;
/// 16-byte loads a thread keeps in flight in the first pass over a row kept in shared memory
/// (`EQ_KEEP_DEPTH` chunks of all its cached inputs at a time): with one or two blocks of 512
/// to 1024 threads an SM, 64 KB in flight an SM, beyond what HBM's latency-bandwidth product
/// asks of an SM (about 30 KB on an H200).
const KEEP_LOADS: usize = 4;

/// The online softmax update of a max accumulator `k` and its sum `ks` by the lanes `x{k}`:
/// one rescale per vector, one exponential (`exp`, the function's name) per element.
fn online_update(k: usize, ks: usize, exp: &str) -> Vec<String> {
    vec![
        format!("float m{k} = acc[{k}];"),
        format!("for (int v = 0; v < EQ_VEC; ++v) m{k} = eq_max(m{k}, x{k}[v]);"),
        format!("float s{k} = eq_lse_rescale(acc[{ks}], acc[{k}], m{k});"),
        format!("if (m{k} != -EQ_INF) for (int v = 0; v < EQ_VEC; ++v) s{k} += {exp}(x{k}[v] - m{k});"),
        format!("acc[{k}] = m{k};"),
        format!("acc[{ks}] = s{k};"),
    ]
}
