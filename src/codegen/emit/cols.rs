//! Rendering for `kernels/colreduce.cu`: the prologue and accumulation over one leading axis,
//! and the stores of the reduced values.
//! Invariant: a column reduction's result is only stored (through a pointwise epilogue: a cast,
//! a unary operator, a binary one with a constant, evaluated as it is stored), never used
//! otherwise by the same kernel.

use super::*;

impl Emitter<'_> {
    pub(super) fn colreduce(&self) -> Result<Rendered> {
        let a = self.l.axis.unwrap_or(0);
        let reds: Vec<usize> = (0..self.l.nodes.len()).filter(|&i| matches!(self.node(i).op, Op::Reduce(..))).collect();
        let after = self.after_reductions(&reds);
        let pairs = self.online_pairs(&reds);
        let paired: Vec<usize> = pairs.iter().flat_map(|&(s, _)| self.pair_nodes(s)).collect();
        for (i, n) in self.l.nodes.iter().enumerate() {
            let epilogue = match n.op {
                Op::Cast(..) | Op::Unary(..) => true,
                Op::Binary(_, a, b) => [a, b].iter().all(|&c| after[c] || matches!(self.node(c).op, Op::Const(_))),
                _ => false,
            };
            if after[i] && !epilogue && !reds.contains(&i) && !paired.contains(&i) {
                return Err(err(
                    self.k,
                    format!("the result of a column reduction is used in the same kernel (node {i})"),
                ));
            }
        }
        let outer: usize = self.l.domain[..a].iter().product();
        let n = self.dim(a);
        let inner: usize = self.l.domain[a + 1..].iter().product();
        let (target_blocks, min_rows) = col_settings();
        let tx = pow2_at_least(inner.div_ceil(self.vec)).min(32);
        // (A thread accumulates 8 rows or more: their loads are in flight together.)
        let ty = (256 / tx).min(pow2_at_least(n.div_ceil(min_rows)));
        let tile = tx * self.vec;
        let tiles = outer * inner.div_ceil(tile);
        let max_chunks = n.div_ceil(ty * min_rows).max(1);
        let chunks = target_blocks.div_ceil(tiles.max(1)).clamp(1, max_chunks);
        let chunk_n = n.div_ceil(chunks);
        let chunks = n.div_ceil(chunk_n);
        // Narrow tiles over a short axis make blocks of a few threads: several tiles then share
        // a block (z slices, 64 at most), as long as a thousand blocks remain.
        let mut tz = if chunks == 1 { (256 / (tx * ty)).clamp(1, 64) } else { 1 };
        while tz > 1 && tiles.div_ceil(tz) < 1024 {
            tz /= 2;
        }
        let nacc = reds.len().max(1);
        let ws_bytes = (tiles * chunks * nacc * tile * 4).max(4) as u64;
        let count_bytes = (tiles * 4).max(4) as u64;

        let mut d = self.common_defines(&self.name(), &[("float", "eq_ws"), ("unsigned int", "eq_count")]);
        for (k, v) in [
            ("EQ_OUTER", outer),
            ("EQ_N", n),
            ("EQ_INNER", inner),
            ("EQ_VEC", self.vec),
            ("EQ_TX", tx),
            ("EQ_TY", ty),
            ("EQ_TZ", tz),
            ("EQ_CHUNKS", chunks),
            ("EQ_CHUNK_N", chunk_n),
            ("EQ_NACC", nacc),
        ] {
            let _ = writeln!(d, "#define {k} {v}");
        }
        let mut body = String::new();
        let mut t = Text::default();
        t.line(0, "__device__ __forceinline__ void eq_acc_init(float (&acc)[EQ_NACC][EQ_VEC]) {");
        for (k, &i) in reds.iter().enumerate() {
            t.line(1, format!("for (int v = 0; v < EQ_VEC; ++v) acc[{k}][v] = {};", reduce_init(self.reduce_of(i))));
        }
        t.line(0, "}");
        // Two accumulators' partials merged: each on its own, an online pair's together (its
        // sum rescaled to the larger max).
        t.line(0, "__device__ __forceinline__ void eq_merge(float (&a)[EQ_NACC], const float (&b)[EQ_NACC]) {");
        let slot = |i: usize| reds.iter().position(|&r| r == i).unwrap_or(0);
        for (k, &i) in reds.iter().enumerate() {
            if pairs.iter().any(|&(s, m)| s == i || m == i) {
                continue;
            }
            let c = reduce_combine(self.reduce_of(i), &format!("a[{k}]"), &format!("b[{k}]"), self.strict);
            t.line(1, format!("a[{k}] = {c};"));
        }
        for &(s, m) in &pairs {
            let (ks, km) = (slot(s), slot(m));
            t.line(1, "{");
            for line in online_merge(ks, km, "m") {
                t.line(2, line);
            }
            t.line(1, "}");
        }
        t.line(0, "}");
        body.push_str(&t.s);
        body.push_str(&self.col_accum(&reds, &after, &pairs));
        body.push_str(&self.col_store(&reds, &after, n));
        let shape = Shape {
            grid: [tiles.div_ceil(tz) as u32, chunks as u32, 1],
            block: [tx as u32, ty as u32, tz as u32],
            workspace: vec![("eq_ws".into(), ws_bytes, false), ("eq_count".into(), count_bytes, true)],
            smem_bytes: 0,
            wave: false,
            cluster: 0,
        };
        Ok(Rendered { defines: d, body, shape, params: Params { vec: self.vec, row_threads: 1, nacc }, sm90a: None })
    }

    /// Which nodes are reductions or computed from one: a pointwise epilogue of the reduced
    /// values (a cast, a unary operator, a binary one with a constant), evaluated where they
    /// are stored.
    fn after_reductions(&self, reds: &[usize]) -> Vec<bool> {
        let mut after = vec![false; self.l.nodes.len()];
        for (i, n) in self.l.nodes.iter().enumerate() {
            after[i] = reds.contains(&i) || children(&n.op).iter().any(|&c| after[c]);
        }
        after
    }

    /// Online pairs `(sum, max)` of the kernel's reductions ([`online_max`]), outside strict
    /// numerics (they keep the unfused plan's two passes): a `sum(exp(x - amax(x)))` with its
    /// max in the kernel, where the subtraction and the exponential feed nothing else.
    fn online_pairs(&self, reds: &[usize]) -> Vec<(usize, usize)> {
        let mut pairs: Vec<(usize, usize)> = vec![];
        if self.strict {
            return pairs;
        }
        for &s in reds {
            let Some(m) = online_max(self.l, s).filter(|m| reds.contains(m)) else { continue };
            let [e, d] = self.pair_nodes(s);
            let private = self.l.nodes.iter().enumerate().all(|(j, n)| {
                let c = children(&n.op);
                (!c.contains(&e) || j == s) && (!c.contains(&d) || j == e)
            }) && !self.l.stores.iter().any(|st| st.node == e || st.node == d);
            if private && !pairs.iter().any(|&(_, x)| x == m) {
                pairs.push((s, m));
            }
        }
        pairs
    }

    /// The exponential and the subtraction under an online pair's sum.
    fn pair_nodes(&self, s: usize) -> [usize; 2] {
        let e = children(&self.node(s).op)[0];
        [e, children(&self.node(e).op)[0]]
    }

    fn col_accum(&self, reds: &[usize], after: &[bool], pairs: &[(usize, usize)]) -> String {
        let mut scope = self.scope(true);
        for &i in reds {
            scope.refs[i] = Some(String::new());
        }
        // (An online pair's sum accumulates the max's input `x`, not its exponential.)
        let input = |i: usize| match pairs.iter().find(|&&(s, _)| s == i) {
            Some(&(_, m)) => children(&self.node(m).op)[0],
            None => children(&self.node(i).op)[0],
        };
        let inputs: Vec<usize> = reds.iter().map(|&i| input(i)).collect();
        let stores: Vec<&Store> = self.l.stores.iter().filter(|s| !after[s.node]).collect();
        let mut roots = inputs.clone();
        roots.extend(stores.iter().map(|s| s.node));
        self.lane_function(
            "__device__ __forceinline__ void eq_accum(EQ_PARAMS, eq_idx o, eq_idx n, eq_idx i0, float (&acc)[EQ_NACC][EQ_VEC]) {",
            0,
            &mut scope,
            &roots,
            |e, scope, need| {
                let (decls, mut lines, after) =
                    e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), None, need);
                for (k, (&red, &x)) in reds.iter().zip(&inputs).enumerate() {
                    if pairs.iter().any(|&(s, _)| s == red) {
                        continue;
                    }
                    let val = e.operand(x, "float", scope);
                    match pairs.iter().find(|&&(_, m)| m == red).and_then(|&(s, _)| reds.iter().position(|&r| r == s)) {
                        // The running max and the sum rescaled to it, with one exponential an
                        // element and no branch: e = exp(-|x - m|) is the sum's rescale where x
                        // raises the max, else x's term. (A branch a row kept each row's loads
                        // behind the last row's: 30% of copy bandwidth on an H100.) An empty
                        // pair stays empty; NaN propagates to both.
                        Some(ks) => lines.push(format!(
                            "{{ const float xo = {val}; const float mo = acc[{k}][v]; \
                             const float e = expf(-fabsf(xo - mo)); const bool up = xo > mo; \
                             acc[{ks}][v] = (up ? acc[{ks}][v] * e : acc[{ks}][v]) + (up ? 1.0f : (xo == -EQ_INF ? 0.0f : e)); \
                             acc[{k}][v] = eq_max(mo, xo); }}"
                        )),
                        None => lines.push(format!(
                            "acc[{k}][v] = {};",
                            reduce_combine(e.reduce_of(red), &format!("acc[{k}][v]"), &val, e.strict)
                        )),
                    }
                }
                (decls, lines, after)
            },
        )
    }

    fn col_store(&self, reds: &[usize], after: &[bool], n: usize) -> String {
        let mut scope = self.scope(true);
        for (k, &i) in reds.iter().enumerate() {
            let v = match self.reduce_of(i) {
                Reduce::Mean => format!("(acc[{k}][v] / {})", literal(n as f64, "float")),
                _ => format!("acc[{k}][v]"),
            };
            scope.refs[i] = Some(self.rounded(i, v));
        }
        let stores: Vec<&Store> = self.l.stores.iter().filter(|s| after[s.node]).collect();
        let epilogue: Vec<usize> = stores.iter().map(|s| s.node).filter(|n| !reds.contains(n)).collect();
        let axis = self.l.axis;
        self.lane_function(
            "__device__ __forceinline__ void eq_col_store(EQ_PARAMS, eq_idx o, eq_idx i0, const float (&acc)[EQ_NACC][EQ_VEC]) {",
            0,
            &mut scope,
            &epilogue,
            |e, scope, need| {
                e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), axis, need)
            },
        )
    }
}

/// The column template's launch settings: the blocks a launch aims at (512), and the rows a
/// thread accumulates at least (8). `EQFUSE_COL_BLOCKS` and `EQFUSE_COL_ROWS` set others (read
/// once), to measure them against these on a device. Aiming at 512 blocks rather than 1024
/// measured faster or equal on four shapes on the H100 (a softmax over the middle axis of
/// [32, 4096, 512]: 117.1 -> 112.3 us; a [1000, 16384] log-softmax + NLL: 53.4 -> 51.3; a
/// [40960, 96] sum: 25.4 -> 23.4; a [4096, 512] sum: 11.4 -> 11.3): fewer chunks a tile, each
/// with its fixed cost (a partial written, a fence, an atomic; one more partial for the last
/// block to merge). 256 was slower on the softmax (122.8).
/// `benches/results/2026-11-27-h100-session13`.
fn col_settings() -> (usize, usize) {
    static SETTINGS: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *SETTINGS.get_or_init(|| {
        let var = |name: &str, default: usize| {
            std::env::var(name).ok().and_then(|v| v.parse::<usize>().ok()).filter(|&v| v > 0).unwrap_or(default)
        };
        (var("EQFUSE_COL_BLOCKS", 512), var("EQFUSE_COL_ROWS", 8))
    })
}
