//! Greedy fusion over one chosen program form: which tensors are materialized, and which
//! materialized tensors share a kernel.
//!
//! The state starts as the unfused plan (every computed tensor materialized, one kernel each)
//! and applies the move that saves the most predicted time, until none saves any (XLA's priority
//! fusion, with recomputation as one of the moves):
//! - *inline* a tensor: stop writing it; every kernel that read it computes it instead;
//! - *merge* two kernels into one multi-output kernel (a producer and its consumer, or two
//!   kernels reading the same tensor), which is legal only when no third kernel sits between.
//!
//! A materialized tensor is written once (if it is an output or another kernel reads it) and
//! read once by each kernel that reaches it; an inlined tensor is recomputed by each kernel that
//! reaches it. Invariant: every state the search visits is a legal, acyclic plan, and the search
//! is deterministic (candidates are visited in index order; ties keep the first).
//!
//! Scaling: the kernels keep a topological rank (a kernel's rank is below every kernel that reads
//! from it), maintained through every move (a merge reorders only the kernels between the two
//! it merges, as Pearce and Kelly's dynamic topological order does), so the cycle test of a
//! merge searches only the kernels ranked between the two instead of everything downstream.
//! The body index (`computing_of`) finds the kernels computing a value without a scan. Kernels
//! are never changed, only replaced under new ids, and what a move would add follows from the
//! kernels it would replace: the analyses of the kernels moves would add ([`Derived`]) are kept
//! while the kernels they name live, and the cycle tests between two kernels while no move of
//! the kind that could change the answer is made ([`Paths`]), so a move evaluated again (the
//! lazy greedy search re-evaluates a move before applying it and proposes moves again near every
//! move it makes; the materialize rounds propose every materialize move each round) costs
//! lookups, not analyses. A [`Deadline`] stops a search between moves: the state it leaves is
//! legal, the best so far.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::cost::profile::DeviceProfile;
use crate::cost::{analyse, KernelCost};
use crate::plan::dag::{Dag, Role};
use crate::search::deadline::{Deadline, Ticker};

/// One kernel of the fusion state.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// Materialized nodes this kernel computes (sorted).
    pub members: Vec<usize>,
    pub cost: KernelCost,
}

/// A fusion state: the materialized set and its kernels.
#[derive(Clone, Debug)]
pub struct Fusion<'a> {
    dag: &'a Dag,
    profile: &'a DeviceProfile,
    /// Materialized nodes (inputs always).
    pub mat: Vec<bool>,
    /// Owning group of each materialized computed node.
    owner: Vec<usize>,
    pub groups: Vec<Option<Group>>,
    /// How many groups read each node.
    readers: Vec<u32>,
    /// The groups reading each node.
    readers_of: Vec<BTreeSet<usize>>,
    /// The groups reading each node, as (rank, group), to find a kernel's nearest siblings: kept
    /// from when more than [`MANY_READERS`] read it (only then is it asked), so that ranking a
    /// kernel again updates only the tensors many kernels read.
    readers_by_rank: Vec<Option<BTreeSet<(usize, usize)>>>,
    /// The groups whose bodies compute each node without owning it (recomputed, inline).
    computing_of: Vec<Vec<usize>>,
    /// A topological rank of each group: a group's rank is below the rank of every group that
    /// reads something it writes (dead groups keep a stale rank).
    rank: Vec<usize>,
    /// Moves applied.
    pub moves: usize,
    /// When searches stop (between moves, so the state stays a legal plan).
    deadline: Deadline,
    /// Whether the deadline stopped a search on this state before it ended.
    pub cut: bool,
    /// Kernels that moves would add, already analysed.
    analysed: Analysed,
    /// Cycle tests already answered, and the search's scratch space.
    paths: Paths,
}

/// A fusion state without the DAG and profile it refers to, to be kept beside its DAG
/// ([`Fusion::into_parts`], [`Fusion::from_parts`]).
#[derive(Clone, Debug)]
pub struct FusionParts {
    mat: Vec<bool>,
    owner: Vec<usize>,
    groups: Vec<Option<Group>>,
    readers: Vec<u32>,
    readers_of: Vec<BTreeSet<usize>>,
    readers_by_rank: Vec<Option<BTreeSet<(usize, usize)>>>,
    computing_of: Vec<Vec<usize>>,
    rank: Vec<usize>,
    moves: usize,
    /// Whether the deadline stopped a search on this state before it ended.
    pub cut: bool,
}

/// A fusion the final state does not make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The tensor to inline, or a member of the first kernel of a merge.
    pub subject: usize,
    /// For a merge, a member of the second kernel.
    pub into: Option<usize>,
    pub why: String,
}

/// A multiplicative hash of kernel and node ids, for the search's caches (the standard
/// library's SipHash costs more than the rest of a lookup); lookups only, so the order of
/// nothing depends on it.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // (A slice of integers comes as its bytes: eight at a time.)
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.write_u64(u64::from_le_bytes(w.try_into().expect("eight bytes")));
        }
        for &b in words.remainder() {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// A hash map keyed by ids.
type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// What a kernel that a move would add is made from: the kernels (and the node the move
/// flips) whose nodes its analysis asks about. Its members follow from them, and so does
/// everything `cost::collect` asks of the state (the reads materialized, the rest of the body
/// not): each such node is one the named kernels read or compute, or the flipped node, and a
/// live kernel's nodes keep their state (a move that changes a node's state replaces every
/// kernel computing or reading it). So while the named kernels live, the analysis is the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Derived {
    /// Two kernels as one.
    Merged(usize, usize),
    /// Kernel `reader` computing `m` (a member of `owner`) instead of reading it.
    Recomputing { reader: usize, owner: usize, m: usize },
    /// Kernel `owner` without its member `m`.
    Without { owner: usize, m: usize },
    /// Kernel `user` reading `c` instead of computing it.
    Reading { user: usize, c: usize },
    /// Kernel `host` (or, `NONE`, a kernel of its own) writing `c` too, computed as kernel
    /// `user` computes it now.
    Writing { host: usize, c: usize, user: usize },
}

impl Derived {
    /// The kernels it is made from (`NONE` where fewer).
    fn kernels(&self) -> [usize; 2] {
        match *self {
            Derived::Merged(a, b) => [a, b],
            Derived::Recomputing { reader, owner, .. } => [reader, owner],
            Derived::Without { owner, .. } => [owner, NONE],
            Derived::Reading { user, .. } => [user, NONE],
            Derived::Writing { host, user, .. } => [host, user],
        }
    }
}

/// The kernels moves would add, analysed (or why no template runs one), by what each is made
/// from ([`Derived`]): the lazy greedy search evaluates most moves several times (queued,
/// re-evaluated before it is applied, proposed again near other moves), and the materialize
/// rounds every materialize move once a round, while most of the kernels they would add stay the
/// same. Kernels are never changed, only replaced under new ids, so an answer holds while the
/// kernels it names live; clones of a state start empty (they number new kernels alike).
#[derive(Default)]
struct Analysed {
    kernels: RefCell<IdMap<Derived, Result<Arc<Group>, String>>>,
    /// Entries after the last sweep of those whose kernels are gone.
    swept: std::cell::Cell<usize>,
}

impl Clone for Analysed {
    fn clone(&self) -> Analysed {
        Analysed::default()
    }
}

impl std::fmt::Debug for Analysed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Analysed({} kernels)", self.kernels.borrow().len())
    }
}

impl Analysed {
    /// The kernel made as `from` says: known, or found by `analyse` and kept.
    fn kernel(&self, from: Derived, analyse: impl FnOnce() -> Result<Group, String>) -> Result<Arc<Group>, String> {
        // (A kernel of `c` named by no kernel computing it names nothing it is made from.)
        if matches!(from, Derived::Writing { user: NONE, .. }) {
            return analyse().map(Arc::new);
        }
        if let Some(k) = self.kernels.borrow().get(&from) {
            // (Unit tests check every answer reused against a fresh analysis.)
            #[cfg(test)]
            assert_eq!(k.as_deref().map_err(String::as_str), analyse().as_ref().map_err(String::as_str), "{from:?}");
            return k.clone();
        }
        let k = analyse().map(Arc::new);
        self.kernels.borrow_mut().insert(from, k.clone());
        k
    }

    /// Forgets the kernels made from kernels no longer live, once the entries have doubled
    /// since the last sweep (so the entries stay within a multiple of the live ones).
    fn sweep(&self, live: impl Fn(usize) -> bool) {
        let mut kernels = self.kernels.borrow_mut();
        if kernels.len() < 2 * self.swept.get() + 4096 {
            return;
        }
        kernels.retain(|from, _| from.kernels().iter().all(|&g| g == NONE || live(g)));
        self.swept.set(kernels.len());
    }
}

/// Cycle tests answered, by (from, to) kernel: whether `to` reads what `from` writes, through
/// other kernels or directly. Kernels are never changed, only replaced under new ids, and while
/// both live, the answer changes only as the kernels between them do, in one direction per kind
/// of move: a merge joins the paths through two kernels (a materialize move too: its writer reads
/// what its readers read, and feeds them), so a "no" holds until the next merge or materialize
/// move; an inline move whose kernel keeps other members can cut the paths that ran through it
/// (to a kernel that reads only the other members, from one that fed only the recomputed one),
/// so a "yes" holds until the next such move. An inline move of a kernel's only member changes
/// no answer: each path through it runs on through its readers, which read what it read. Each
/// answer is kept with the count of the moves that end it; clones of a state start empty (they
/// number new kernels alike).
#[derive(Default, Debug)]
struct Paths {
    /// Each answer, with the count of merges (for a "no") or of splits (for a "yes") it was
    /// found at.
    answers: RefCell<IdMap<PathQuery, (bool, usize)>>,
    /// Merge and materialize moves applied.
    joins: std::cell::Cell<usize>,
    /// Inline moves applied whose kernel kept other members.
    splits: std::cell::Cell<usize>,
    /// Answers after the last sweep of those whose kernels are gone or that no longer hold.
    swept: std::cell::Cell<usize>,
    scratch: RefCell<Scratch>,
}

impl Clone for Paths {
    fn clone(&self) -> Paths {
        Paths::default()
    }
}

/// A cycle test: (through another kernel only, from, to).
type PathQuery = (bool, usize, usize);

/// The cycle test's marks (two stamps per call: one per side) and stacks (forward, backward).
#[derive(Default, Debug)]
struct Scratch {
    marks: Vec<u32>,
    stamp: u32,
    stack: Vec<usize>,
    back: Vec<usize>,
}

impl Scratch {
    /// Two stamps no kernel is marked with, marks sized for `len` kernels.
    fn stamps(&mut self, len: usize) -> (u32, u32) {
        if self.marks.len() < len {
            self.marks.resize(len, 0);
        }
        if self.stamp >= u32::MAX - 2 {
            self.marks.fill(0);
            self.stamp = 0;
        }
        self.stamp += 2;
        (self.stamp - 1, self.stamp)
    }
}

impl Paths {
    /// The count an answer holds for.
    fn epoch(&self, answer: bool) -> usize {
        if answer {
            self.splits.get()
        } else {
            self.joins.get()
        }
    }

    /// The answer for (`through`, `from`, `to`), found by `search` when none holds.
    fn answer(&self, through: bool, from: usize, to: usize, search: impl FnOnce() -> bool) -> bool {
        let key = (through, from, to);
        if let Some(&(a, at)) = self.answers.borrow().get(&key) {
            if at == self.epoch(a) {
                // (Unit tests check every answer reused against a fresh search.)
                #[cfg(test)]
                assert_eq!(a, search(), "{key:?}");
                return a;
            }
        }
        let a = search();
        self.answers.borrow_mut().insert(key, (a, self.epoch(a)));
        a
    }

    /// Counts a move applied; then forgets the answers about kernels no longer live and those
    /// that no longer hold, once the answers have doubled since the last sweep.
    fn moved(&self, mv: Move, split: bool, live: impl Fn(usize) -> bool) {
        match mv {
            Move::Merge(..) | Move::Materialize(..) => self.joins.set(self.joins.get() + 1),
            Move::Inline(_) if split => self.splits.set(self.splits.get() + 1),
            Move::Inline(_) => {}
        }
        let mut answers = self.answers.borrow_mut();
        if answers.len() < 2 * self.swept.get() + 4096 {
            return;
        }
        let (joins, splits) = (self.joins.get(), self.splits.get());
        answers.retain(|&(_, from, to), &mut (a, at)| live(from) && live(to) && at == if a { splits } else { joins });
        self.swept.set(answers.len());
    }
}

/// A queued move, ordered so that the largest saving (most negative delta) pops first, equal
/// times by the bytes saved, then by the move itself for determinism.
#[derive(Clone, Copy, Debug)]
struct Queued {
    delta_us: f64,
    delta_bytes: i64,
    mv: Move,
}

/// Whether a change of (time, traffic) improves a plan: faster, or as fast with fewer bytes
/// moved (a kernel bound by its flops, a matrix product, moves bytes for free in the time model;
/// fewer bytes still leave bandwidth to other work and memory to the rest of the program).
fn improves(delta_us: f64, delta_bytes: i64) -> bool {
    delta_us < -1e-9 || (delta_us <= 1e-9 && delta_bytes < 0)
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Queued {
    fn cmp(&self, o: &Self) -> Ordering {
        o.delta_us
            .total_cmp(&self.delta_us)
            .then_with(|| o.delta_bytes.cmp(&self.delta_bytes))
            .then_with(|| o.mv.cmp(&self.mv))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Move {
    Inline(usize),
    Merge(usize, usize),
    /// Write an inlined tensor instead of recomputing it: computed by the given kernel (one
    /// that already computes it or one of its operands), or by a new kernel of its own (`NONE`).
    Materialize(usize, usize),
}

/// What a move changes: a node's materialization, the kernels removed, what each kernel added is
/// made from.
type MoveParts = (Option<(usize, bool)>, Vec<usize>, Vec<Derived>);

/// A move's effect, before it is applied.
struct Proposal {
    mv: Move,
    /// A node whose materialization the move changes, and its new state.
    flip: Option<(usize, bool)>,
    remove: Vec<usize>,
    add: Vec<Arc<Group>>,
    delta_us: f64,
    /// The change in bytes moved.
    delta_bytes: i64,
}

const NONE: usize = usize::MAX;

/// Readers of one tensor past which sibling merges pair kernels by rank (see `Fusion::siblings`).
const MANY_READERS: usize = 64;

impl<'a> Fusion<'a> {
    /// The unfused state: every computed tensor materialized in its own kernel (tests: a
    /// program every operator of which some template runs).
    #[cfg(test)]
    pub fn unfused(dag: &'a Dag, profile: &'a DeviceProfile) -> Fusion<'a> {
        Self::try_unfused(dag, profile).expect("a single operator with its inputs in memory is legal")
    }

    /// The unfused state: every computed tensor materialized in its own kernel; the reason
    /// where an operator alone, its inputs in memory, is one no template runs (a form codegen
    /// does not generate), an error rather than a plan that cannot run.
    pub fn try_unfused(dag: &'a Dag, profile: &'a DeviceProfile) -> Result<Fusion<'a>, String> {
        let n = dag.len();
        let mat: Vec<bool> = (0..n).map(|i| !dag.is_free(i)).collect();
        let mut f = Fusion {
            dag,
            profile,
            mat,
            owner: vec![NONE; n],
            groups: vec![],
            readers: vec![0; n],
            readers_of: vec![BTreeSet::new(); n],
            readers_by_rank: vec![None; n],
            computing_of: vec![Vec::new(); n],
            rank: vec![],
            moves: 0,
            deadline: Deadline::never(),
            cut: false,
            analysed: Analysed::default(),
            paths: Paths::default(),
        };
        for i in 0..n {
            if f.mat[i] && dag.nodes[i].role != Role::Input {
                let members = vec![i];
                let cost = analyse(dag, &members, &|x| f.mat[x], profile).map_err(|e| {
                    let op = dag.nodes[i].kind().map_or_else(|| "a value".to_string(), |k| format!("{k:?}"));
                    format!("no kernel template runs operator {i} ({op}) alone: {e}")
                })?;
                // Nodes are in topological order, so creation order is a topological rank.
                let rank = f.groups.len();
                f.insert(Group { members, cost }, rank);
            }
        }
        Ok(f)
    }

    /// The state without its DAG and profile.
    pub fn into_parts(self) -> FusionParts {
        let Fusion { mat, owner, groups, readers, readers_of, readers_by_rank, computing_of, rank, moves, cut, .. } =
            self;
        FusionParts { mat, owner, groups, readers, readers_of, readers_by_rank, computing_of, rank, moves, cut }
    }

    /// A state kept by [`Fusion::into_parts`], over the DAG and profile it was found with.
    pub fn from_parts(dag: &'a Dag, profile: &'a DeviceProfile, parts: FusionParts) -> Fusion<'a> {
        let FusionParts { mat, owner, groups, readers, readers_of, readers_by_rank, computing_of, rank, moves, cut } =
            parts;
        Fusion {
            dag,
            profile,
            mat,
            owner,
            groups,
            readers,
            readers_of,
            readers_by_rank,
            computing_of,
            rank,
            moves,
            deadline: Deadline::never(),
            cut,
            analysed: Analysed::default(),
            paths: Paths::default(),
        }
    }

    /// The same state, its searches stopped by `deadline`.
    pub fn with_deadline(mut self, deadline: Deadline) -> Fusion<'a> {
        self.deadline = deadline;
        self
    }

    fn insert(&mut self, g: Group, rank: usize) {
        let id = self.groups.len();
        for &m in &g.members {
            self.owner[m] = id;
        }
        for &r in &g.cost.reads {
            self.readers[r] += 1;
            self.readers_of[r].insert(id);
            match &mut self.readers_by_rank[r] {
                Some(by_rank) => {
                    by_rank.insert((rank, id));
                }
                None if self.readers_of[r].len() > MANY_READERS => {
                    let ranked =
                        self.readers_of[r].iter().map(|&g| if g == id { (rank, g) } else { (self.rank[g], g) });
                    self.readers_by_rank[r] = Some(ranked.collect());
                }
                None => {}
            }
        }
        for &b in &g.cost.body {
            if g.members.binary_search(&b).is_err() {
                self.computing_of[b].push(id);
            }
        }
        self.groups.push(Some(g));
        self.rank.push(rank);
    }

    fn remove(&mut self, id: usize) {
        if let Some(g) = self.groups[id].take() {
            for &r in &g.cost.reads {
                self.readers[r] -= 1;
                self.readers_of[r].remove(&id);
                if let Some(by_rank) = &mut self.readers_by_rank[r] {
                    by_rank.remove(&(self.rank[id], id));
                }
            }
            for &m in &g.members {
                if self.owner[m] == id {
                    self.owner[m] = NONE;
                }
            }
            for &b in &g.cost.body {
                if g.members.binary_search(&b).is_err() {
                    self.computing_of[b].retain(|&x| x != id);
                }
            }
        }
    }

    /// Whether a materialized node is written, given reader counts.
    fn written(&self, m: usize, readers: u32) -> bool {
        self.dag.is_output[m] || readers > 0
    }

    /// Bytes a group writes, given a reader-count lookup.
    fn write_bytes(&self, g: &Group, readers: impl Fn(usize) -> u32) -> u64 {
        g.members.iter().filter(|&&m| self.written(m, readers(m))).map(|&m| self.dag.bytes(m)).sum()
    }

    /// Predicted time of a group in the current state.
    pub fn group_us(&self, g: &Group) -> f64 {
        g.cost.predict_us(self.dag, self.profile, self.write_bytes(g, |m| self.readers[m]))
    }

    /// Bytes a group writes in the current state.
    pub fn group_write_bytes(&self, g: &Group) -> u64 {
        self.write_bytes(g, |m| self.readers[m])
    }

    /// Whether a member of a group is written in the current state.
    pub fn is_written(&self, m: usize) -> bool {
        self.written(m, self.readers[m])
    }

    /// Predicted time of the whole state.
    pub fn total_us(&self) -> f64 {
        self.groups.iter().flatten().map(|g| self.group_us(g)).sum()
    }

    /// Bytes moved by the whole state.
    pub fn total_bytes(&self) -> u64 {
        self.groups
            .iter()
            .flatten()
            .map(|g| g.cost.bytes_read(self.group_write_bytes(g)) + self.group_write_bytes(g))
            .sum()
    }

    /// Whether this state is better than another: faster, or as fast with fewer bytes moved.
    pub fn better_than(&self, other: &Fusion) -> bool {
        improves(self.total_us() - other.total_us(), self.total_bytes() as i64 - other.total_bytes() as i64)
    }

    /// Runs greedy fusion to a local optimum.
    ///
    /// Lazy greedy: every candidate's saving is kept in a queue; the best is re-evaluated before
    /// it is applied (its neighbours may have changed), and only moves touching the kernels a
    /// move created are evaluated anew.
    pub fn optimise(&mut self) {
        self.greedy(true);
    }

    /// Greedy fusion; with `merges` false, only inline moves (recomputation) are made.
    fn greedy(&mut self, merges: bool) {
        let allowed = |mv: &Move| merges || matches!(mv, Move::Inline(_));
        let mut queue: BinaryHeap<Queued> = BinaryHeap::new();
        let mut ticker = Ticker::new(self.deadline, 64);
        for mv in self.candidates().into_iter().filter(allowed) {
            if ticker.expired() {
                self.cut = true;
                return;
            }
            self.enqueue(&mut queue, mv);
        }
        // Every move saves time or, at equal time (within 1e-9 us), bytes; the cap only guards
        // against rounding letting equal-time moves trade back and forth.
        let cap = self.moves + 16 * self.dag.len() + 64;
        while let Some(q) = queue.pop() {
            if ticker.expired() {
                self.cut = true;
                return;
            }
            if !self.live_move(q.mv) || self.moves >= cap {
                continue;
            }
            let Ok(p) = self.propose(q.mv) else { continue };
            if !improves(p.delta_us, p.delta_bytes) {
                continue;
            }
            // Stale and now worse than the next in line: queue it again at its true saving.
            if p.delta_us > q.delta_us + 1e-9 && queue.peek().is_some_and(|n| n.delta_us < p.delta_us) {
                queue.push(Queued { delta_us: p.delta_us, delta_bytes: p.delta_bytes, mv: q.mv });
                continue;
            }
            let first_new = self.groups.len();
            self.apply(p);
            for mv in self.moves_near(first_new).into_iter().filter(allowed) {
                self.enqueue(&mut queue, mv);
            }
        }
    }

    fn enqueue(&self, queue: &mut BinaryHeap<Queued>, mv: Move) {
        if let Ok(p) = self.propose(mv) {
            if improves(p.delta_us, p.delta_bytes) {
                queue.push(Queued { delta_us: p.delta_us, delta_bytes: p.delta_bytes, mv });
            }
        }
    }

    /// Whether a move still refers to live kernels.
    fn live_move(&self, mv: Move) -> bool {
        match mv {
            Move::Inline(m) => self.mat[m] && self.owner[m] != NONE,
            Move::Merge(a, b) => self.groups[a].is_some() && self.groups[b].is_some(),
            Move::Materialize(c, host) => !self.mat[c] && (host == NONE || self.groups[host].is_some()),
        }
    }

    /// Candidate moves that involve the kernels created from index `first_new` on.
    fn moves_near(&self, first_new: usize) -> Vec<Move> {
        let mut out = Vec::new();
        for gid in first_new..self.groups.len() {
            let Some(g) = &self.groups[gid] else { continue };
            if let [m] = g.members[..] {
                if self.inlinable(m) {
                    out.push(Move::Inline(m));
                }
            }
            for &r in &g.cost.reads {
                let o = self.owner[r];
                if o != NONE && o != gid {
                    out.push(Move::Merge(o.min(gid), o.max(gid)));
                    if let [m] = self.members(o) {
                        if self.inlinable(*m) {
                            out.push(Move::Inline(*m));
                        }
                    }
                }
                for sib in self.siblings(r, gid) {
                    out.push(Move::Merge(sib.min(gid), sib.max(gid)));
                }
            }
            for s in self.successors(gid) {
                out.push(Move::Merge(gid.min(s), gid.max(s)));
            }
        }
        // (In order, each once.)
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Up to 8 other kernels reading `r`, for sibling merges with `gid`: the first 8 in creation
    /// order, or, where more than [`MANY_READERS`] kernels read it (an input every kernel of a
    /// long program reads), the 8 nearest in rank (4 before, 4 after): kernels far apart are
    /// rarely mergeable, and the cycle test would search everything between them.
    fn siblings(&self, r: usize, gid: usize) -> Vec<usize> {
        if self.readers_of[r].len() <= MANY_READERS {
            return self.readers_of[r].iter().copied().filter(|&x| x != gid).take(8).collect();
        }
        let at = (self.rank[gid], gid);
        let by_rank = self.readers_by_rank[r].as_ref().expect("kept for many readers");
        let before = by_rank.range(..at).rev().take(4).map(|&(_, g)| g);
        let after = by_rank.range(at..).filter(|&&(_, g)| g != gid).take(4).map(|&(_, g)| g);
        before.chain(after).collect()
    }

    fn inlinable(&self, m: usize) -> bool {
        !self.dag.is_output[m] && self.dag.nodes[m].role == Role::Compute
    }

    /// The fusions not made in the final state, and why: each remaining move is either illegal
    /// (the reason) or slower (by how much). Keyed by the node the move concerns.
    pub fn rejections(&self) -> Vec<Rejection> {
        self.rejections_within_deadline().0
    }

    /// [`Fusion::rejections`], stopped when the deadline passes; with whether it stopped.
    pub fn rejections_within_deadline(&self) -> (Vec<Rejection>, bool) {
        let mut out = Vec::new();
        let mut ticker = Ticker::new(self.deadline, 64);
        for mv in self.candidates() {
            if ticker.expired() {
                return (out, true);
            }
            let (subject, into) = match mv {
                Move::Inline(m) | Move::Materialize(m, _) => (m, None),
                Move::Merge(a, b) => (self.first_member(a), Some(self.first_member(b))),
            };
            let why = match self.propose(mv) {
                Ok(p) if !improves(p.delta_us, p.delta_bytes) => {
                    format!("it would be slower by {:.2} us", p.delta_us.max(0.0))
                }
                Ok(_) => continue,
                Err((_, why)) => why,
            };
            out.push(Rejection { subject, into, why });
        }
        (out, false)
    }

    /// Legal-looking moves from the current state, in a deterministic order.
    fn candidates(&self) -> Vec<Move> {
        let mut out = Vec::new();
        for (gid, g) in self.groups.iter().enumerate() {
            let Some(g) = g else { continue };
            if let [m] = g.members[..] {
                if self.inlinable(m) {
                    out.push(Move::Inline(m));
                }
            }
            for &r in &g.cost.reads {
                let o = self.owner[r];
                if o != NONE && o != gid {
                    out.push(Move::Merge(o.min(gid), o.max(gid)));
                }
            }
        }
        // Kernels reading one tensor may share the read (sibling fusion).
        let mut by_read: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (gid, g) in self.groups.iter().enumerate() {
            for &r in g.iter().flat_map(|g| &g.cost.reads) {
                by_read.entry(r).or_default().push(gid);
            }
        }
        for (&r, gs) in &by_read {
            // (Pairs of kernels adjacent in rank where many read the tensor; see `siblings`.)
            if gs.len() > MANY_READERS {
                let by_rank = self.readers_by_rank[r].as_ref().expect("kept for many readers");
                let by_rank: Vec<usize> = by_rank.iter().map(|&(_, g)| g).collect();
                for w in by_rank.windows(2) {
                    out.push(Move::Merge(w[0].min(w[1]), w[0].max(w[1])));
                }
                continue;
            }
            for w in gs.windows(2) {
                out.push(Move::Merge(w[0], w[1]));
            }
        }
        // (In order, each once.)
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Evaluates a move without applying it; `Err` names the node concerned and the reason.
    fn propose(&self, mv: Move) -> Result<Proposal, (usize, String)> {
        let (flip, remove, add_members): MoveParts = match mv {
            Move::Inline(m) => {
                let own = self.owner[m];
                let users = &self.readers_of[m];
                let mut remove: Vec<usize> = users.iter().copied().collect();
                remove.push(own);
                let mut add: Vec<Derived> =
                    users.iter().map(|&u| Derived::Recomputing { reader: u, owner: own, m }).collect();
                // A member of a multi-output kernel: the kernel keeps its other members and
                // computes this one on chip without writing it.
                if self.members(own).len() > 1 {
                    add.push(Derived::Without { owner: own, m });
                }
                (Some((m, false)), remove, add)
            }
            Move::Materialize(c, host) => self.materialize_members(c, host)?,
            Move::Merge(a, b) => {
                if self.path_through_other(a, b) || self.path_through_other(b, a) {
                    return Err((
                        self.first_member(b),
                        "fusing would put another kernel inside this one (a cycle)".into(),
                    ));
                }
                (None, vec![a, b], vec![Derived::Merged(a, b)])
            }
        };
        let mat = |x: usize| match flip {
            Some((f, state)) if f == x => state,
            _ => self.mat[x],
        };
        let mut add = Vec::with_capacity(add_members.len());
        for from in add_members {
            let group = self.analysed.kernel(from, || {
                let members = self.members_of(from);
                analyse(self.dag, &members, &mat, self.profile).map(|cost| Group { members, cost })
            });
            match group {
                Ok(g) => add.push(g),
                Err(why) => {
                    let who = flip.map_or_else(|| self.members_of(from)[0], |(f, _)| f);
                    return Err((who, why));
                }
            }
        }
        if let Move::Materialize(c, host) = mv {
            let writer = add.iter().find(|g| g.members.contains(&c)).expect("a kernel writes it");
            if self.materialize_cycles(c, host, &writer.cost.reads) {
                return Err((c, "the kernel that would write it reads from one that runs after it (a cycle)".into()));
            }
        }
        let (delta_us, delta_bytes) = self.delta(&remove, &add);
        Ok(Proposal { mv, flip, remove, add, delta_us, delta_bytes })
    }

    /// The members of a kernel a move would add.
    fn members_of(&self, from: Derived) -> Vec<usize> {
        let mut members = match from {
            Derived::Merged(a, b) => [self.members(a), self.members(b)].concat(),
            Derived::Recomputing { reader: g, .. } | Derived::Reading { user: g, .. } => {
                return self.members(g).to_vec()
            }
            Derived::Without { owner, m } => return self.members(owner).iter().copied().filter(|&x| x != m).collect(),
            Derived::Writing { host: NONE, c, .. } => return vec![c],
            Derived::Writing { host, c, .. } => [self.members(host), &[c]].concat(),
        };
        members.sort_unstable();
        members
    }

    /// The change in total time and in bytes moved if `remove` were replaced by `add`.
    fn delta(&self, remove: &[usize], add: &[Arc<Group>]) -> (f64, i64) {
        // The change in readers of each tensor read by a kernel removed or added, sorted by
        // tensor (a few dozen entries: a sorted list, not a map).
        let removed = remove.iter().filter_map(|&r| self.groups[r].as_ref());
        let mut diff: Vec<(usize, i64)> =
            Vec::with_capacity(removed.chain(add.iter().map(|g| &**g)).map(|g| g.cost.reads.len()).sum::<usize>());
        for &r in remove {
            diff.extend(self.groups[r].as_ref().map_or(&[][..], |g| &g.cost.reads[..]).iter().map(|&x| (x, -1)));
        }
        for g in add {
            diff.extend(g.cost.reads.iter().map(|&x| (x, 1)));
        }
        diff.sort_unstable_by_key(|&(x, _)| x);
        diff.dedup_by(|next, kept| {
            let same = next.0 == kept.0;
            if same {
                kept.1 += next.1;
            }
            same
        });
        let change = |m: usize| diff.binary_search_by_key(&m, |&(x, _)| x).map_or(0, |i| diff[i].1);
        let readers = |m: usize| (self.readers[m] as i64 + change(m)).max(0) as u32;
        let mut delta: f64 =
            add.iter().map(|g| g.cost.predict_us(self.dag, self.profile, self.write_bytes(g, readers))).sum();
        let mut bytes: i64 = add
            .iter()
            .map(|g| (g.cost.bytes_read(self.write_bytes(g, readers)) + self.write_bytes(g, readers)) as i64)
            .sum();
        for g in remove.iter().filter_map(|&r| self.groups[r].as_ref()) {
            delta -= self.group_us(g);
            bytes -= (g.cost.bytes_read(self.group_write_bytes(g)) + self.group_write_bytes(g)) as i64;
        }
        // Owners whose writes change because their readers changed (in increasing order).
        let mut owners: Vec<usize> = diff
            .iter()
            .filter(|&&(_, d)| d != 0)
            .map(|&(m, _)| (m, self.owner[m]))
            .filter(|&(m, o)| {
                o != NONE && !remove.contains(&o) && self.written(m, self.readers[m]) != self.written(m, readers(m))
            })
            .map(|(_, o)| o)
            .collect();
        owners.sort_unstable();
        owners.dedup();
        for o in owners {
            let g = self.groups[o].as_ref().expect("owner is live");
            delta += g.cost.predict_us(self.dag, self.profile, self.write_bytes(g, readers)) - self.group_us(g);
            bytes += self.write_bytes(g, readers) as i64 - self.group_write_bytes(g) as i64;
        }
        (delta, bytes)
    }

    fn apply(&mut self, p: Proposal) {
        // The ranks of the kernels added: an inline move's kernels keep the ranks of those they
        // replace (each reads what it read, or what the inlined kernel read, ranked lower); a
        // merge takes a rank from a reordering of the kernels between the two; a materialize
        // move (rare: a few per search) ranks every kernel again.
        // (Whether an inline move's kernel keeps other members, which can cut paths.)
        let split = matches!(p.mv, Move::Inline(m) if self.members(self.owner[m]).len() > 1);
        let ranks: Vec<usize> = match p.mv {
            Move::Inline(_) => p.remove.iter().map(|&r| self.rank[r]).collect(),
            Move::Merge(a, b) => vec![self.rank_merge(a, b)],
            Move::Materialize(..) => vec![0; p.add.len()],
        };
        for &r in &p.remove {
            self.remove(r);
        }
        if let Some((m, state)) = p.flip {
            self.mat[m] = state;
        }
        // (An inline move removes the readers, then the inlined kernel; it adds the readers,
        // then the inlined kernel's other members, if any.)
        for (g, rank) in p.add.into_iter().zip(ranks) {
            self.insert(Arc::unwrap_or_clone(g), rank);
        }
        if matches!(p.mv, Move::Materialize(..)) {
            self.rerank();
        }
        self.moves += 1;
        self.analysed.sweep(|g| self.groups[g].is_some());
        self.paths.moved(p.mv, split, |g| self.groups[g].is_some());
    }

    /// Reorders the kernels ranked between `a` and `b` so that the kernel merging them can take
    /// one rank (Pearce and Kelly's dynamic topological order): of the kernels ranked between
    /// them, those that reach the later one go before those the earlier one reaches (the two
    /// sets are disjoint: the merge is legal only when no kernel sits on a path between them).
    /// Returns the merged kernel's rank.
    fn rank_merge(&mut self, a: usize, b: usize) -> usize {
        let (lo, hi) = if self.rank[a] < self.rank[b] { (a, b) } else { (b, a) };
        let (rlo, rhi) = (self.rank[lo], self.rank[hi]);
        // (Kernels seen are marked in the cycle test's scratch space, one stamp per side.)
        let (fwd, back) = {
            let mut scratch = self.paths.scratch.borrow_mut();
            let (fwd_seen, back_seen) = scratch.stamps(self.groups.len());
            let marks = &mut scratch.marks;
            // Forward from the earlier, ranked below the later.
            let mut fwd = vec![lo];
            marks[lo] = fwd_seen;
            let mut k = 0;
            while k < fwd.len() {
                for s in self.successors(fwd[k]) {
                    if self.rank[s] < rhi && marks[s] != fwd_seen {
                        marks[s] = fwd_seen;
                        fwd.push(s);
                    }
                }
                k += 1;
            }
            // Backward from the later, ranked above the earlier.
            let mut back = vec![hi];
            marks[hi] = back_seen;
            let mut k = 0;
            while k < back.len() {
                for p in self.predecessors(back[k]) {
                    if self.rank[p] > rlo && marks[p] != back_seen {
                        marks[p] = back_seen;
                        back.push(p);
                    }
                }
                k += 1;
            }
            (fwd, back)
        };
        let (mut fwd, mut back) = (fwd, back);
        fwd.sort_by_key(|&g| self.rank[g]);
        back.sort_by_key(|&g| self.rank[g]);
        let mut pool: Vec<usize> = fwd.iter().chain(&back).map(|&g| self.rank[g]).collect();
        pool.sort_unstable();
        let moved: Vec<(usize, usize)> = back.iter().chain(&fwd).copied().zip(pool).collect();
        for (g, r) in moved {
            self.set_rank(g, r);
        }
        self.rank[lo]
    }

    /// Ranks every live kernel again in a topological order.
    fn rerank(&mut self) {
        let order: Vec<usize> = self.ordered_ids();
        for (r, g) in order.into_iter().enumerate() {
            self.set_rank(g, r);
        }
    }

    /// Changes a live group's rank, and its place in the rank index of what it reads.
    fn set_rank(&mut self, g: usize, rank: usize) {
        let old = self.rank[g];
        if old == rank {
            return;
        }
        if let Some(group) = &self.groups[g] {
            for &r in &group.cost.reads {
                if let Some(by_rank) = &mut self.readers_by_rank[r] {
                    by_rank.remove(&(old, g));
                    by_rank.insert((rank, g));
                }
            }
        }
        self.rank[g] = rank;
    }

    /// The kernels that compute an inlined node in their bodies.
    fn computing(&self, c: usize) -> Vec<usize> {
        let mut out = self.computing_of[c].clone();
        out.sort_unstable();
        out
    }

    /// The kernels a materialize move replaces, and their new member lists.
    fn materialize_members(&self, c: usize, host: usize) -> Result<MoveParts, (usize, String)> {
        let users = self.computing(c);
        if host != NONE && users.iter().any(|&u| u != host && self.reachable(u, host)) {
            return Err((c, "the kernel that would write it runs after one that reads it".into()));
        }
        let mut remove = users.clone();
        let mut add: Vec<Derived> =
            users.iter().filter(|&&u| u != host).map(|&u| Derived::Reading { user: u, c }).collect();
        if host != NONE && !users.contains(&host) {
            remove.push(host);
        }
        // (Every kernel computing `c` computes all of it: any one tells how.)
        add.push(Derived::Writing { host, c, user: users.first().copied().unwrap_or(NONE) });
        Ok((Some((c, true)), remove, add))
    }

    /// Whether writing `c` from `host` (or from a kernel of its own) closes a cycle. The writer
    /// newly reads `c`'s operands (`reads`), and every kernel that computed `c` will read it from
    /// the writer; so the kernel owning one of those operands must not be, or run after, the
    /// host or one of those kernels. (The host may own one operand and not another: computing
    /// `a == amax(a)` where it writes `a` makes it read `amax(a)`, computed after it.)
    fn materialize_cycles(&self, c: usize, host: usize, reads: &[usize]) -> bool {
        let mut before = self.computing(c);
        if host != NONE {
            before.push(host);
        }
        let owners = reads.iter().map(|&r| self.owner[r]).filter(|&o| o != NONE && o != host);
        owners.collect::<BTreeSet<usize>>().into_iter().any(|o| before.iter().any(|&b| b == o || self.reachable(b, o)))
    }

    /// Whether `to` can be reached from `from` along reads (directly or through other kernels).
    fn reachable(&self, from: usize, to: usize) -> bool {
        self.paths.answer(false, from, to, || self.reads_from(to, from) || self.through_other(from, to))
    }

    /// Whether kernel `to` reads something kernel `from` writes.
    fn reads_from(&self, to: usize, from: usize) -> bool {
        self.groups[to].as_ref().is_some_and(|g| g.cost.reads.iter().any(|&r| self.owner[r] == from))
    }

    /// Whether `to` can be reached from `from` through at least one other kernel. Ranks rise
    /// along every path, so only the kernels ranked between the two are searched, from both
    /// ends at once (what `from` reaches and what reaches `to`, a kernel from each in turn): a
    /// path shows where the two meet, or as an edge into `to` or out of `from`; none, as soon as
    /// either side has nothing left, so the search costs about twice the smaller side, however
    /// large the other (a kernel early in a long program reaches most of what follows it).
    /// Kernels are marked in the scratch space (one stamp per side): no set is allocated.
    fn through_other(&self, from: usize, to: usize) -> bool {
        let (lo, hi) = (self.rank[from], self.rank[to]);
        if lo >= hi {
            return false;
        }
        let mut scratch = self.paths.scratch.borrow_mut();
        let (fwd, bwd) = scratch.stamps(self.groups.len());
        let Scratch { marks, stack, back, .. } = &mut *scratch;
        let between = |g: usize| lo < self.rank[g] && self.rank[g] < hi;
        stack.clear();
        back.clear();
        for &m in self.members(from) {
            for &s in &self.readers_of[m] {
                if s != from && s != to && between(s) && marks[s] != fwd {
                    marks[s] = fwd;
                    stack.push(s);
                }
            }
        }
        let reads = |g: usize| self.groups[g].as_ref().map_or(&[][..], |g| &g.cost.reads[..]);
        for &r in reads(to) {
            let p = self.owner[r];
            if p != NONE && p != from && p != to && between(p) {
                if marks[p] == fwd {
                    return true;
                }
                if marks[p] != bwd {
                    marks[p] = bwd;
                    back.push(p);
                }
            }
        }
        loop {
            // What `from` reaches, one kernel further.
            let Some(g) = stack.pop() else { return false };
            for &m in self.members(g) {
                for &s in &self.readers_of[m] {
                    if s == to || marks[s] == bwd {
                        return true;
                    }
                    if s != g && between(s) && marks[s] != fwd {
                        marks[s] = fwd;
                        stack.push(s);
                    }
                }
            }
            // What reaches `to`, one kernel further.
            let Some(g) = back.pop() else { return false };
            for &r in reads(g) {
                let p = self.owner[r];
                if p == NONE || p == g {
                    continue;
                }
                if p == from || marks[p] == fwd {
                    return true;
                }
                if between(p) && marks[p] != bwd {
                    marks[p] = bwd;
                    back.push(p);
                }
            }
        }
    }

    /// Materialize moves for tensors recomputed by several kernels: written by a kernel that
    /// computes it or one of its operands, or by a kernel of its own. And for transposed views
    /// a kernel reads through more sectors than it uses (`KernelCost::sector_bytes`: an
    /// attention bias strided along the keys): written once in their own layout by a kernel of
    /// their own (a tiled transpose) or by their operand's writer, so that readers read them
    /// contiguous.
    fn materialize_candidates(&self) -> Vec<Move> {
        let mut computed_by: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut strided_views: BTreeSet<usize> = BTreeSet::new();
        for (gid, g) in self.groups.iter().enumerate() {
            let Some(g) = g else { continue };
            for &b in &g.cost.body {
                if !self.mat[b] && self.dag.nodes[b].role == Role::Compute {
                    computed_by.entry(b).or_default().push(gid);
                } else if !self.mat[b]
                    && g.cost.sector_bytes > 0
                    && self.dag.nodes[b].kind() == Some(crate::ir::lang::Kind::Transpose)
                {
                    strided_views.insert(b);
                }
            }
        }
        let mut out = Vec::new();
        for c in strided_views {
            out.push(Move::Materialize(c, NONE));
            out.extend(self.operand_owners(c).into_iter().map(|h| Move::Materialize(c, h)));
        }
        for (c, users) in computed_by {
            let operand_owners = self.operand_owners(c);
            if users.len() < 2 {
                // Computed by one kernel: worth writing only from the kernel that owns its
                // operands, so that the reader reads it instead of them (a 1-bit mask saved by
                // the forward kernel instead of the activation it is computed from).
                out.extend(operand_owners.into_iter().filter(|h| !users.contains(h)).map(|h| Move::Materialize(c, h)));
                continue;
            }
            let mut hosts: BTreeSet<usize> = users.iter().copied().collect();
            hosts.extend(operand_owners);
            out.push(Move::Materialize(c, NONE));
            out.extend(hosts.into_iter().map(|h| Move::Materialize(c, h)));
        }
        out
    }

    /// The kernels that write `c`'s materialized operands.
    fn operand_owners(&self, c: usize) -> BTreeSet<usize> {
        let written = |&ch: &usize| self.mat[ch] && self.owner[ch] != NONE;
        self.dag.nodes[c].children().filter(written).map(|ch| self.owner[ch]).collect()
    }

    /// Greedy fusion, then the best materialize move while one saves time, each followed by
    /// fusion again (a bounded number of rounds).
    ///
    /// Greedy fusion is run twice, as it is and with all recomputation decided before any merge
    /// (a merge made early can hide a cheaper recomputation, e.g. a layernorm backward whose
    /// `dy * xhat` belongs in the gamma-gradient column kernel), and the faster result is kept.
    pub fn optimise_with_materialize(&mut self) {
        self.optimise_with_materialize_from(None, None);
    }

    /// The first half of [`Fusion::optimise_with_materialize`] from the unfused state: greedy
    /// recomputation alone, then greedy fusion with merges (all recomputation decided before any
    /// merge). It depends on nothing but the state, so it may be searched ahead, beside other work.
    pub fn inline_first(&self) -> Fusion<'a> {
        let mut f = self.clone();
        f.greedy(false);
        f.greedy(true);
        f
    }

    /// [`Fusion::optimise_with_materialize`] from the unfused state, given the state greedy
    /// fusion reached from it (kept by an earlier search of the same form: the same state
    /// `optimise` would reach again; where a deadline cut that search, it goes on from there),
    /// and the state [`Fusion::inline_first`] reached from it (searched ahead), when known.
    pub fn optimise_with_materialize_from(&mut self, greedy: Option<FusionParts>, inline_first: Option<FusionParts>) {
        let inline_first = match inline_first {
            Some(parts) => Fusion::from_parts(self.dag, self.profile, parts).with_deadline(self.deadline),
            None => self.inline_first(),
        };
        match greedy {
            Some(parts) => {
                let (deadline, resume) = (self.deadline, parts.cut);
                *self = Fusion::from_parts(self.dag, self.profile, parts).with_deadline(deadline);
                if resume {
                    self.cut = false;
                    self.optimise();
                }
            }
            None => self.optimise(),
        }
        let cut = inline_first.cut;
        if inline_first.better_than(self) {
            *self = inline_first;
        }
        self.cut |= cut;

        for _ in 0..16 {
            if self.deadline.expired() {
                self.cut = true;
                break;
            }
            let best = self
                .materialize_candidates()
                .into_iter()
                .filter_map(|mv| self.propose(mv).ok())
                .filter(|p| improves(p.delta_us, p.delta_bytes))
                .min_by(|a, b| a.delta_us.total_cmp(&b.delta_us).then(a.delta_bytes.cmp(&b.delta_bytes)));
            match best {
                Some(p) => {
                    self.apply(p);
                    self.optimise();
                }
                None => break,
            }
        }
    }

    /// Computed tensors written for another kernel, not outputs: what recomputation could drop
    /// (the values a forward pass saves for its backward), in index order.
    pub fn saved(&self) -> Vec<usize> {
        (0..self.dag.len())
            .filter(|&m| self.mat[m] && self.owner[m] != NONE && self.inlinable(m) && self.is_written(m))
            .collect()
    }

    /// The state with `m` recomputed by every kernel that reads it instead of written (an inline
    /// move), or why no template can run the kernels that would then compute it.
    pub fn recomputed(&self, m: usize) -> Result<Fusion<'a>, String> {
        if !(self.mat[m] && self.owner[m] != NONE && self.inlinable(m)) {
            return Err("not a computed tensor written by a kernel".into());
        }
        let p = self.propose(Move::Inline(m)).map_err(|(_, why)| why)?;
        let mut next = self.clone();
        next.apply(p);
        Ok(next)
    }

    /// The kernels of the state in execution order, each as (reads, written members).
    pub fn kernel_io(&self) -> Vec<(Vec<usize>, Vec<usize>)> {
        self.ordered()
            .into_iter()
            .map(|g| (g.cost.reads.clone(), g.members.iter().copied().filter(|&m| self.is_written(m)).collect()))
            .collect()
    }

    fn members(&self, g: usize) -> &[usize] {
        self.groups[g].as_ref().map_or(&[], |g| &g.members)
    }

    fn first_member(&self, g: usize) -> usize {
        self.members(g).first().copied().unwrap_or(0)
    }

    /// Groups that read something `g` owns.
    fn successors(&self, g: usize) -> Vec<usize> {
        let mut out: Vec<usize> =
            self.members(g).iter().flat_map(|&m| self.readers_of[m].iter().copied()).filter(|&s| s != g).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Groups that own something `g` reads.
    fn predecessors(&self, g: usize) -> Vec<usize> {
        let reads = self.groups[g].as_ref().map_or(&[][..], |g| &g.cost.reads[..]);
        let mut out: Vec<usize> = reads.iter().map(|&r| self.owner[r]).filter(|&o| o != NONE && o != g).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether `to` is reachable from `from` through at least one other group.
    fn path_through_other(&self, from: usize, to: usize) -> bool {
        // (Ranks rise along every path.)
        if self.rank[from] > self.rank[to] {
            return false;
        }
        self.paths.answer(true, from, to, || self.through_other(from, to))
    }

    /// The live groups in an execution order (producers first; ties by smallest member).
    pub fn ordered(&self) -> Vec<&Group> {
        self.ordered_ids().into_iter().map(|g| self.groups[g].as_ref().expect("live")).collect()
    }

    /// The ids of [`Fusion::ordered`]'s groups.
    fn ordered_ids(&self) -> Vec<usize> {
        let live: Vec<usize> = (0..self.groups.len()).filter(|&g| self.groups[g].is_some()).collect();
        let mut indeg: Vec<usize> = vec![0; self.groups.len()];
        let mut succ: Vec<Vec<usize>> = vec![Vec::new(); self.groups.len()];
        for &g in &live {
            let s = self.successors(g);
            for &t in &s {
                indeg[t] += 1;
            }
            succ[g] = s;
        }
        let mut ready: BTreeSet<(usize, usize)> =
            live.iter().filter(|&&g| indeg[g] == 0).map(|&g| (self.first_member(g), g)).collect();
        let mut out = Vec::with_capacity(live.len());
        while let Some((_, g)) = ready.pop_first() {
            out.push(g);
            for &t in &succ[g] {
                indeg[t] -= 1;
                if indeg[t] == 0 {
                    ready.insert((self.first_member(t), t));
                }
            }
        }
        // A cycle would leave its kernels (and all after them) out of the plan.
        debug_assert_eq!(out.len(), live.len(), "the kernels of a fusion state form a cycle");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::program::Program;
    use crate::ir::types::{DType, TensorType};

    fn programs() -> Vec<Program> {
        let f = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
        vec![
            Program::from_sexprs(
                "a",
                &[("x", f(&[64, 32])), ("y", f(&[64, 32])), ("g", f(&[32]))],
                &[("o", "(layernorm (+ x y) g g 0.001)"), ("p", "(sum (* (+ x y) 2) 0)"), ("q", "(exp (+ x y))")],
            )
            .unwrap(),
            Program::from_sexprs(
                "b",
                &[("x", f(&[128, 64])), ("w", f(&[64, 16]))],
                &[("o", "(softmax (@ (relu x) w) -1)"), ("p", "(amax (relu x) 0)")],
            )
            .unwrap(),
        ]
    }

    /// Every kernel is ranked below the kernels that read from it, and the rank-bounded cycle
    /// test agrees with a search of everything downstream.
    fn assert_ranks_topological(f: &Fusion) {
        let live: Vec<usize> = (0..f.groups.len()).filter(|&g| f.groups[g].is_some()).collect();
        for &g in &live {
            for s in f.successors(g) {
                assert!(f.rank[g] < f.rank[s], "kernel {g} (rank {}) feeds {s} (rank {})", f.rank[g], f.rank[s]);
            }
        }
        let unbounded = |from: usize, to: usize| {
            let mut seen = BTreeSet::new();
            let mut stack: Vec<usize> = f.successors(from).into_iter().filter(|&s| s != to).collect();
            while let Some(x) = stack.pop() {
                if x == to {
                    return true;
                }
                if seen.insert(x) {
                    stack.extend(f.successors(x));
                }
            }
            false
        };
        for &a in &live {
            for &b in &live {
                if a != b {
                    assert_eq!(f.path_through_other(a, b), unbounded(a, b), "path from {a} to {b}");
                    let direct = f.successors(a).contains(&b);
                    assert_eq!(f.reachable(a, b), direct || unbounded(a, b), "reads from {a} to {b}");
                }
            }
        }
    }

    /// A chain of `n` bindings with skip connections, `t_i = f(t_(i-1)) * y + t_(i-7)`.
    fn skip_chain(n: usize) -> Program {
        let mut text = "dim R = 4096\ndim C = 1024\ninput x: f32[R, C]\ninput y: f32[R, C]\n".to_string();
        let name = |j: isize| if j < 1 { "x".to_string() } else { format!("t{j}") };
        for i in 1..=n as isize {
            let f = ["exp", "tanh", "sigmoid"][i as usize % 3];
            text += &format!("t{i} = {f}({}) * y + {}\n", name(i - 1), name(i - 7));
        }
        text += &format!("output {}\n", name(n as isize));
        crate::frontend::parse::parse_program("chain.eqf", &text, &[]).unwrap()
    }

    /// The analyses and cycle tests a search keeps answer as fresh ones do (unit tests check
    /// every answer reused against a fresh one, in `Analysed::kernel` and `Paths::answer`),
    /// through whole searches (greedy fusion, recomputation first, materialize rounds), and the
    /// state a search ends in predicts what its kernels analysed afresh predict.
    #[test]
    fn kept_answers_hold_through_whole_searches() {
        let profile = DeviceProfile::load("h100").unwrap();
        let mut programs = programs();
        programs.push(skip_chain(200));
        // (Forward and backward, where merges join paths between kernels tested before.)
        for (name, dims) in [
            ("transformer_block_grad", &[("B", 2), ("S", 8), ("E", 12), ("H", 3), ("Dh", 4), ("F", 16)][..]),
            ("transformer_block_grad", &[][..]),
            ("mlp_relu_dropout_grad", &[][..]),
        ] {
            let dims: Vec<(String, usize)> = dims.iter().map(|&(d, v)| (d.to_string(), v)).collect();
            let path = format!("examples/{name}.eqf");
            let p = crate::frontend::parse::load_program(&path, &dims).unwrap();
            programs.push(crate::autodiff::expand::expand_for_planning(&p, false).unwrap().unwrap_or(p));
        }
        for p in programs {
            let dag = Dag::from_program(&p);
            let mut f = Fusion::unfused(&dag, &profile);
            f.optimise_with_materialize();
            assert!(f.moves > 0, "{}: no move", p.source);
            for g in f.groups.iter().flatten() {
                let fresh = analyse(&dag, &g.members, &|x| f.mat[x], &profile).unwrap();
                assert_eq!(g.cost, fresh, "{}: kernel of {:?}", p.source, g.members);
            }
            assert_ranks_topological(&f);
        }
    }

    /// Every move's predicted change equals the change of the recomputed total once applied.
    #[test]
    fn move_deltas_match_the_recomputed_total() {
        let profile = DeviceProfile::load("h100").unwrap();
        for p in programs() {
            let dag = Dag::from_program(&p);
            let mut f = Fusion::unfused(&dag, &profile);
            for round in 0..6 {
                let mut moves = f.candidates();
                moves.extend(f.materialize_candidates());
                let mut applied = false;
                for mv in moves {
                    let Ok(prop) = f.propose(mv) else { continue };
                    let mut g = f.clone();
                    let before = g.total_us();
                    let bytes_before = g.total_bytes() as i64;
                    let delta = prop.delta_us;
                    let delta_bytes = prop.delta_bytes;
                    g.apply(prop);
                    assert_ranks_topological(&g);
                    let after = g.total_us();
                    assert_eq!(g.total_bytes() as i64 - bytes_before, delta_bytes, "{}: {mv:?} bytes", p.source);
                    assert!(
                        (after - before - delta).abs() < 1e-6,
                        "{}: {mv:?} predicted {delta}, got {}",
                        p.source,
                        after - before
                    );
                    if !applied && delta < 0.0 {
                        f = g;
                        applied = true;
                    }
                }
                if !applied {
                    assert!(round > 0, "no improving move from the unfused state");
                    break;
                }
            }
        }
    }
}
