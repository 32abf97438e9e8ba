//! Rows with one node open: a tour finished and waiting at the depot, or a return to the
//! depot that the remaining capacity forces. Such a row's only choice has probability one
//! whatever its logits, so its log-probabilities are 0 there and −∞ elsewhere and its
//! gradients are zero. The kernels run on the other rows only, gathered into contiguous
//! blocks as a one-instance step; the forced rows' log-probabilities are written here.
//!
//! The same numbers as running every row, bit for bit: rows are independent in the forward
//! pass, and the general path gives a forced row exactly these log-probabilities (the
//! softmax's one term is `exp(0) = 1`). In the backward pass it gives the row zero logit
//! gradients (`g − 1 · g`, the output gradient reaching the one node it may choose), so
//! the row adds only products `x · ±0` to the node tables' sums; those start at +0 and
//! such terms leave every sum as it is. A loss with a gradient at a masked node (whose
//! log-probability is −∞) would break the last step, and is not one a decode makes.

use super::{
    by_feature_block, BackBuffers, BackIn, BackwardInstance, Dims, ForwardPiece, Inputs,
    InstanceGradsOut, PieceOut, Saved, Scale,
};

/// The node a row must choose, where its mask leaves exactly one open.
fn forced_choice(mask: &[u8]) -> Option<usize> {
    let mut open = (mask.iter().enumerate()).filter_map(|(node, &m)| (m == 0).then_some(node));
    match (open.next(), open.next()) {
        (Some(node), None) => Some(node),
        _ => None,
    }
}

/// Consecutive rows' forced choices, from their masks `[rows, N]`.
fn forced_choices(masks: &[u8], nodes: usize) -> Vec<Option<usize>> {
    masks.chunks_exact(nodes).map(forced_choice).collect()
}

/// One instance's rows that have a choice, gathered: their places among the rows
/// considered, their queries `[L, d]` and masks `[L, N]`.
struct Gathered {
    rows: Vec<usize>,
    query: Vec<f32>,
    mask: Vec<u8>,
}

impl Gathered {
    /// The rows of `forced` that are not, the first of them the batch's row `at`.
    fn new(x: &Inputs, dims: Dims, at: usize, forced: &[Option<usize>]) -> Self {
        let rows: Vec<usize> = (forced.iter().enumerate())
            .filter_map(|(r, choice)| choice.is_none().then_some(r))
            .collect();
        Self {
            query: rows_of(x.query, dims.embed(), at, &rows),
            mask: rows_of(x.mask, dims.nodes, at, &rows),
            rows,
        }
    }

    /// The gathered rows as a step of one instance: instance `i`'s node tables.
    fn inputs<'a>(&'a self, x: &Inputs<'a>, dims: Dims, i: usize) -> Inputs<'a> {
        let tables = i * dims.nodes * dims.embed()..(i + 1) * dims.nodes * dims.embed();
        let (keys, values, logit_keys) = (x.glimpse_keys, x.glimpse_values, x.logit_keys);
        Inputs {
            query: &self.query,
            glimpse_keys: &keys[tables.clone()],
            glimpse_values: &values[tables.clone()],
            logit_keys: &logit_keys[tables],
            by_feature: by_feature_block(x, dims, i),
            mask: &self.mask,
        }
    }

    fn dims(&self, dims: Dims) -> Dims {
        Dims {
            instances: 1,
            starts: self.rows.len(),
            ..dims
        }
    }

    /// Writes each gathered row's `width` values back to its place in `out`.
    fn scatter(&self, gathered: &[f32], width: usize, out: &mut [f32]) {
        for (j, &r) in self.rows.iter().enumerate() {
            out[r * width..][..width].copy_from_slice(&gathered[j * width..][..width]);
        }
    }
}

/// Rows `at + r` (r in `rows`) of a `[R, width]` table, one after another.
fn rows_of<T: Copy>(table: &[T], width: usize, at: usize, rows: &[usize]) -> Vec<T> {
    let mut gathered = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        gathered.extend_from_slice(&table[(at + r) * width..][..width]);
    }
    gathered
}

/// Rows `first..` of instance `i` (as many as `out` holds) through `kernel`, its forced
/// rows left out. What the forward pass keeps for a forced row stays as `out` had it (the
/// backward pass leaves those rows out too).
pub(super) fn forward_unit(
    dims: Dims,
    scale: Scale,
    (x, i, first): (&Inputs, usize, usize),
    out: PieceOut,
    kernel: ForwardPiece,
) {
    let (n, h, d) = (dims.nodes, dims.heads, dims.embed());
    let rows = out.log_probs.len() / n;
    let at = i * dims.starts + first;
    let forced = forced_choices(&x.mask[at * n..(at + rows) * n], n);
    if forced.iter().all(Option::is_none) {
        kernel(dims, scale, (x, i, first), out);
        return;
    }
    let gathered = Gathered::new(x, dims, at, &forced);
    let live = gathered.rows.len();
    if live > 0 {
        let mut log_probs = vec![0.0; live * n];
        let mut kept = out.kept.as_ref().map(|(_, _, attention)| {
            let attention = attention.as_ref().map(|_| vec![0.0; live * h * n]);
            (vec![0.0; live * d], vec![0.0; live * n], attention)
        });
        let gathered_out = PieceOut {
            log_probs: &mut log_probs,
            kept: kept.as_mut().map(|(glimpse, tanh, attention)| {
                (&mut glimpse[..], &mut tanh[..], attention.as_deref_mut())
            }),
        };
        let inputs = gathered.inputs(x, dims, i);
        kernel(gathered.dims(dims), scale, (&inputs, 0, 0), gathered_out);
        gathered.scatter(&log_probs, n, out.log_probs);
        if let (Some((glimpse, tanh, attention)), Some(kept)) = (out.kept, kept) {
            gathered.scatter(&kept.0, d, glimpse);
            gathered.scatter(&kept.1, n, tanh);
            if let (Some(attention), Some(kept)) = (attention, kept.2) {
                gathered.scatter(&kept, h * n, attention);
            }
        }
    }
    for (row, choice) in out.log_probs.chunks_exact_mut(n).zip(&forced) {
        if let Some(node) = *choice {
            row.fill(f32::NEG_INFINITY);
            row[node] = 0.0;
        }
    }
}

/// Instance `i`'s gradients through `kernel`, its forced rows left out: their query
/// gradients stay zero, as `out` has them, and they add nothing to the node tables'.
pub(super) fn backward_unit(
    dims: Dims,
    scale: Scale,
    (from, i): (&BackIn, usize),
    out: InstanceGradsOut,
    (kernel, buffers): (BackwardInstance, &mut BackBuffers),
) {
    let (n, h, d, s) = (dims.nodes, dims.heads, dims.embed(), dims.starts);
    let at = i * s;
    let forced = forced_choices(&from.x.mask[at * n..(at + s) * n], n);
    if forced.iter().all(Option::is_none) {
        kernel(dims, scale, (from, i), out, buffers);
        return;
    }
    let gathered = Gathered::new(from.x, dims, at, &forced);
    if gathered.rows.is_empty() {
        return;
    }
    let rows = &gathered.rows;
    let saved = Saved {
        attention: (from.saved.attention.as_ref()).map(|a| rows_of(&a[..], h * n, at, rows)),
        glimpse: rows_of(&from.saved.glimpse[..], d, at, rows),
        tanh: rows_of(&from.saved.tanh[..], n, at, rows),
    };
    let (log_probs, grad_out) = (
        rows_of(from.log_probs, n, at, rows),
        rows_of(from.grad_out, n, at, rows),
    );
    let inputs = gathered.inputs(from.x, dims, i);
    let gathered_from = BackIn {
        x: &inputs,
        log_probs: &log_probs,
        saved: &saved,
        grad_out: &grad_out,
    };
    let (d_query, d_keys, d_values, d_logit_keys) = out;
    let mut gathered_query = vec![0.0; rows.len() * d];
    let gathered_out = (&mut gathered_query[..], d_keys, d_values, d_logit_keys);
    kernel(
        gathered.dims(dims),
        scale,
        (&gathered_from, 0),
        gathered_out,
        buffers,
    );
    gathered.scatter(&gathered_query, d, d_query);
}

#[cfg(test)]
mod tests {
    use super::super::tests::{same, StepData};
    use super::super::{
        backward_instance, backward_instance_dispatch, forward_piece, forward_piece_dispatch,
        forward_with, Grads, Pieces,
    };
    use super::*;
    use crate::ops::row_kernels::Plain;

    #[test]
    fn a_row_is_forced_where_one_node_is_open() {
        assert_eq!(forced_choice(&[1, 1, 0, 1]), Some(2));
        assert_eq!(forced_choice(&[0, 1, 1]), Some(0));
        assert_eq!(forced_choice(&[0, 1, 0]), None);
        assert_eq!(forced_choice(&[1, 1, 1]), None);
        assert_eq!(forced_choice(&[0]), Some(0));
    }

    /// Instance 0: every third row forced (at node `row % N`); instance 1: none; instance
    /// 2: all. A forced row's output gradient is at its one open node only, as a decode's
    /// loss puts it (on the node chosen).
    fn with_forced_rows(instances: usize, starts: usize, nodes: usize) -> StepData {
        let mut data = StepData::of_size(instances, starts, nodes);
        for row in 0..instances * starts {
            let (instance, start) = (row / starts, row % starts);
            let forced = match instance {
                0 => start % 3 == 0,
                1 => false,
                _ => true,
            };
            if forced {
                let open = row % nodes;
                let mask = &mut data.mask[row * nodes..][..nodes];
                let grad = &mut data.grad_out[row * nodes..][..nodes];
                for node in 0..nodes {
                    mask[node] = u8::from(node != open);
                    if node != open {
                        grad[node] = 0.0;
                    }
                }
            }
        }
        data
    }

    /// The kernels run on every row, no row left out: what [`forward_unit`] and
    /// [`backward_unit`] must reproduce.
    fn every_row(
        data: &StepData,
        (forward, backward): (ForwardPiece, BackwardInstance),
    ) -> (Vec<f32>, Grads) {
        let (dims, scale, x) = (data.dims, Scale::new(10.0, 1.0), data.inputs());
        let (n, h, d, s) = (dims.nodes, dims.heads, dims.embed(), dims.starts);
        let mut log_probs = vec![0.0; dims.rows() * n];
        let mut saved = Saved {
            attention: None,
            glimpse: vec![0.0; dims.rows() * d],
            tanh: vec![0.0; dims.rows() * n],
        };
        let mut attention = vec![0.0; dims.rows() * h * n];
        for i in 0..dims.instances {
            let out = PieceOut {
                log_probs: &mut log_probs[i * s * n..][..s * n],
                kept: Some((
                    &mut saved.glimpse[i * s * d..][..s * d],
                    &mut saved.tanh[i * s * n..][..s * n],
                    Some(&mut attention[i * s * h * n..][..s * h * n]),
                )),
            };
            forward(dims, scale, (&x, i, 0), out);
        }
        saved.attention = Some(attention);
        let from = BackIn {
            x: &x,
            log_probs: &log_probs,
            saved: &saved,
            grad_out: &data.grad_out,
        };
        let mut grads = Grads {
            query: vec![0.0; dims.rows() * d],
            glimpse_keys: vec![0.0; dims.instances * n * d],
            glimpse_values: vec![0.0; dims.instances * n * d],
            logit_keys: vec![0.0; dims.instances * n * d],
        };
        for i in 0..dims.instances {
            let out = (
                &mut grads.query[i * s * d..][..s * d],
                &mut grads.glimpse_keys[i * n * d..][..n * d],
                &mut grads.glimpse_values[i * n * d..][..n * d],
                &mut grads.logit_keys[i * n * d..][..n * d],
            );
            backward(dims, scale, (&from, i), out, &mut BackBuffers::default());
        }
        (log_probs, grads)
    }

    /// With forced rows left out, kept attention or not and in pieces of 8 rows or whole
    /// instances: the log-probabilities and gradients of every row run, bit for bit, in
    /// the plain form and the one this CPU picks.
    #[test]
    fn leaving_forced_rows_out_changes_no_number() {
        let forms: [(ForwardPiece, BackwardInstance); 2] = [
            (forward_piece::<Plain>, backward_instance::<Plain>),
            (forward_piece_dispatch, backward_instance_dispatch),
        ];
        for (starts, nodes) in [(20, 21), (7, 11), (1, 5)] {
            let data = with_forced_rows(3, starts, nodes);
            let (dims, scale, x) = (data.dims, Scale::new(10.0, 1.0), data.inputs());
            for kernels in forms {
                let (want_log_probs, want) = every_row(&data, kernels);
                let unkept = Pieces {
                    rows: 8,
                    keep: false,
                    keep_attention: false,
                };
                let (log_probs, _) = forward_with(dims, scale, &x, unkept, kernels.0);
                assert!(same(&log_probs, &want_log_probs), "{dims:?} {unkept:?}");
                for (rows, keep_attention) in [(8, true), (8, false), (24, false)] {
                    let pieces = Pieces {
                        rows,
                        keep: true,
                        keep_attention,
                    };
                    let (log_probs, _, got) = data.passes(pieces, kernels);
                    let case = format!("{dims:?} {pieces:?}");
                    assert!(same(&log_probs, &want_log_probs), "log-probs, {case}");
                    assert!(same(&got.query, &want.query), "d_query, {case}");
                    assert!(
                        same(&got.glimpse_keys, &want.glimpse_keys),
                        "d_keys, {case}"
                    );
                    assert!(same(&got.glimpse_values, &want.glimpse_values), "{case}");
                    assert!(same(&got.logit_keys, &want.logit_keys), "{case}");
                }
            }
        }
    }
}
