//! The attention decoder's step in plain Rust over contiguous `f32` rows: the CPU
//! implementation of [`super::DecoderStepBackend`] for flex.
//!
//! Work is split by instance: an instance's S rows read its keys, and its gradient rows
//! for the keys are written by those S rows alone, so instances run in parallel (rayon)
//! without atomics and every sum is taken in the same order on any number of threads.
//!
//! Layouts (row-major, contiguous): query `[B, S, d]`; glimpse keys and values
//! `[B, N, H, dk]` (node n's d values, head-major); logit keys `[B, N, d]`; the same three
//! by feature, `[B, 3d, Np]` (glimpse keys, logit keys, values; Np = N rounded up to a
//! multiple of 8, zero beyond N); mask `[R, N]` (non-zero = masked); R = B × S.
//!
//! A product of one row against every node reads the by-feature layout: `d` vector
//! updates of `Np` lanes, with no horizontal sums. The model makes it once per decode;
//! transposed here at every step it cost as much as a row's own arithmetic with one row
//! per instance (greedy decoding), and doubled the step's memory traffic.
//!
//! An instance's rows (its POMO starts) go through the products in blocks of
//! [`MulAdd::ROW_BLOCK`] (4 under AVX2, 8 under AVX-512): alone, a row keeps two or three
//! vectors of sums in flight and each multiply-add waits on the one before; a block's rows
//! share every key vector loaded and keep 8 (AVX2) or 12 to 16 (AVX-512). Each output is still
//! summed in the same order, so the block size changes no number. The forms are picked
//! per instance ([`simd_dispatch`]).
//!
//! Rows with one node open (finished tours, forced returns to the depot) are left out of
//! both passes: their outputs are known exactly ([`forced`]).
//!
//! A multi-start decode reads its compatibilities from tables ([`CompatTables`]) made
//! once a decode, and its backward pass gives the tables' gradient in place of the
//! queries' and keys': two of the step's N · d products a row in the forward pass
//! (the compatibilities, and their recomputation where the attention weights are not
//! kept) and two in the backward (the query and key gradients) become 2 H · N operations.

mod forced;

use rayon::prelude::*;

use crate::ops::row_kernels::{
    heads_fit, kept_exp_sum, kept_max, masked_softmax_rows, open_nodes_of_any, padded,
    rows_in_block, rows_open_at_any, simd_dispatch, unwritten, weighted_sums, MulAdd, RowsAt,
    MAX_ROW_BLOCK,
};

/// Sizes of one step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) instances: usize,
    pub(crate) starts: usize,
    pub(crate) nodes: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
}

impl Dims {
    fn embed(&self) -> usize {
        self.heads * self.head_dim
    }

    fn rows(&self) -> usize {
        self.instances * self.starts
    }
}

/// The step's scalars: the logits are `clip · tanh(·) / temperature`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    pub(crate) tanh_clipping: f32,
    pub(crate) temperature: f32,
}

impl Scale {
    pub(crate) fn new(tanh_clipping: f32, temperature: f32) -> Self {
        Self {
            tanh_clipping,
            temperature,
        }
    }
}

/// The forward pass's inputs.
pub(crate) struct Inputs<'a> {
    /// `[B, S, d]`; empty where `compat` is given: the tables stand in for the queries,
    /// in both passes.
    pub(crate) query: &'a [f32],
    pub(crate) glimpse_keys: &'a [f32],
    pub(crate) glimpse_values: &'a [f32],
    pub(crate) logit_keys: &'a [f32],
    /// `[B, 3d, Np]`
    pub(crate) by_feature: &'a [f32],
    pub(crate) mask: &'a [u8],
    /// Where given, the compatibilities come from these tables instead of the queries'
    /// products with the keys ([`CompatTables`]).
    pub(crate) compat: Option<CompatTables<'a>>,
}

impl<'a> Inputs<'a> {
    /// Rows `r..r + count`'s queries `[count, d]`; none where the compatibilities come
    /// from tables.
    fn query_rows(&self, r: usize, count: usize, d: usize) -> &'a [f32] {
        match self.compat {
            Some(_) => &[],
            None => &self.query[r * d..(r + count) * d],
        }
    }

    /// The width of a row's query gradient: d, or 0 where the compatibilities come from
    /// tables (their gradient carries the queries' and the keys', which the backward
    /// pass then neither writes nor returns).
    fn query_grad_width(&self, dims: Dims) -> usize {
        match self.compat {
            Some(_) => 0,
            None => dims.embed(),
        }
    }
}

/// Every compatibility a multi-start decode can meet, made once per decode.
///
/// A row's query is its instance's fixed context + its node's context row + its remaining
/// capacity fraction · the capacity's weight row, so its compatibility with node j in head
/// h is linear in those: `(fixed + node ℓ) · key(j, h) + remaining · (capacity · key(j, h))`.
/// The first term is one of N rows of a table per instance and the second one row more;
/// both are made once (N² · d multiply-adds an instance), where every step's rows took
/// N · d each (an instance's S rows, ~1.3 N steps: S · 1.3 · N² · d). A row's
/// compatibilities are then its node's row of the table plus its remaining capacity times
/// the last row, 2 H · N operations where the product was N · d.
#[derive(Clone, Copy)]
pub(crate) struct CompatTables<'a> {
    /// `[B, (N + 1) · H, Np]`: instance i's row ℓ · H + h is `(fixed + node ℓ)` against
    /// head h's keys of every node, row N · H + h the capacity row against them (keys
    /// already divided by √dk; zero past N).
    pub(crate) tables: &'a [f32],
    /// `[R]` the node each row stands at, within its instance.
    pub(crate) last_node: &'a [usize],
    /// `[R]` each row's remaining capacity fraction.
    pub(crate) remaining: &'a [f32],
}

/// Where a block of rows' compatibilities come from: `[R, d]` queries against the keys by
/// feature (`[H·dk, Np]`), or the instance's compatibility table (`[(N + 1)·H, Np]`) at
/// each row's node and remaining capacity fraction.
#[derive(Clone, Copy)]
enum CompatIn<'a> {
    Products {
        query: &'a [f32],
        keys_t: &'a [f32],
    },
    Tables {
        table: &'a [f32],
        rows: [(usize, f32); MAX_ROW_BLOCK],
    },
}

impl<'a> CompatIn<'a> {
    /// A block's source from the batch's rows `at + r` (r in `rows`) of instance `i`,
    /// where it has tables; else from `query`, the block's queries.
    fn of(
        x: &Inputs<'a>,
        dims: Dims,
        (i, at, rows): (usize, usize, &[usize]),
        query: &'a [f32],
    ) -> Self {
        let n = dims.nodes;
        match &x.compat {
            Some(c) => {
                let len = table_len(dims);
                let mut block = [(0, 0.0); MAX_ROW_BLOCK];
                for (slot, &r) in block.iter_mut().zip(rows) {
                    *slot = (c.last_node[at + r], c.remaining[at + r]);
                }
                Self::Tables {
                    table: &c.tables[i * len..(i + 1) * len],
                    rows: block,
                }
            }
            None => Self::Products {
                query,
                keys_t: &by_feature_block(x, dims, i)[..dims.embed() * padded(n)],
            },
        }
    }
}

/// What the forward pass computes, kept for the backward pass.
///
/// Kept for the rows the kernels run alone (not forced, [`forced`]): each piece of
/// `piece_rows` rows of an instance keeps its live rows' values packed, in row order, at
/// the front of its rows; the rest is unwritten. The forward pass so writes them in place
/// whatever rows are forced between them, and the backward pass reads them in place where
/// it runs every live row (scattered and gathered row by row, they were ~6% of a POMO
/// CVRP50 step's samples; the step gained ~2%, its first reads of them now waiting on
/// memory where the copies did).
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    /// `[R, H, N]` each head's attention weights (0 at masked nodes), where
    /// [`keeps_attention`]; otherwise the backward pass recomputes them
    /// ([`recompute_attention`]).
    pub(crate) attention: Option<Vec<f32>>,
    /// `[R, d]` the heads' concatenated outputs.
    pub(crate) glimpse: Vec<f32>,
    /// `[R, N]` tanh of the raw logits.
    pub(crate) tanh: Vec<f32>,
    /// `[R]` the log of the sum of the exponentials of the clipped logits over the nodes
    /// the row may choose: its log-probabilities are `clipped(tanh) − log_sum` there, as
    /// the forward pass computed them (so the backward pass gets their bits without
    /// keeping them: a quarter of a POMO CVRP100 decode's kept memory).
    pub(crate) log_sum: Vec<f32>,
    /// The rows of a piece (an instance's last may have fewer).
    pub(crate) piece_rows: usize,
}

/// Gradients of the four float inputs, in their layouts, and of the compatibility
/// tables where the step reads them. With tables the queries and keys reach the
/// compatibilities only through them: their gradients here are empty (nothing reads
/// them; written as zeros, they were ~7 MB a CVRP100 step), and the tables' (summed over
/// a decode's steps) carry them, paid once a decode. Those added to sums
/// ([`backward_adding`]) are empty here.
pub(crate) struct Grads {
    pub(crate) query: Vec<f32>,
    pub(crate) glimpse_keys: Vec<f32>,
    pub(crate) glimpse_values: Vec<f32>,
    pub(crate) logit_keys: Vec<f32>,
    /// `[B, (N + 1)·H, Np]` where the step has [`CompatTables`], else empty.
    pub(crate) compat_tables: Vec<f32>,
}

/// One instance's compatibility table's length, `(N + 1)·H·Np`.
fn table_len(dims: Dims) -> usize {
    (dims.nodes + 1) * dims.heads * padded(dims.nodes)
}

/// tanh on whole 8-lane chunks through [`MulAdd::exp_chunks`]: 1 − 2 / (e^{2x} + 1).
/// Absolute error ~1e-7 (relative error grows as |x| → 0, where tanh does: the logits
/// are `clip · tanh`, so it is the absolute error that reaches them).
#[inline(always)]
fn tanh_chunks<M: MulAdd>(x: &mut [f32]) {
    for chunk in x.chunks_exact_mut(8) {
        for v in chunk {
            *v *= 2.0;
        }
    }
    M::exp_chunks(x);
    for chunk in x.chunks_exact_mut(8) {
        for v in chunk {
            *v = 1.0 - 2.0 / (*v + 1.0);
        }
    }
}

/// One instance's by-feature block: `[3d, Np]`, glimpse keys, logit keys, values.
fn by_feature_block<'a>(x: &Inputs<'a>, dims: Dims, instance: usize) -> &'a [f32] {
    let len = 3 * dims.embed() * padded(dims.nodes);
    &x.by_feature[instance * len..(instance + 1) * len]
}

/// Log-probabilities `[R, N]` (−∞ at masked nodes) and what the backward pass needs.
pub(crate) fn forward(dims: Dims, scale: Scale, x: &Inputs) -> (Vec<f32>, Saved) {
    let pieces = Pieces::for_threads(dims);
    let (log_probs, saved) = forward_with(dims, scale, x, pieces, forward_piece_dispatch);
    (log_probs, saved.expect("kept"))
}

/// Log-probabilities `[R, N]` alone, for a decode without gradients: nothing is kept
/// (a multi-start CVRP1000 decode would otherwise write ~300 MB a step it never reads).
pub(crate) fn log_probs(dims: Dims, scale: Scale, x: &Inputs) -> Vec<f32> {
    let pieces = Pieces {
        keep: false,
        ..Pieces::for_threads(dims)
    };
    forward_with(dims, scale, x, pieces, forward_piece_dispatch).0
}

/// Log-probabilities `[S, N]` of one instance's rows (`dims.instances` = 1), on this thread,
/// and with `keep` what the backward pass needs (`keep` says whether the attention weights
/// are among it): one unit of [`forward`]'s, for a decode that runs each instance's steps
/// one after another ([`super::flex_decode`]). The same numbers as [`forward`]'s rows.
pub(super) fn forward_alone(
    dims: Dims,
    scale: Scale,
    x: &Inputs,
    keep: Option<bool>,
) -> (Vec<f32>, Option<Saved>) {
    debug_assert_eq!(dims.instances, 1);
    let (n, h, d, rows) = (dims.nodes, dims.heads, dims.embed(), dims.rows());
    let mut log_probs = unwritten(rows * n);
    let mut saved = keep.map(|keep_attention| Saved {
        attention: keep_attention.then(|| unwritten(rows * h * n)),
        glimpse: unwritten(rows * d),
        tanh: unwritten(rows * n),
        log_sum: unwritten(rows),
        piece_rows: rows,
    });
    let out = PieceOut {
        log_probs: &mut log_probs,
        kept: saved.as_mut().map(KeptOut::all),
    };
    forced::forward_unit(dims, scale, (x, 0, 0), out, forward_piece_dispatch);
    (log_probs, saved)
}

/// How the forward pass splits its rows: pieces of at most `rows` rows of one instance,
/// whether it keeps what the backward pass needs, and whether the attention weights are
/// among it. Rows are independent in the forward pass, so the split changes no number; an
/// instance's rows are split only when there are too few instances to keep every thread
/// busy (one large instance's starts).
#[derive(Debug, Clone, Copy)]
struct Pieces {
    rows: usize,
    keep: bool,
    keep_attention: bool,
}

impl Pieces {
    fn for_threads(dims: Dims) -> Self {
        let wanted = 4 * rayon::current_num_threads();
        let per_instance = wanted.div_ceil(dims.instances.max(1));
        let rows = dims
            .starts
            .div_ceil(per_instance)
            .next_multiple_of(MAX_ROW_BLOCK);
        Self {
            rows,
            keep: true,
            keep_attention: keeps_attention(dims),
        }
    }
}

/// A decode's worth of attention weights the forward pass keeps at most: 32 MiB.
const KEPT_ATTENTION_BYTES: usize = 32 << 20;

/// Whether the forward pass keeps the attention weights for the backward pass: when a
/// decode of about N steps would keep at most [`KEPT_ATTENTION_BYTES`] of them. They
/// were two thirds of what a training decode kept (4.8 GB of a POMO CVRP100 step's
/// peak); recomputed, they cost one of the forward pass's three products (with
/// [`CompatTables`], a lookup) and its softmaxes again. Keeping them is a few per cent
/// faster at n = 20 (POMO, batch 64 in two shards: 9 MB a decode; 0.060-0.066 s a step
/// against 0.062-0.071); at n = 40 and 50 (69 and 133 MB a decode), and at n = 20 with
/// batch 512 (72 MB), writing them out and reading them back cost as much as the
/// softmaxes again or more, and recomputing them took 23-47% off the step's peak memory.
pub(super) fn keeps_attention(dims: Dims) -> bool {
    let per_step = dims.rows() * dims.heads * dims.nodes;
    per_step.saturating_mul(dims.nodes).saturating_mul(4) <= KEPT_ATTENTION_BYTES
}

/// One piece's forward pass: [`forward_piece`] in some form.
type ForwardPiece = fn(Dims, Scale, (&Inputs, usize, usize), PieceOut, &[usize]);

/// The forward pass with each piece of rows in `piece_kernel` (the tests pick each form
/// and each split).
fn forward_with(
    dims: Dims,
    scale: Scale,
    x: &Inputs,
    pieces: Pieces,
    piece_kernel: ForwardPiece,
) -> (Vec<f32>, Option<Saved>) {
    let (n, h, d, s) = (dims.nodes, dims.heads, dims.embed(), dims.starts);
    // Every log-probability is written (a forced row's by `forced::forward_unit`), and
    // a piece's first kept rows, one for each row the kernels run ([`Saved`]); the rest
    // are never read.
    let mut log_probs = unwritten(dims.rows() * n);
    let mut saved = pieces.keep.then(|| Saved {
        attention: (pieces.keep_attention).then(|| unwritten(dims.rows() * h * n)),
        glimpse: unwritten(dims.rows() * d),
        tanh: unwritten(dims.rows() * n),
        log_sum: unwritten(dims.rows()),
        piece_rows: pieces.rows,
    });
    // (instance, first row within it, outputs): cut in order, then run in parallel.
    let mut uncut = PieceOut {
        log_probs: &mut log_probs,
        kept: saved.as_mut().map(KeptOut::all),
    };
    let mut units = Vec::new();
    for i in 0..dims.instances {
        for first in (0..s).step_by(pieces.rows) {
            let rows = pieces.rows.min(s - first);
            units.push((i, first, uncut.cut_front(rows, dims)));
        }
    }
    units.into_par_iter().for_each(|(i, first, out)| {
        forced::forward_unit(dims, scale, (x, i, first), out, piece_kernel);
    });
    (log_probs, saved)
}

/// A piece's kept outputs, each `[rows, ·]` ([`Saved`]).
struct KeptOut<'a> {
    glimpse: &'a mut [f32],
    tanh: &'a mut [f32],
    log_sum: &'a mut [f32],
    attention: Option<&'a mut [f32]>,
}

impl<'a> KeptOut<'a> {
    /// All of `saved`.
    fn all(saved: &'a mut Saved) -> Self {
        Self {
            glimpse: &mut saved.glimpse,
            tanh: &mut saved.tanh,
            log_sum: &mut saved.log_sum,
            attention: saved.attention.as_deref_mut(),
        }
    }

    /// The first `rows` rows, cut off the front of these.
    fn cut_front(&mut self, rows: usize, dims: Dims) -> KeptOut<'a> {
        let (n, h, d) = (dims.nodes, dims.heads, dims.embed());
        KeptOut {
            glimpse: cut_front(&mut self.glimpse, rows * d),
            tanh: cut_front(&mut self.tanh, rows * n),
            log_sum: cut_front(&mut self.log_sum, rows),
            attention: self.attention.as_mut().map(|a| cut_front(a, rows * h * n)),
        }
    }

    /// The same outputs, borrowed for a shorter while.
    fn reborrow(&mut self) -> KeptOut<'_> {
        KeptOut {
            glimpse: self.glimpse,
            tanh: self.tanh,
            log_sum: self.log_sum,
            attention: self.attention.as_deref_mut(),
        }
    }
}

/// A piece's outputs, each `[rows, ·]`: the log-probabilities, and what the backward
/// pass needs when it is kept.
struct PieceOut<'a> {
    log_probs: &'a mut [f32],
    kept: Option<KeptOut<'a>>,
}

impl<'a> PieceOut<'a> {
    /// The outputs of the first `rows` rows, cut off the front of these.
    fn cut_front(&mut self, rows: usize, dims: Dims) -> PieceOut<'a> {
        PieceOut {
            log_probs: cut_front(&mut self.log_probs, rows * dims.nodes),
            kept: self.kept.as_mut().map(|kept| kept.cut_front(rows, dims)),
        }
    }
}

/// The first `len` values of `slice`, which keeps the rest.
fn cut_front<'a>(slice: &mut &'a mut [f32], len: usize) -> &'a mut [f32] {
    let (front, rest) = std::mem::take(slice).split_at_mut(len);
    *slice = rest;
    front
}

simd_dispatch! {
    /// [`forward_piece`] in the best form the CPU allows.
    fn forward_piece_dispatch => forward_piece(
        dims: Dims,
        scale: Scale,
        x: (&Inputs, usize, usize),
        out: PieceOut,
        live: &[usize],
    )
}

/// A block's working memory: two `[MAX_ROW_BLOCK, Np]` lane blocks (the rows' lanes and
/// which nodes each may choose), and its rows' inputs and outputs where they are not read
/// and written in place: the outputs a piece does not keep, and the inputs and
/// log-probabilities of a block whose rows are not consecutive (forced rows between them).
struct BlockScratch {
    /// The sizes `(N, H, d)` it was made for.
    sizes: (usize, usize, usize),
    lanes: Vec<f32>,
    /// The nodes some row of the block may choose ([`open_nodes_of_any`]).
    open: Vec<u32>,
    /// `[MAX_ROW_BLOCK, d]` queries and `[MAX_ROW_BLOCK, N]` masks, gathered.
    query: Vec<f32>,
    mask: Vec<u8>,
    outputs: BlockOut,
}

/// One block's outputs, each `[MAX_ROW_BLOCK, ·]`.
struct BlockOut {
    log_probs: Vec<f32>,
    attention: Vec<f32>,
    glimpse: Vec<f32>,
    tanh: Vec<f32>,
    log_sum: Vec<f32>,
}

impl BlockScratch {
    fn new(dims: Dims) -> Self {
        let (n, h, d) = (dims.nodes, dims.heads, dims.embed());
        let rows = |len: usize| vec![0.0; MAX_ROW_BLOCK * len];
        Self {
            sizes: (n, h, d),
            lanes: vec![0.0; 2 * MAX_ROW_BLOCK * padded(n)],
            open: Vec::with_capacity(n),
            query: rows(d),
            mask: vec![0; MAX_ROW_BLOCK * n],
            outputs: BlockOut {
                log_probs: rows(n),
                attention: rows(h * n),
                glimpse: rows(d),
                tanh: rows(n),
                log_sum: rows(1),
            },
        }
    }
}

thread_local! {
    /// Each thread's block working memory, kept from one piece to the next: a decode on
    /// flex runs a piece per instance and step, and allocating and zeroing it for each
    /// was ~3% of a POMO CVRP50 step.
    static BLOCK_SCRATCH: std::cell::Cell<Option<BlockScratch>> =
        const { std::cell::Cell::new(None) };
}

impl BlockScratch {
    /// This thread's working memory for `dims`, made where it has none of their sizes;
    /// [`BlockScratch::put_back`] keeps it for the thread's next piece. (Taken and put
    /// back rather than lent to a closure: a closure is compiled without its caller's
    /// AVX-512.) Every value a block reads of it is written first.
    fn take(dims: Dims) -> Self {
        let sizes = (dims.nodes, dims.heads, dims.embed());
        let kept = BLOCK_SCRATCH
            .take()
            .filter(|scratch| scratch.sizes == sizes);
        #[allow(unused_mut)]
        let mut scratch = kept.unwrap_or_else(|| Self::new(dims));
        #[cfg(test)]
        {
            let BlockOut {
                log_probs,
                attention,
                glimpse,
                tanh,
                log_sum,
            } = &mut scratch.outputs;
            let query = &mut scratch.query;
            poison(&mut [
                &mut scratch.lanes,
                query,
                log_probs,
                attention,
                glimpse,
                tanh,
                log_sum,
            ]);
            scratch.mask.fill(0x5a);
        }
        scratch
    }

    fn put_back(self) {
        BLOCK_SCRATCH.set(Some(self));
    }
}

/// The piece's rows `live` (ascending, within the piece; the others are left as `out`
/// has them) of instance `i`, from its row `first`, in blocks of up to
/// [`MulAdd::ROW_BLOCK`]. What the piece keeps is written in place, packed ([`Saved`]); a
/// block of consecutive rows reads its inputs and writes its log-probabilities in place,
/// any other gathers them into the block's working memory and writes them back.
#[inline(always)]
fn forward_piece<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (x, i, first): (&Inputs, usize, usize),
    out: PieceOut,
    live: &[usize],
) {
    let mut scratch = BlockScratch::take(dims);
    forward_blocks::<M>(dims, scale, (x, i, first), out, live, &mut scratch);
    scratch.put_back();
}

/// [`forward_piece`] in its working memory.
#[inline(always)]
fn forward_blocks<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (x, i, first): (&Inputs, usize, usize),
    mut out: PieceOut,
    live: &[usize],
    scratch: &mut BlockScratch,
) {
    let (n, d) = (dims.nodes, dims.embed());
    let instance = InstanceIn::of(x, dims, i);
    let at = i * dims.starts + first;
    let mut k = 0;
    while k < live.len() {
        let count = rows_in_block::<M>(live.len() - k);
        let (rows, kept) = (&live[k..k + count], k..k + count);
        k += count;
        let BlockScratch {
            lanes,
            open,
            query,
            mask,
            outputs,
            ..
        } = &mut *scratch;
        let in_place = consecutive(rows);
        let (query, mask) = match in_place {
            Some(start) => {
                let r = at + start;
                (x.query_rows(r, count, d), &x.mask[r * n..])
            }
            None => {
                let query = match x.compat {
                    Some(_) => &[][..],
                    None => {
                        gather_rows(x.query, d, at, rows, query);
                        &query[..count * d]
                    }
                };
                gather_rows(x.mask, n, at, rows, mask);
                (query, &mask[..])
            }
        };
        let rows_out = out.block(kept, in_place, dims, outputs);
        let compat = CompatIn::of(x, dims, (i, at, rows), query);
        let x = (compat, &mask[..count * n], &instance);
        match count {
            8 => forward_rows::<M, 8>(dims, scale, x, rows_out, (lanes, open)),
            4 => forward_rows::<M, 4>(dims, scale, x, rows_out, (lanes, open)),
            2 => forward_rows::<M, 2>(dims, scale, x, rows_out, (lanes, open)),
            _ => forward_rows::<M, 1>(dims, scale, x, rows_out, (lanes, open)),
        }
        if in_place.is_none() {
            scatter_rows(&outputs.log_probs, n, rows, out.log_probs);
        }
    }
}

/// `rows` (ascending) as `first..first + len` when they are consecutive.
fn consecutive(rows: &[usize]) -> Option<usize> {
    let (&first, &last) = (rows.first()?, rows.last()?);
    (last - first + 1 == rows.len()).then_some(first)
}

/// Rows `at + r` (r in `rows`) of a `[R, width]` table into the front of `into`.
fn gather_rows<T: Copy>(table: &[T], width: usize, at: usize, rows: &[usize], into: &mut [T]) {
    for (j, &r) in rows.iter().enumerate() {
        into[j * width..][..width].copy_from_slice(&table[(at + r) * width..][..width]);
    }
}

impl PieceOut<'_> {
    /// The same outputs, borrowed for a shorter while.
    fn reborrow(&mut self) -> PieceOut<'_> {
        PieceOut {
            log_probs: self.log_probs,
            kept: self.kept.as_mut().map(KeptOut::reborrow),
        }
    }

    /// The outputs of a block of the piece's rows: what it keeps of them at its kept rows
    /// `kept` ([`Saved`]), their log-probabilities at rows `start..` where they are
    /// consecutive (`in_place`), the rest in `block`.
    fn block<'s>(
        &'s mut self,
        kept: std::ops::Range<usize>,
        in_place: Option<usize>,
        dims: Dims,
        block: &'s mut BlockOut,
    ) -> RowsOut<'s> {
        let (n, h, d, count) = (dims.nodes, dims.heads, dims.embed(), kept.len());
        let (glimpse, tanh, log_sum, attention) = match &mut self.kept {
            Some(all) => (
                &mut all.glimpse[kept.start * d..kept.end * d],
                &mut all.tanh[kept.start * n..kept.end * n],
                &mut all.log_sum[kept.clone()],
                all.attention.as_deref_mut(),
            ),
            None => (
                &mut block.glimpse[..count * d],
                &mut block.tanh[..count * n],
                &mut block.log_sum[..count],
                None,
            ),
        };
        let attention = match attention {
            Some(all) => &mut all[kept.start * h * n..kept.end * h * n],
            None => &mut block.attention[..count * h * n],
        };
        let log_probs = match in_place {
            Some(start) => &mut self.log_probs[start * n..(start + count) * n],
            None => &mut block.log_probs[..count * n],
        };
        RowsOut {
            log_probs,
            attention,
            glimpse,
            tanh,
            log_sum,
        }
    }
}

/// Writes the front rows of `gathered` (`[·, width]`) to rows `rows` of `out`.
fn scatter_rows(gathered: &[f32], width: usize, rows: &[usize], out: &mut [f32]) {
    for (j, &r) in rows.iter().enumerate() {
        out[r * width..][..width].copy_from_slice(&gathered[j * width..][..width]);
    }
}

/// What a forward row reads of its instance.
struct InstanceIn<'a> {
    /// `[N, H, dk]`
    values: &'a [f32],
    /// `[d, Np]`
    logit_keys_t: &'a [f32],
}

impl<'a> InstanceIn<'a> {
    fn of(x: &Inputs<'a>, dims: Dims, i: usize) -> Self {
        let (n, d) = (dims.nodes, dims.embed());
        let rest = &by_feature_block(x, dims, i)[d * padded(n)..];
        Self {
            values: &x.glimpse_values[i * n * d..(i + 1) * n * d],
            logit_keys_t: &rest[..d * padded(n)],
        }
    }
}

/// A block's compatibilities' source and masks `[rows, N]`, and their instance.
type RowsIn<'a> = (CompatIn<'a>, &'a [u8], &'a InstanceIn<'a>);

/// Consecutive rows' outputs, each `[rows, ·]`.
struct RowsOut<'a> {
    log_probs: &'a mut [f32],
    attention: &'a mut [f32],
    glimpse: &'a mut [f32],
    tanh: &'a mut [f32],
    log_sum: &'a mut [f32],
}

/// `R` rows' attention weights `[R, H, N]` (0 at masked nodes): each head's softmax of
/// the rows' compatibilities (`compat`) with the nodes the row may choose. `lanes` is two
/// `[MAX_ROW_BLOCK, Np]` blocks; the second is left holding which nodes each row may
/// choose. The backward pass recomputes the weights with this function, so it gets the
/// forward pass's bits.
#[inline(always)]
fn attention_rows<M: MulAdd, const R: usize>(
    dims: Dims,
    (compat, mask): (CompatIn, &[u8]),
    lanes: &mut [f32],
    attention: &mut [f32],
) {
    let (n, h, dk, d) = (dims.nodes, dims.heads, dims.head_dim, dims.embed());
    let np = padded(n);
    let (lanes, keep) = lanes.split_at_mut(MAX_ROW_BLOCK * np);
    for r in 0..R {
        let keep = &mut keep[r * np..(r + 1) * np];
        for (k, &m) in keep.iter_mut().zip(&mask[r * n..(r + 1) * n]) {
            *k = if m == 0 { 1.0 } else { 0.0 };
        }
        keep[n..].fill(0.0);
    }
    for head in 0..h {
        match compat {
            CompatIn::Products { query, keys_t } => {
                let keys = &keys_t[head * dk * np..];
                let lane_rows = RowsAt::contiguous(d, dk, np);
                weighted_sums::<M, R>(&query[head * dk..], keys, (np, np), lane_rows, lanes);
            }
            CompatIn::Tables { table, rows } => {
                let capacity = &table[(n * h + head) * np..][..np];
                for (r, &(node, remaining)) in rows.iter().enumerate().take(R) {
                    let at_node = &table[(node * h + head) * np..][..np];
                    let out = &mut lanes[r * np..(r + 1) * np];
                    for ((z, &t), &c) in out.iter_mut().zip(at_node).zip(capacity) {
                        *z = M::mul_add(remaining, c, t);
                    }
                }
            }
        }
        let attention = &mut attention[head * n..];
        masked_softmax_rows::<M, R>((lanes, keep), np, attention, (n, h * n));
    }
}

/// `R` rows of one instance: the glimpse's products and the logits for all of them at
/// once, the softmaxes row by row.
#[inline(always)]
fn forward_rows<M: MulAdd, const R: usize>(
    dims: Dims,
    scale: Scale,
    (compat, mask, instance): RowsIn,
    out: RowsOut,
    (lanes, open): (&mut [f32], &mut Vec<u32>),
) {
    let (n, h, dk, d) = (dims.nodes, dims.heads, dims.head_dim, dims.embed());
    let np = padded(n);
    attention_rows::<M, R>(dims, (compat, mask), lanes, out.attention);
    // The glimpse: each head's weighted values, over the nodes some row of the block may
    // choose (the others' weights are zero in every row). A row alone takes its heads'
    // together: one head's sums are only dk / 8 vectors, each multiply-add waiting on the
    // one before.
    let nodes = open_nodes_of_any::<R>(mask, n, open);
    if R == 1 && heads_fit(dk) {
        let sizes = (n, h, dk);
        nodes.head_weighted_sums::<M>(out.attention, instance.values, sizes, out.glimpse);
    } else {
        for head in 0..h {
            let by_attention = RowsAt::contiguous(h * n, n, d);
            let values = &instance.values[head * dk..];
            let attention = &out.attention[head * n..];
            let glimpse = &mut out.glimpse[head * dk..];
            let sums = (d, dk);
            nodes.weighted_sums::<M, R>(attention, values, sums, by_attention, glimpse);
        }
    }
    // Single-head logits, clipped, masked, log-softmax, over the padded lanes.
    let (lanes, keep) = lanes.split_at_mut(MAX_ROW_BLOCK * np);
    let lane_rows = RowsAt::contiguous(d, d, np);
    let logit_keys = instance.logit_keys_t;
    weighted_sums::<M, R>(out.glimpse, logit_keys, (np, np), lane_rows, lanes);
    for r in 0..R {
        let row_lanes = &mut lanes[r * np..(r + 1) * np];
        let row_out = (
            &mut out.tanh[r * n..(r + 1) * n],
            &mut out.log_probs[r * n..(r + 1) * n],
        );
        let row_mask = (&mask[r * n..(r + 1) * n], &keep[r * np..(r + 1) * np]);
        out.log_sum[r] = log_softmax_row::<M>(scale, row_lanes, row_mask, row_out);
    }
}

/// A row's logits from its raw products: tanh (kept), clipped, masked, log-softmax;
/// returns the log of the sum of their exponentials (kept: [`Saved::log_sum`]).
#[inline(always)]
fn log_softmax_row<M: MulAdd>(
    scale: Scale,
    lanes: &mut [f32],
    (mask, keep): (&[u8], &[f32]),
    (tanh, log_probs): (&mut [f32], &mut [f32]),
) -> f32 {
    let n = mask.len();
    tanh_chunks::<M>(lanes);
    tanh.copy_from_slice(&lanes[..n]);
    for z in lanes.iter_mut() {
        *z = clipped(*z, scale);
    }
    log_probs.copy_from_slice(&lanes[..n]);
    let max = kept_max::<M>(lanes, keep);
    let log_sum = max + kept_exp_sum::<M>(lanes, max, keep).ln();
    for (lp, &m) in log_probs.iter_mut().zip(mask) {
        *lp = if m == 0 {
            *lp - log_sum
        } else {
            f32::NEG_INFINITY
        };
    }
    log_sum
}

/// `clip · tanh / temperature`, in the order the op-by-op form computes it.
fn clipped(t: f32, scale: Scale) -> f32 {
    let z = t * scale.tanh_clipping;
    if scale.temperature == 1.0 {
        z
    } else {
        z / scale.temperature
    }
}

/// Gradients of every float input from the gradient of the log-probabilities.
///
/// Per instance, rows in blocks of [`MulAdd::ROW_BLOCK`]: each row computes its own query
/// gradient and keeps, in `[S, ·]` tables, the logit and compatibility gradients the
/// instance's key, value and logit-key gradients need; those are then summed over the
/// rows in registers, a block of nodes at a time (each node's coefficients a column of
/// the tables, read in place), and written once per node (no read-modify-write per row),
/// in row order.
pub(crate) fn backward(
    dims: Dims,
    scale: Scale,
    x: &Inputs,
    saved: &Saved,
    grad_out: &[f32],
) -> Grads {
    let from = BackIn { x, saved, grad_out };
    backward_with(dims, scale, &from, backward_instance_dispatch)
}

/// One instance's backward pass: [`backward_instance`] in some form.
type BackwardInstance =
    fn(Dims, Scale, (&BackIn, usize), InstanceGradsOut, &mut BackBuffers, LiveRows);

/// The rows of an instance a backward pass runs (ascending, within the instance), and
/// where the forward pass kept each one's values, within the instance ([`Saved`]).
type LiveRows<'a> = (&'a [usize], &'a [usize]);

/// Sums over a decode's steps of the gradients of what its steps share, `[B, ·]` each in
/// its input's layout, to which [`backward_adding`] adds this step's in place where one is
/// given. Autodiff would take each step's in a fresh buffer and add the sum into it: at
/// CVRP100, ~28 MB a step allocated, written out and read back (~6% of a POMO step, the
/// compatibility tables' most), where here each instance's stays in cache.
#[derive(Default)]
pub(crate) struct StepSums<'a> {
    pub(crate) glimpse_keys: Option<&'a mut [f32]>,
    pub(crate) glimpse_values: Option<&'a mut [f32]>,
    pub(crate) logit_keys: Option<&'a mut [f32]>,
    pub(crate) compat_tables: Option<&'a mut [f32]>,
}

/// [`backward`], with the gradients `sums` holds added to them ([`StepSums`]); those come
/// back empty in the [`Grads`].
pub(crate) fn backward_adding(
    dims: Dims,
    scale: Scale,
    (x, saved): (&Inputs, &Saved),
    grad_out: &[f32],
    sums: StepSums,
) -> Grads {
    let from = BackIn { x, saved, grad_out };
    backward_into(dims, scale, &from, backward_instance_dispatch, sums)
}

/// One thread's working memory for [`backward_instance_step`].
#[derive(Default)]
pub(super) struct InstanceWork {
    buffers: BackBuffers,
    own: OwnGrads,
}

/// One step of one instance (`dims.instances` = 1, with compatibility tables) in a decode's
/// backward pass that runs each instance's steps one after another, last first
/// ([`super::flex_decode`]): its gradients of the glimpse values, logit keys and table
/// written to `[dv, dl, dt]` (the instance's blocks), or with `adding` added to them, as
/// [`backward_adding`] writes and adds a step's (the same bits).
pub(super) fn backward_instance_step(
    dims: Dims,
    scale: Scale,
    (x, saved, grad_out): (&Inputs, &Saved, &[f32]),
    [dv, dl, dt]: [&mut [f32]; 3],
    adding: bool,
    work: &mut InstanceWork,
) {
    debug_assert!(dims.instances == 1 && x.compat.is_some());
    let from = BackIn { x, saved, grad_out };
    let nd = dims.nodes * dims.embed();
    // The query's and keys' gradients: one unread value each, as [`backward_into`]'s.
    let (mut dq, mut dk) = ([0.0f32; 1], [0.0f32; 1]);
    let lens = [1, nd, nd, table_len(dims)];
    let InstanceWork { buffers, own } = work;
    let targets = [&mut dk[..], dv, dl, dt];
    own.run(
        lens,
        (targets, [false, adding, adding, false]),
        |[dk, dv, dl, dt]| {
            let dt = TableGrad { out: dt, adding };
            let kernel = (backward_instance_dispatch as BackwardInstance, buffers);
            forced::backward_unit(dims, scale, (&from, 0), (&mut dq, dk, dv, dl, dt), kernel);
        },
    );
}

/// [`backward`] with each instance in `instance_kernel` (the tests pick each form).
fn backward_with(
    dims: Dims,
    scale: Scale,
    from: &BackIn,
    instance_kernel: BackwardInstance,
) -> Grads {
    backward_into(dims, scale, from, instance_kernel, StepSums::default())
}

/// [`backward_with`], adding to `sums` where given.
fn backward_into(
    dims: Dims,
    scale: Scale,
    from: &BackIn,
    instance_kernel: BackwardInstance,
    sums: StepSums,
) -> Grads {
    let (n, d, s) = (dims.nodes, dims.embed(), dims.starts);
    // Without tables, each instance's chunk of them is one value nothing reads; with
    // them, so is its chunk of the query and key gradients, which they carry instead.
    let tables = match from.x.compat {
        Some(_) => table_len(dims),
        None => 1,
    };
    let (dq_len, dk_len) = match from.x.query_grad_width(dims) {
        0 => (1, 1),
        width => (s * width, n * d),
    };
    let lens = [dk_len, n * d, n * d, tables];
    let given = [
        sums.glimpse_keys,
        sums.glimpse_values,
        sums.logit_keys,
        sums.compat_tables,
    ];
    let adds = given.each_ref().map(Option::is_some);
    // The tables' gradient is added to its sum by the kernel itself ([`table_grads`]).
    let own_adds = [adds[0], adds[1], adds[2], false];
    for (sum, len) in given.iter().zip(lens) {
        assert!(sum.as_ref().is_none_or(|t| t.len() == dims.instances * len));
    }
    // Each is written once: by the kernels, or as zeros for forced rows and for
    // instances with no other (`forced::backward_unit`).
    let mut query = unwritten(dims.instances * dq_len);
    let mut fresh: [Vec<f32>; 4] = std::array::from_fn(|k| match adds[k] {
        true => Vec::new(),
        false => unwritten(dims.instances * lens[k]),
    });
    let mut targets = (given.into_iter().zip(&mut fresh)).map(|(sum, f)| sum.unwrap_or(f));
    let [dk, dv, dl, dt] = std::array::from_fn(|_| targets.next().expect("four"));
    let per_instance = query
        .par_chunks_mut(dq_len)
        .zip(dk.par_chunks_mut(lens[0]))
        .zip(dv.par_chunks_mut(lens[1]))
        .zip(dl.par_chunks_mut(lens[2]))
        .zip(dt.par_chunks_mut(lens[3]));
    per_instance.enumerate().for_each_init(
        <(BackBuffers, OwnGrads)>::default,
        |(buffers, own), (i, ((((dq, dk), dv), dl), dt))| {
            let targets = [dk, dv, dl, dt];
            let kernel = (instance_kernel, buffers);
            own.run(lens, (targets, own_adds), |[dk, dv, dl, dt]| {
                let dt = TableGrad {
                    out: dt,
                    adding: adds[3],
                };
                forced::backward_unit(dims, scale, (from, i), (dq, dk, dv, dl, dt), kernel);
            });
        },
    );
    let [mut glimpse_keys, glimpse_values, logit_keys, mut compat_tables] = fresh;
    if from.x.compat.is_none() {
        compat_tables.clear();
    } else {
        query.clear();
        glimpse_keys.clear();
    }
    Grads {
        query,
        glimpse_keys,
        glimpse_values,
        logit_keys,
        compat_tables,
    }
}

/// A rayon job's own buffers for an instance's gradients that are added to sums: the
/// kernel writes them whole there (as it writes the others in place), and each is then
/// added to its sum, `sum + step` as autodiff adds them (the same bits). The compatibility
/// table's is not among them: [`table_grads`] adds it to its sum itself, only where some
/// row is at the node.
#[derive(Default)]
struct OwnGrads([Vec<f32>; 4]);

impl OwnGrads {
    /// `write` with each of `targets` where it is not added to, else with this job's own
    /// buffer (`lens` long), which is then added to the target.
    fn run(
        &mut self,
        lens: [usize; 4],
        (targets, adds): ([&mut [f32]; 4], [bool; 4]),
        write: impl FnOnce([&mut [f32]; 4]),
    ) {
        let mut sums: [Option<&mut [f32]>; 4] = Default::default();
        let mut own = self.0.iter_mut().zip(lens);
        let mut outs = targets.into_iter().zip(adds).zip(&mut sums);
        let outs = std::array::from_fn(|_| {
            let ((target, add), sum) = outs.next().expect("four");
            let (buffer, len) = own.next().expect("four");
            if !add {
                return target;
            }
            *sum = Some(target);
            at_least(buffer, len);
            &mut buffer[..len]
        });
        write(outs);
        for (sum, own) in sums.into_iter().zip(&self.0) {
            if let Some(sum) = sum {
                add_to_dispatch(sum, own);
            }
        }
    }
}

simd_dispatch! {
    /// [`add_to`] with the CPU's widest vectors.
    fn add_to_dispatch => add_to(sum: &mut [f32], step: &[f32])
}

/// `sum += step`, value by value: the same bits in any vector width (compiled alone, it
/// had the baseline's 4-lane SSE).
#[inline(always)]
fn add_to<M: MulAdd>(sum: &mut [f32], step: &[f32]) {
    for (s, &g) in sum.iter_mut().zip(step) {
        *s += g;
    }
}

/// What the backward pass reads: the forward pass's inputs and saved values, and the
/// gradient of its outputs.
struct BackIn<'a> {
    x: &'a Inputs<'a>,
    saved: &'a Saved,
    grad_out: &'a [f32],
}

/// Instance `i`'s gradients `(query, keys, values, logit keys, compatibility table)`, each
/// its own block (the table's one unread value where the step has none; the query's and
/// keys' where it has one).
type InstanceGradsOut<'a> = (
    &'a mut [f32],
    &'a mut [f32],
    &'a mut [f32],
    &'a mut [f32],
    TableGrad<'a>,
);

/// Instance `i`'s block of the compatibility tables' gradient: written whole, or
/// (`adding`) added to the sum over a decode's steps that it holds ([`StepSums`]).
pub(super) struct TableGrad<'a> {
    pub(super) out: &'a mut [f32],
    pub(super) adding: bool,
}

simd_dispatch! {
    /// [`backward_instance`] in the best form the CPU allows.
    fn backward_instance_dispatch => backward_instance(
        dims: Dims,
        scale: Scale,
        from: (&BackIn, usize),
        out: InstanceGradsOut,
        buffers: &mut BackBuffers,
        live: LiveRows,
    )
}

/// Instance `i`'s rows `live` (ascending; the others add nothing, and their query
/// gradients in `dq` are left as they are; their kept values at `slots`), in blocks of up
/// to [`MulAdd::ROW_BLOCK`], then the gradients of what its rows share.
#[inline(always)]
fn backward_instance<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (from, i): (&BackIn, usize),
    (dq, dk, dv, dl, dt): InstanceGradsOut,
    buffers: &mut BackBuffers,
    (live, slots): LiveRows,
) {
    let (n, d, s, h) = (dims.nodes, dims.embed(), dims.starts, dims.heads);
    let (x, saved) = (from.x, from.saved);
    let (tables, at) = (i * n * d..(i + 1) * n * d, i * s);
    let BackBuffers {
        scratch,
        attention: held,
        attention_lanes,
        query,
        glimpse,
        block,
        open_rows,
        table_sums,
    } = buffers;
    // The sums over the instance's rows run over the live rows alone.
    let live_dims = Dims {
        starts: live.len(),
        ..dims
    };
    scratch.fit(live_dims);
    block.fit(dims);
    let attention = match &saved.attention {
        Some(kept) => table_rows(kept, h * n, (at, slots), held),
        None => {
            recompute_attention::<M>(dims, x, (i, live), (held, attention_lanes), block);
            &held[..live.len() * h * n]
        }
    };
    let instance = InstanceBack {
        values_t: &by_feature_block(x, dims, i)[2 * d * padded(n)..],
        keys: &x.glimpse_keys[tables.clone()],
        logit_keys: &x.logit_keys[tables],
        query: match x.compat {
            Some(_) => &[],
            None => table_rows(x.query, d, (at, live), query),
        },
        glimpse: table_rows(&saved.glimpse, d, (at, slots), glimpse),
        attention,
        mask: (x.mask, at, live),
        from_tables: x.compat.is_some(),
    };
    backward_blocks::<M>(
        dims,
        scale,
        (from, at, (live, slots)),
        &instance,
        dq,
        (scratch, block),
    );
    instance_grads::<M>(live_dims, &instance, (scratch, open_rows), (dk, dv, dl));
    if let Some(compat) = &x.compat {
        let (by_node, sums) = table_sums;
        table_grads(
            dims,
            (compat, at, live),
            &scratch.d_compat,
            dt,
            (by_node, sums),
        );
    }
}

/// The instance's compatibility table's gradient `[(N + 1)·H, Np]` from its live rows'
/// (`at + r`, r in `live`) compatibility gradients `[L, H, N]`: a node's rows the sum of
/// the rows at that node, the capacity's the sum of every row's times its remaining
/// capacity fraction, each in row order from zero (as adding each row's in turn to a
/// zeroed table gave them), then added to `out` once. Where `out` holds a sum over steps,
/// the rows of nodes no row is at are left as they are: the step's gradient there is zero,
/// and the sums never hold −0 (each is a first step's gradient, zero where nothing was
/// added, plus others), so adding it would change no bit. `sums` is working memory.
///
/// Inlined into [`backward_instance`]'s forms, so that its loops are compiled with their
/// vector units (alone, with the baseline's 4-lane SSE: ~4% of a POMO CVRP100 step). Each
/// value is its own sum, so the width changes no bit.
#[inline(always)]
fn table_grads(
    dims: Dims,
    (compat, at, live): (&CompatTables, usize, &[usize]),
    d_compat: &[f32],
    out: TableGrad,
    (by_node, sums): (&mut Vec<u32>, &mut Vec<f32>),
) {
    let (n, h) = (dims.nodes, dims.heads);
    let (np, per_row) = (padded(n), h * n);
    if !out.adding {
        out.out.fill(0.0);
    }
    sums.resize(per_row, 0.0);
    let node_of = |k: u32| compat.last_node[at + live[k as usize]];
    by_node.clear();
    by_node.extend(0..live.len() as u32);
    by_node.sort_unstable_by_key(|&k| (node_of(k), k));
    for rows in by_node.chunk_by(|&a, &b| node_of(a) == node_of(b)) {
        let grad = |k: u32| &d_compat[k as usize * per_row..][..per_row];
        for (sum, &g) in sums.iter_mut().zip(grad(rows[0])) {
            *sum = 0.0 + g;
        }
        for &k in &rows[1..] {
            for (sum, &g) in sums.iter_mut().zip(grad(k)) {
                *sum += g;
            }
        }
        add_head_rows(&mut out.out[node_of(rows[0]) * h * np..], sums, (n, np));
    }
    sums.fill(0.0);
    for (k, &r) in live.iter().enumerate() {
        let remaining = compat.remaining[at + r];
        let grad = &d_compat[k * per_row..][..per_row];
        for (sum, &g) in sums.iter_mut().zip(grad) {
            *sum += remaining * g;
        }
    }
    add_head_rows(&mut out.out[n * h * np..], sums, (n, np));
}

/// Adds each head's `[N]` row of `sums` (`[H, N]`) to its `[Np]` row of `out`.
#[inline(always)]
fn add_head_rows(out: &mut [f32], sums: &[f32], (n, np): (usize, usize)) {
    for (out, sum) in out.chunks_mut(np).zip(sums.chunks_exact(n)) {
        for (t, &s) in out.iter_mut().zip(sum) {
            *t += s;
        }
    }
}

/// [`backward_instance`]'s rows `live` (from the batch's row `at`; their kept values at
/// `slots`), in blocks: their query gradients into `dq` and their rows of the instance's
/// gradient tables. A block's rows and kept values are each read (and its query
/// gradients written) in place where they are consecutive, else gathered into `block`.
#[inline(always)]
fn backward_blocks<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (from, at, (live, slots)): (&BackIn, usize, LiveRows),
    instance: &InstanceBack,
    dq: &mut [f32],
    (scratch, block): (&mut BackScratch, &mut BackBlock),
) {
    let (n, h) = (dims.nodes, dims.heads);
    let (x, saved) = (from.x, from.saved);
    // Rows' query gradients are `w` wide: none with tables.
    let w = x.query_grad_width(dims);
    let mut k = 0;
    while k < live.len() {
        let count = rows_in_block::<M>(live.len() - k);
        let (rows, j) = (&live[k..k + count], k);
        k += count;
        let BackBlock {
            d_query,
            rows: gathered,
            tanh,
            log_sum,
            ..
        } = &mut *block;
        let attention = &instance.attention[j * h * n..(j + count) * h * n];
        let kept_at = (at, &slots[j..j + count]);
        let tanh = table_rows(&saved.tanh, n, kept_at, tanh);
        let log_sum = table_rows(&saved.log_sum, 1, kept_at, log_sum);
        let in_place = consecutive(rows);
        let (rows_saved, query) = match in_place {
            Some(start) => {
                let r = at + start..at + start + count;
                let rows_saved = RowSaved {
                    mask: &x.mask[r.start * n..r.end * n],
                    attention,
                    tanh,
                    log_sum,
                    grad_out: &from.grad_out[r.start * n..r.end * n],
                };
                (rows_saved, &mut dq[start * w..(start + count) * w])
            }
            None => (
                gathered.gather(from, (at, rows), (attention, tanh, log_sum), n),
                &mut d_query[..count * w],
            ),
        };
        let block_rows = (j, &rows_saved, instance);
        let scratch = &mut *scratch;
        match count {
            8 => backward_rows::<M, 8>(dims, scale, block_rows, query, scratch),
            4 => backward_rows::<M, 4>(dims, scale, block_rows, query, scratch),
            2 => backward_rows::<M, 2>(dims, scale, block_rows, query, scratch),
            _ => backward_rows::<M, 1>(dims, scale, block_rows, query, scratch),
        }
        if in_place.is_none() {
            scatter_rows(d_query, w, rows, dq);
        }
    }
}

/// Rows `at + r` (r in `rows`, ascending) of a `[R, width]` table: in place where they
/// are consecutive, else gathered into `into`.
fn table_rows<'a>(
    table: &'a [f32],
    width: usize,
    (at, rows): (usize, &[usize]),
    into: &'a mut Vec<f32>,
) -> &'a [f32] {
    match consecutive(rows) {
        Some(first) => &table[(at + first) * width..(at + first + rows.len()) * width],
        None => held_rows(table, width, (at, rows), into),
    }
}

/// Rows `at + r` (r in `live`) of a `[R, width]` table, gathered into `into`.
fn held_rows<'a>(
    table: &[f32],
    width: usize,
    (at, live): (usize, &[usize]),
    into: &'a mut Vec<f32>,
) -> &'a [f32] {
    // Every value is written before it is read: only the growth is zeroed.
    at_least(into, live.len() * width);
    gather_rows(table, width, at, live, into);
    &into[..live.len() * width]
}

/// Instance `i`'s attention weights `[L, H, N]` for its rows `live` into `attention`,
/// recomputed as the forward pass computed them (the same function, so the same bits),
/// where the forward pass did not keep them ([`keeps_attention`]); `lanes` is the working
/// memory, and `block` holds a block's gathered queries and masks.
#[inline(always)]
fn recompute_attention<M: MulAdd>(
    dims: Dims,
    x: &Inputs,
    (i, live): (usize, &[usize]),
    (attention, lanes): (&mut Vec<f32>, &mut Vec<f32>),
    block: &mut BackBlock,
) {
    let (n, h, d, s) = (dims.nodes, dims.heads, dims.embed(), dims.starts);
    // Every weight is written before it is read: only the growth is zeroed.
    at_least(attention, live.len() * h * n);
    lanes.resize(2 * MAX_ROW_BLOCK * padded(n), 0.0);
    #[cfg(test)]
    poison(&mut [attention, lanes]);
    let at = i * s;
    let mut k = 0;
    while k < live.len() {
        let count = rows_in_block::<M>(live.len() - k);
        let (rows, j) = (&live[k..k + count], k);
        k += count;
        let (query, mask) = match consecutive(rows) {
            Some(start) => {
                let r = at + start;
                (x.query_rows(r, count, d), &x.mask[r * n..(r + count) * n])
            }
            None => {
                if x.compat.is_none() {
                    gather_rows(x.query, d, at, rows, &mut block.query);
                }
                gather_rows(x.mask, n, at, rows, &mut block.rows.mask);
                (&block.query[..count * d], &block.rows.mask[..count * n])
            }
        };
        let rows = (CompatIn::of(x, dims, (i, at, rows), query), mask);
        let (lanes, out) = (
            &mut lanes[..],
            &mut attention[j * h * n..(j + count) * h * n],
        );
        match count {
            8 => attention_rows::<M, 8>(dims, rows, lanes, out),
            4 => attention_rows::<M, 4>(dims, rows, lanes, out),
            2 => attention_rows::<M, 2>(dims, rows, lanes, out),
            _ => attention_rows::<M, 1>(dims, rows, lanes, out),
        }
    }
}

/// What a backward row reads of its instance.
struct InstanceBack<'a> {
    /// `[H·dk, Np]` values, node-minor.
    values_t: &'a [f32],
    /// `[N, H, dk]`
    keys: &'a [f32],
    /// `[N, d]`
    logit_keys: &'a [f32],
    /// `[S, d]` the instance's rows' queries.
    query: &'a [f32],
    /// `[S, d]` the instance's rows' glimpses.
    glimpse: &'a [f32],
    /// `[S, H, N]` the instance's rows' attention weights.
    attention: &'a [f32],
    /// The step's masks `[R, N]`, the instance's first row, and its rows taken (those of
    /// the tables above, in order).
    mask: (&'a [u8], usize, &'a [usize]),
    /// Whether the compatibilities came from [`CompatTables`]: the queries and keys then
    /// get no gradient here (the tables' carries it).
    from_tables: bool,
}

/// The backward pass's working memory, kept from one instance to the next by each of
/// rayon's jobs (`for_each_init`): allocated and zeroed for each instance, it was ~0.7 MB
/// of writes nothing read at CVRP100 (an instance-step's compatibility gradients and
/// recomputed attention weights).
#[derive(Default)]
pub(super) struct BackBuffers {
    scratch: BackScratch,
    /// `[L, H, N]` the live rows' attention weights: recomputed where they are not kept,
    /// gathered where their kept rows are not consecutive (tours the loss does not learn
    /// from between them).
    attention: Vec<f32>,
    /// Two `[MAX_ROW_BLOCK, Np]` lane blocks for their recomputation.
    attention_lanes: Vec<f32>,
    /// `[L, d]` the live rows' queries and glimpses, where the rows (their kept rows) are
    /// not consecutive.
    query: Vec<f32>,
    glimpse: Vec<f32>,
    /// One block's rows, where they are not consecutive.
    block: BackBlock,
    /// The rows at which some node of a block is open.
    open_rows: Vec<u32>,
    /// The live rows by node, and a node's `[H, N]` sums ([`table_grads`]).
    table_sums: (Vec<u32>, Vec<f32>),
}

/// A block of rows that are not consecutive, gathered: their queries (to recompute
/// their attention weights), masks and output gradients, and their query gradients
/// before they are written back; and a block's kept tanh and log-sums where its kept rows
/// are not consecutive.
#[derive(Default)]
pub(super) struct BackBlock {
    query: Vec<f32>,
    d_query: Vec<f32>,
    rows: BlockRows,
    tanh: Vec<f32>,
    log_sum: Vec<f32>,
}

/// A gathered block's masks and output gradients, each `[rows, N]`.
#[derive(Default)]
struct BlockRows {
    mask: Vec<u8>,
    grad_out: Vec<f32>,
}

impl BackBlock {
    /// Sized for a block of [`MAX_ROW_BLOCK`] rows of `dims`; every value a block reads
    /// is written first.
    fn fit(&mut self, dims: Dims) {
        let (n, d) = (dims.nodes, dims.embed());
        self.query.resize(MAX_ROW_BLOCK * d, 0.0);
        self.d_query.resize(MAX_ROW_BLOCK * d, 0.0);
        self.rows.mask.resize(MAX_ROW_BLOCK * n, 0);
        self.rows.grad_out.resize(MAX_ROW_BLOCK * n, 0.0);
        // `tanh` and `log_sum` are grown where they are gathered (`held_rows`).
    }
}

impl BlockRows {
    /// The masks and output gradients of `rows` (within the instance whose first row is
    /// the batch's `at`), gathered; `kept` (their attention weights, tanh and log-sums)
    /// are theirs already.
    fn gather<'a>(
        &'a mut self,
        from: &BackIn,
        (at, rows): (usize, &[usize]),
        (attention, tanh, log_sum): (&'a [f32], &'a [f32], &'a [f32]),
        n: usize,
    ) -> RowSaved<'a> {
        let count = rows.len();
        gather_rows(from.x.mask, n, at, rows, &mut self.mask);
        gather_rows(from.grad_out, n, at, rows, &mut self.grad_out);
        RowSaved {
            mask: &self.mask[..count * n],
            attention,
            tanh,
            log_sum,
            grad_out: &self.grad_out[..count * n],
        }
    }
}

/// An instance's working memory in the backward pass.
#[derive(Default)]
struct BackScratch {
    /// `[MAX_ROW_BLOCK, Np]` the block's rows' attention gradients for one head.
    lanes: Vec<f32>,
    /// `[Np]` one row's probabilities.
    probs: Vec<f32>,
    /// `[S, d]` each row's glimpse gradient.
    d_glimpse: Vec<f32>,
    /// `[S, N]` each row's logit gradients.
    d_logits: Vec<f32>,
    /// `[S, H, N]` each row's compatibility gradients.
    d_compat: Vec<f32>,
    /// The nodes a block's rows may choose.
    open: Vec<u32>,
}

impl BackScratch {
    /// Sized for an instance of `dims` at least. Every value is written before it is read
    /// (by its row, or its row block's product), so only the growth is zeroed.
    fn fit(&mut self, dims: Dims) {
        let (n, d, s, h) = (dims.nodes, dims.embed(), dims.starts, dims.heads);
        let np = padded(n);
        self.lanes.resize(MAX_ROW_BLOCK * np, 0.0);
        self.probs.resize(np, 0.0);
        at_least(&mut self.d_glimpse, s * d);
        at_least(&mut self.d_logits, s * n);
        at_least(&mut self.d_compat, s * h * n);
        #[cfg(test)]
        poison(&mut [
            &mut self.lanes,
            &mut self.probs,
            &mut self.d_glimpse,
            &mut self.d_logits,
            &mut self.d_compat,
        ]);
    }
}

/// `buffer` grown to `len` values where it is shorter, its growth zeroed. Working memory
/// sized by an instance's live rows is never shrunk: the next instance with more would
/// zero the difference again (~0.7% of a POMO CVRP100 step).
fn at_least(buffer: &mut Vec<f32>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
}

/// Working memory filled with NaN before use in the tests, so that a value read before it
/// is written shows in every result.
#[cfg(test)]
fn poison(buffers: &mut [&mut Vec<f32>]) {
    for buffer in buffers {
        buffer.fill(f32::NAN);
    }
}

/// Consecutive rows' masks, what their forward pass kept, and their output gradients,
/// each `[rows, ·]`.
struct RowSaved<'a> {
    mask: &'a [u8],
    attention: &'a [f32],
    tanh: &'a [f32],
    /// `[rows]` ([`Saved::log_sum`]).
    log_sum: &'a [f32],
    grad_out: &'a [f32],
}

/// The first row's index within its instance, the rows' saved values, and their instance.
type RowBack<'a> = (usize, &'a RowSaved<'a>, &'a InstanceBack<'a>);

/// `R` consecutive rows: their query gradients (none with tables: `d_query` is empty),
/// and their rows of the instance's logit and compatibility gradients. Each head's attention gradients are one product of the `R`
/// rows' glimpse gradients against the values (they share them); the rest goes row by row.
#[inline(always)]
fn backward_rows<M: MulAdd, const R: usize>(
    dims: Dims,
    scale: Scale,
    (first, x, instance): RowBack,
    d_query: &mut [f32],
    scratch: &mut BackScratch,
) {
    let (n, h, dk, d) = (dims.nodes, dims.heads, dims.head_dim, dims.embed());
    let np = padded(n);
    let totals = row_sums::<R>(x.grad_out, n);
    for (r, &total) in totals.iter().enumerate() {
        logit_grads_row::<M>(dims, scale, (first + r, r, x), total, scratch);
    }
    let BackScratch {
        lanes,
        d_glimpse,
        d_compat,
        d_logits,
        open,
        ..
    } = scratch;
    // The products over nodes take those some row of the block may choose: at the others
    // every row's logit and compatibility gradients are zero.
    let nodes = open_nodes_of_any::<R>(x.mask, n, open);
    // logits = glimpse · logit_keys[node]: the rows' glimpse gradients in one product
    // against the logit keys they share.
    let from_logits = RowsAt::contiguous(n, n, d);
    let dg_rows = &mut d_glimpse[first * d..(first + R) * d];
    let (logit_keys, d_logits) = (instance.logit_keys, &d_logits[first * n..]);
    nodes.weighted_sums::<M, R>(d_logits, logit_keys, (d, d), from_logits, dg_rows);
    let from_glimpse = RowsAt::contiguous(d, dk, np);
    // Each head: glimpse_h = Σ a·v, a = softmax(q_h · k).
    for head in 0..h {
        // d_attention[node] = dg · v[node], for every node and row at once.
        let dg = &d_glimpse[first * d + head * dk..];
        let values = &instance.values_t[head * dk * np..];
        weighted_sums::<M, R>(dg, values, (np, np), from_glimpse, lanes);
        let attention: [&[f32]; R] =
            std::array::from_fn(|r| &x.attention[(r * h + head) * n..][..n]);
        let weighted = attention_weighted::<R>(attention, lanes, np);
        for r in 0..R {
            let da = &lanes[r * np..][..n];
            // d_compat = a·(da − Σ a·da).
            let row_compat = &mut d_compat[((first + r) * h + head) * n..][..n];
            for ((c, &a), &da) in row_compat.iter_mut().zip(attention[r]).zip(da) {
                *c = a * (da - weighted[r]);
            }
        }
        if instance.from_tables {
            continue;
        }
        // The rows' query gradients (only this head writes these lanes): one product
        // of the block's rows against the keys they share.
        let keys = &instance.keys[head * dk..];
        let from_compat = RowsAt::contiguous(h * n, n, d);
        let compat = &d_compat[(first * h + head) * n..];
        let d_query = &mut d_query[head * dk..];
        nodes.weighted_sums::<M, R>(compat, keys, (d, dk), from_compat, d_query);
    }
}

/// Each of `R` rows' `Σ a·da` over its nodes, in node order: `attention` its weights
/// `[N]`, `lanes` its attention gradients (row r's at `r · np`). One row's sum is a chain
/// of N dependent additions; the `R` chains advance together, a node at a time, so each
/// waits on the others rather than on its own last addition (the same sums, bit for bit).
#[inline(always)]
fn attention_weighted<const R: usize>(
    attention: [&[f32]; R],
    lanes: &[f32],
    np: usize,
) -> [f32; R] {
    let n = attention[0].len();
    let da: [&[f32]; R] = std::array::from_fn(|r| &lanes[r * np..][..n]);
    let mut weighted = [0.0f32; R];
    for node in 0..n {
        for r in 0..R {
            weighted[r] += attention[r][node] * da[r][node];
        }
    }
    weighted
}

/// Each of `R` rows' sum over its `n` entries (`rows`: `[R, n]`), in entry order from −0
/// as [`Iterator::sum`] takes it. One row's sum is a chain of n dependent additions (~400
/// cycles at n = 101); the `R` chains advance together (the same sums, bit for bit).
#[inline(always)]
fn row_sums<const R: usize>(rows: &[f32], n: usize) -> [f32; R] {
    let rows: [&[f32]; R] = std::array::from_fn(|r| &rows[r * n..][..n]);
    let mut sums = [-0.0f32; R];
    for k in 0..n {
        for (sum, row) in sums.iter_mut().zip(&rows) {
            *sum += row[k];
        }
    }
    sums
}

/// One row's logit gradients, in its row of `d_logits`: `(row within the instance, row
/// within the block, the block)`, and `total`, the sum of its output gradients.
#[inline(always)]
fn logit_grads_row<M: MulAdd>(
    dims: Dims,
    scale: Scale,
    (row, r, x): (usize, usize, &RowSaved),
    total: f32,
    scratch: &mut BackScratch,
) {
    let n = dims.nodes;
    let (mask, log_sum) = (&x.mask[r * n..][..n], x.log_sum[r]);
    let (tanh, grad_out) = (&x.tanh[r * n..][..n], &x.grad_out[r * n..][..n]);
    let probs = &mut scratch.probs;
    // The log-probabilities, by the forward pass's own operations ([`log_softmax_row`]).
    for ((p, &t), &m) in probs.iter_mut().zip(tanh).zip(mask) {
        *p = if m == 0 {
            clipped(t, scale) - log_sum
        } else {
            f32::NEG_INFINITY
        };
    }
    probs[n..].fill(0.0);
    M::exp_chunks_unfused(probs);
    // log_softmax: dz = g − p·Σg (the sum over every entry, as the composed form takes
    // it); masked entries get none. tanh clipping: dlogit = dz · C/T · (1 − tanh²).
    let slope = scale.tanh_clipping / scale.temperature;
    let d_logits = &mut scratch.d_logits[row * n..][..n];
    for (node, d_logit) in d_logits.iter_mut().enumerate() {
        *d_logit = if mask[node] != 0 {
            0.0
        } else {
            let t = tanh[node];
            (grad_out[node] - probs[node] * total) * slope * (1.0 - t * t)
        };
    }
}

/// The instance's key, value and logit-key gradients: `[N, H, dk]`, `[N, H, dk]`, `[N, d]`
/// (with tables, the keys' is one value nothing writes or reads).
type InstanceGrads<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

/// Sums over the instance's rows, [`MulAdd::ROW_BLOCK`] nodes at a time (they share the
/// rows' glimpses, queries and glimpse gradients): logit keys from the logit gradients
/// and glimpses, values from the attention weights and glimpse gradients, keys from the
/// compatibility gradients and queries. Each output is written once, summed over the rows
/// in row order. A row where every node of the block is masked is left out: each of its
/// coefficients is zero, and adds an exact zero to a sum that never holds −0 (late in a
/// decode most rows have most nodes closed).
#[inline(always)]
fn instance_grads<M: MulAdd>(
    dims: Dims,
    instance: &InstanceBack,
    (scratch, open_rows): (&BackScratch, &mut Vec<u32>),
    out: InstanceGrads,
) {
    let mut node = 0;
    while node < dims.nodes {
        let count = rows_in_block::<M>(dims.nodes - node);
        let out = (&mut *out.0, &mut *out.1, &mut *out.2);
        let x = (dims, instance, scratch);
        match count {
            8 => instance_grads_nodes::<M, 8>(x, open_rows, out, node),
            4 => instance_grads_nodes::<M, 4>(x, open_rows, out, node),
            2 => instance_grads_nodes::<M, 2>(x, open_rows, out, node),
            _ => instance_grads_nodes::<M, 1>(x, open_rows, out, node),
        }
        node += count;
    }
}

/// [`instance_grads`] for nodes `first..first + R`, over the rows where some of them is
/// open ([`rows_open_at_any`], listed in `open_rows`): each node's coefficients are a
/// column of a `[S, ·]` table, read in place.
#[inline(always)]
fn instance_grads_nodes<M: MulAdd, const R: usize>(
    (dims, instance, scratch): (Dims, &InstanceBack, &BackScratch),
    open_rows: &mut Vec<u32>,
    (d_keys, d_values, d_logit_keys): InstanceGrads,
    first: usize,
) {
    let (n, h, dk, d, s) = (
        dims.nodes,
        dims.heads,
        dims.head_dim,
        dims.embed(),
        dims.starts,
    );
    let (mask, at, live) = instance.mask;
    let rows = rows_open_at_any::<R>(mask, (n, first), (at, live), open_rows);
    let at = first * d;
    let over_rows = |row_length| RowsAt {
        coef_stride: 1,
        coef_step: row_length,
        count: s,
        out_stride: d,
    };
    let d_logits = &scratch.d_logits[first..];
    let out = &mut d_logit_keys[at..];
    rows.weighted_sums::<M, R>(d_logits, instance.glimpse, (d, d), over_rows(n), out);
    for head in 0..h {
        let column = head * n + first;
        let out = at + head * dk;
        let d_glimpse = &scratch.d_glimpse[head * dk..];
        let attention = &instance.attention[column..];
        let values_out = &mut d_values[out..];
        let sums = (d, dk);
        rows.weighted_sums::<M, R>(attention, d_glimpse, sums, over_rows(h * n), values_out);
        if instance.from_tables {
            continue;
        }
        let query = &instance.query[head * dk..];
        let d_compat = &scratch.d_compat[column..];
        let keys_out = &mut d_keys[out..];
        rows.weighted_sums::<M, R>(d_compat, query, (d, dk), over_rows(h * n), keys_out);
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::row_kernels::{
        assert_forms_agree, forms_this_cpu_runs, Fused, NamedOutputs, Plain, Wide,
    };
    use crate::test_support::pseudo_random;

    /// A step's inputs and output gradient, fixed pseudo-random values; every third node
    /// of the flattened `[R, N]` mask is masked, and a run of nodes in some rows.
    pub(super) struct StepData {
        pub(super) dims: Dims,
        query: Vec<f32>,
        keys: Vec<f32>,
        values: Vec<f32>,
        logit_keys: Vec<f32>,
        by_feature: Vec<f32>,
        pub(super) mask: Vec<u8>,
        pub(super) grad_out: Vec<f32>,
        /// Compatibility tables `[B, (N + 1)·H, Np]` and each row's node and remaining
        /// capacity fraction, where the step reads them ([`StepData::with_tables`]).
        tables: Option<(Vec<f32>, Vec<usize>, Vec<f32>)>,
    }

    impl StepData {
        /// The same step with its compatibilities read from pseudo-random tables (zero
        /// past N), its rows at nodes that repeat (the depot most).
        pub(super) fn with_tables(mut self) -> Self {
            let (n, rows) = (self.dims.nodes, self.dims.rows());
            let np = padded(n);
            let mut tables = pseudo_random(self.dims.instances * table_len(self.dims), 6, 2.0);
            for row in tables.chunks_exact_mut(np) {
                row[n..].fill(0.0);
            }
            let last_node = (0..rows).map(|r| ((r * r) % (n + 2)).min(n - 1)).collect();
            let remaining = (0..rows).map(|r| 1.0 - (r % 5) as f32 * 0.2).collect();
            self.tables = Some((tables, last_node, remaining));
            self
        }

        fn new(dims: Dims) -> Self {
            let (rows, n, d, b) = (dims.rows(), dims.nodes, dims.embed(), dims.instances);
            let query = pseudo_random(rows * d, 1, 0.5);
            let keys = pseudo_random(b * n * d, 2, 0.125);
            let values = pseudo_random(b * n * d, 3, 0.5);
            let logit_keys = pseudo_random(b * n * d, 4, 0.05);
            // Every fourth row also has nodes 8 to 15 closed, as late in a decode: the
            // backward pass's sums over rows leave it out for those nodes.
            let closed = |i: usize| i % 3 == 1 || ((i / n) % 4 == 3 && (i % n) / 8 == 1);
            let mask: Vec<u8> = (0..rows * n).map(|i| u8::from(closed(i))).collect();
            // [B, 3d, Np]: each instance's three [N, d] blocks, by feature.
            let np = padded(n);
            let mut by_feature = vec![0.0f32; b * 3 * d * np];
            for (i, out) in by_feature.chunks_exact_mut(3 * d * np).enumerate() {
                for (part, source) in [&keys, &logit_keys, &values].into_iter().enumerate() {
                    for node in 0..n {
                        for f in 0..d {
                            out[(part * d + f) * np + node] = source[(i * n + node) * d + f];
                        }
                    }
                }
            }
            let grad_out = pseudo_random(rows * n, 5, 0.5);
            Self {
                dims,
                query,
                keys,
                values,
                logit_keys,
                by_feature,
                mask,
                grad_out,
                tables: None,
            }
        }

        /// Instances of `starts` rows over `nodes` nodes, d = 128 in 8 heads.
        pub(super) fn of_size(instances: usize, starts: usize, nodes: usize) -> Self {
            Self::new(Dims {
                instances,
                starts,
                nodes,
                heads: 8,
                head_dim: 16,
            })
        }

        pub(super) fn inputs(&self) -> Inputs<'_> {
            Inputs {
                query: &self.query,
                glimpse_keys: &self.keys,
                glimpse_values: &self.values,
                logit_keys: &self.logit_keys,
                by_feature: &self.by_feature,
                mask: &self.mask,
                compat: self
                    .tables
                    .as_ref()
                    .map(|(tables, last_node, remaining)| CompatTables {
                        tables,
                        last_node,
                        remaining,
                    }),
            }
        }

        /// The forward pass cut in `pieces`, then the backward pass, in the given kernels.
        pub(super) fn passes(
            &self,
            pieces: Pieces,
            kernels: (ForwardPiece, BackwardInstance),
        ) -> (Vec<f32>, Saved, Grads) {
            let (dims, scale, x) = (self.dims, Scale::new(10.0, 1.0), self.inputs());
            let (log_probs, saved) = forward_with(dims, scale, &x, pieces, kernels.0);
            let saved = saved.expect("kept");
            let from = BackIn {
                x: &x,
                saved: &saved,
                grad_out: &self.grad_out,
            };
            let grads = backward_with(dims, scale, &from, kernels.1);
            // The working memory is NaN before each use in the tests (`poison`): a value
            // read before it is written would show here.
            let all = [
                &grads.query,
                &grads.glimpse_keys,
                &grads.glimpse_values,
                &grads.logit_keys,
                &grads.compat_tables,
            ];
            for g in all {
                assert!(g.iter().all(|v| v.is_finite()), "{:?}", self.dims);
            }
            (log_probs, saved, grads)
        }

        /// The forward and backward pass with each instance in the given kernels: the
        /// log-probabilities, then every saved value and gradient, in one list.
        fn run(&self, kernels: (ForwardPiece, BackwardInstance)) -> NamedOutputs {
            let pieces = Pieces::for_threads(self.dims);
            let (log_probs, saved, grads) = self.passes(pieces, kernels);
            vec![
                ("glimpse", saved.glimpse),
                ("tanh", saved.tanh),
                ("log_probs", log_probs),
                ("d_query", grads.query),
                ("d_keys", grads.glimpse_keys),
                ("d_values", grads.glimpse_values),
                ("d_logit_keys", grads.logit_keys),
                ("d_compat_tables", grads.compat_tables),
            ]
        }
    }

    /// Each form of the kernels run whole, forward and backward ([`assert_forms_agree`]):
    /// `Wide` has 8-row blocks and 16-lane sums, `Fused` 4-row blocks and 8-lane sums. Row
    /// counts that leave blocks of 8, 4, 2 and 1, and one row per instance (the heads
    /// summed together); node counts whose padded width is one 16-lane vector, one and a
    /// half, or less.
    #[test]
    fn every_form_gives_the_same_numbers() {
        for (instances, starts, nodes) in
            [(3, 20, 21), (2, 7, 11), (3, 1, 21), (2, 15, 16), (2, 3, 5)]
        {
            let plain = StepData::of_size(instances, starts, nodes);
            let tables = StepData::of_size(instances, starts, nodes).with_tables();
            for data in [plain, tables] {
                let (dims, tables) = (data.dims, data.tables.is_some());
                assert_forms_agree(
                    &format!("{dims:?}, tables {tables}"),
                    || data.run((forward_piece::<Plain>, backward_instance::<Plain>)),
                    || data.run((forward_piece::<Fused>, backward_instance::<Fused>)),
                    || data.run((forward_piece::<Wide>, backward_instance::<Wide>)),
                );
            }
        }
    }

    /// Steps of these sizes `(instances, starts, nodes)`, each with its compatibilities
    /// from the products and from tables.
    fn with_and_without_tables(sizes: &[(usize, usize, usize)]) -> Vec<StepData> {
        let step = |&(instances, starts, nodes): &(usize, usize, usize)| {
            StepData::of_size(instances, starts, nodes)
        };
        (sizes.iter())
            .flat_map(|size| [step(size), step(size).with_tables()])
            .collect()
    }

    /// The rows' sums taken side by side are `Iterator::sum`'s, bit for bit: rows of
    /// mixed magnitudes (where the order of the additions shows), of zeros of both signs,
    /// and empty.
    #[test]
    fn row_sums_are_iterator_sums() {
        let mixed = pseudo_random(4 * 37, 5, 1.0);
        let mixed: Vec<f32> = (mixed.iter().enumerate())
            .map(|(k, v)| v * [1.0, 1e7, 1e-7][k % 3])
            .collect();
        let zeros = [-0.0, -0.0, 0.0, -0.0, -0.0, -0.0, -0.0, -0.0];
        for (rows, n) in [(&mixed[..], 37), (&zeros[..], 2), (&[][..], 0)] {
            let want: Vec<f32> = (0..4)
                .map(|r| rows[r * n..(r + 1) * n].iter().sum())
                .collect();
            assert!(same(&row_sums::<4>(rows, n), &want), "n = {n}");
        }
        // Every order of addition of these differs in the last bits.
        let sequential: f32 = mixed[..37].iter().sum();
        let pairwise: f32 = (mixed[..37].chunks(2)).map(|p| p.iter().sum::<f32>()).sum();
        assert_ne!(sequential.to_bits(), pairwise.to_bits());
    }

    /// Whether two lists hold the same floats, bit for bit.
    pub(super) fn same(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
    }

    /// The forward pass cut into pieces of 8, 16 or all of an instance's rows, kept or
    /// not: the same log-probabilities and kept values, bit for bit, in each form.
    #[test]
    fn pieces_give_the_same_numbers() {
        for data in with_and_without_tables(&[(1, 37, 21), (3, 20, 11), (2, 1, 5)]) {
            let (dims, starts) = (data.dims, data.dims.starts);
            let (scale, x) = (Scale::new(10.0, 1.0), data.inputs());
            let whole = Pieces {
                rows: starts.next_multiple_of(MAX_ROW_BLOCK),
                keep: true,
                keep_attention: true,
            };
            let kernels = forms_this_cpu_runs::<ForwardPiece>([
                forward_piece::<Plain>,
                forward_piece::<Fused>,
                forward_piece::<Wide>,
            ]);
            for kernel in kernels {
                let (expected, kept) = forward_with(dims, scale, &x, whole, kernel);
                let kept = kept.expect("kept");
                for rows in [8, 16] {
                    for (keep, keep_attention) in [(true, true), (true, false), (false, false)] {
                        let pieces = Pieces {
                            rows,
                            keep,
                            keep_attention,
                        };
                        let (log_probs, saved) = forward_with(dims, scale, &x, pieces, kernel);
                        assert!(same(&log_probs, &expected), "{dims:?} {pieces:?}");
                        if let Some(saved) = saved {
                            assert!(same(&saved.glimpse, &kept.glimpse), "{dims:?} {pieces:?}");
                            assert!(same(&saved.tanh, &kept.tanh), "{dims:?} {pieces:?}");
                            if let (Some(a), Some(b)) = (&saved.attention, &kept.attention) {
                                assert!(same(a, b), "{dims:?} {pieces:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The backward pass recomputes the attention weights the forward pass kept, bit for
    /// bit, in each form (for every row, and for some rows, gathered), and so gives the
    /// same gradients without them.
    #[test]
    fn recomputed_attention_is_the_kept_one() {
        type Forms = (
            ForwardPiece,
            BackwardInstance,
            fn(Dims, &Inputs, (usize, &[usize]), (&mut Vec<f32>, &mut Vec<f32>), &mut BackBlock),
        );
        let forms = forms_this_cpu_runs::<Forms>([
            (
                forward_piece::<Plain>,
                backward_instance::<Plain>,
                recompute_attention::<Plain>,
            ),
            (
                forward_piece::<Fused>,
                backward_instance::<Fused>,
                recompute_attention::<Fused>,
            ),
            (
                forward_piece::<Wide>,
                backward_instance::<Wide>,
                recompute_attention::<Wide>,
            ),
        ]);
        for data in with_and_without_tables(&[(3, 20, 21), (2, 7, 11), (3, 1, 21)]) {
            let (dims, starts, nodes) = (data.dims, data.dims.starts, data.dims.nodes);
            let (scale, x) = (Scale::new(10.0, 1.0), data.inputs());
            let pieces = Pieces {
                rows: 8,
                keep: true,
                keep_attention: true,
            };
            for &(forward, backward, recompute) in &forms {
                let (_, saved) = forward_with(dims, scale, &x, pieces, forward);
                let mut saved = saved.expect("kept");
                let kept = saved.attention.clone().expect("attention kept");
                let per_instance = starts * 8 * nodes;
                // Reused from one instance to the next, as the backward pass does.
                let (mut attention, mut lanes) = (Vec::new(), Vec::new());
                let mut block = BackBlock::default();
                block.fit(dims);
                let every: Vec<usize> = (0..starts).collect();
                let some: Vec<usize> = (0..starts).filter(|r| r % 3 != 1).collect();
                for (i, kept) in kept.chunks(per_instance).enumerate() {
                    let rows = (&mut attention, &mut lanes);
                    recompute(dims, &x, (i, &every), rows, &mut block);
                    assert!(same(&attention, kept), "{dims:?}, instance {i}");
                    let rows = (&mut attention, &mut lanes);
                    recompute(dims, &x, (i, &some), rows, &mut block);
                    let row = per_instance / starts;
                    let want: Vec<f32> = (some.iter())
                        .flat_map(|&r| kept[r * row..][..row].iter().copied())
                        .collect();
                    // The buffer keeps its length (it is only grown); the rows are its front.
                    let recomputed = &attention[..want.len()];
                    assert!(same(recomputed, &want), "{dims:?}, instance {i}, some rows");
                }
                let grads = |saved: &Saved| {
                    let from = BackIn {
                        x: &x,
                        saved,
                        grad_out: &data.grad_out,
                    };
                    let g = backward_with(dims, scale, &from, backward);
                    let (keys, values, tables) =
                        (g.glimpse_keys, g.glimpse_values, g.compat_tables);
                    [g.query, keys, values, g.logit_keys, tables]
                };
                let with_kept = grads(&saved);
                saved.attention = None;
                for (a, b) in with_kept.iter().zip(grads(&saved)) {
                    assert!(same(a, &b), "{dims:?}");
                }
            }
        }
    }

    /// Gradients added to sums a decode's steps share: each sum becomes `sum + step`, the
    /// step's gradient as [`backward`] gives it fresh, bit for bit (as autodiff adds them),
    /// and comes back empty in the [`Grads`]; the others are as fresh. Sums of both signs
    /// and zeros of both signs, with the compatibilities from products and from tables.
    #[test]
    fn gradients_add_to_their_sums_as_autodiff_adds_them() {
        for data in with_and_without_tables(&[(3, 20, 21), (2, 7, 11), (2, 1, 5)]) {
            let (dims, scale, x) = (data.dims, Scale::new(10.0, 1.0), data.inputs());
            let (_, saved) = forward(dims, scale, &x);
            let fresh = backward(dims, scale, &x, &saved, &data.grad_out);
            let mut sums: Vec<Vec<f32>> = [&fresh.glimpse_values, &fresh.compat_tables]
                .iter()
                .enumerate()
                .map(|(k, g)| {
                    let mut sum = pseudo_random(g.len(), 17 + k as u64, 3.0);
                    if let [a, b, ..] = &mut sum[..] {
                        (*a, *b) = (0.0, -0.0);
                    }
                    sum
                })
                .collect();
            let before = sums.clone();
            let [values, tables] = &mut sums[..] else {
                unreachable!()
            };
            let given = StepSums {
                glimpse_values: Some(values),
                compat_tables: (x.compat.is_some()).then_some(&mut tables[..]),
                ..StepSums::default()
            };
            let passed = (&x, &saved);
            let added = backward_adding(dims, scale, passed, &data.grad_out, given);
            let expect = |sum: &[f32], step: &[f32]| -> Vec<f32> {
                sum.iter().zip(step).map(|(s, g)| g + s).collect()
            };
            assert!(same(&sums[0], &expect(&before[0], &fresh.glimpse_values)));
            assert!(added.glimpse_values.is_empty());
            if x.compat.is_some() {
                assert!(same(&sums[1], &expect(&before[1], &fresh.compat_tables)));
                assert!(added.compat_tables.is_empty());
                // The tables carry the queries' and keys' gradients.
                for g in [&fresh.query, &fresh.glimpse_keys, &added.query] {
                    assert!(g.is_empty(), "{dims:?}");
                }
            } else {
                assert!(same(&sums[1], &before[1]));
            }
            let kept = [added.query, added.glimpse_keys, added.logit_keys];
            let fresh = [fresh.query, fresh.glimpse_keys, fresh.logit_keys];
            assert!(kept.iter().zip(&fresh).all(|(a, b)| same(a, b)), "{dims:?}");
        }
    }

    /// One POMO-sized step (64 instances × 20 starts, 21 nodes, d = 128, 8 heads), forward
    /// and backward, for counting instructions:
    /// `RAYON_NUM_THREADS=1 valgrind --tool=callgrind TEST_BINARY --ignored pomo_sized_step`.
    /// `ROUTEBURN_STEP_SIZE=N` makes it CVRP`N`'s (N starts, N + 1 nodes).
    #[test]
    #[ignore = "a profiling harness, not a check"]
    fn pomo_sized_step() {
        let customers = std::env::var("ROUTEBURN_STEP_SIZE").map_or(20, |n| n.parse().unwrap());
        let dims = Dims {
            instances: 64,
            starts: customers,
            nodes: customers + 1,
            heads: 8,
            head_dim: 16,
        };
        let data = StepData::new(dims);
        let (inputs, scale) = (data.inputs(), Scale::new(10.0, 1.0));
        // ROUTEBURN_STEP_REPEATS=K runs the step K times and prints each pass's mean time.
        let repeats = std::env::var("ROUTEBURN_STEP_REPEATS").map_or(1, |k| k.parse().unwrap());
        let (mut forward_time, mut backward_time) = (0.0, 0.0);
        for _ in 0..repeats {
            let clock = std::time::Instant::now();
            let (_, saved) = forward(dims, scale, &inputs);
            forward_time += clock.elapsed().as_secs_f64();
            let clock = std::time::Instant::now();
            let grads = backward(dims, scale, &inputs, &saved, &data.grad_out);
            backward_time += clock.elapsed().as_secs_f64();
            assert!(grads.glimpse_keys.iter().all(|g| g.is_finite()));
        }
        let ms = |t: f64| 1e3 * t / repeats as f64;
        println!(
            "forward {:.3} ms, backward {:.3} ms",
            ms(forward_time),
            ms(backward_time)
        );
    }
}
