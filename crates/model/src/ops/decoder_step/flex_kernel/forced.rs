//! Rows with one node open: a tour finished and waiting at the depot, or a return to the
//! depot that the remaining capacity forces. Such a row's only choice has probability one
//! whatever its logits, so its log-probabilities are 0 there and −∞ elsewhere and its
//! gradients are zero. The kernels are given the other rows and run on them alone (in
//! blocks, each of consecutive rows read in place or else gathered); the forced rows'
//! log-probabilities are written here.
//!
//! The same numbers as running every row, bit for bit: rows are independent in the forward
//! pass, and the general path gives a forced row exactly these log-probabilities (the
//! softmax's one term is `exp(0) = 1`). In the backward pass it gives the row zero logit
//! gradients (`g − 1 · g`, the output gradient reaching the one node it may choose), so
//! the row adds only products `x · ±0` to the node tables' sums; those start at +0 and
//! such terms leave every sum as it is. A loss with a gradient at a masked node (whose
//! log-probability is −∞) would break the last step, and is not one a decode makes.
//!
//! The backward pass leaves out, by the same argument, every row whose output gradient is
//! zero at every node: a tour that the loss does not learn from (a POMO tour whose
//! advantage is zero, `reinforce.learn_from`). Its logit gradients are `0 − p · 0`.

use super::{
    BackBuffers, BackIn, BackwardInstance, Dims, ForwardPiece, Inputs, InstanceGradsOut, PieceOut,
    Scale,
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

/// The rows of `forced` that are not.
fn live_rows(forced: &[Option<usize>]) -> Vec<usize> {
    (forced.iter().enumerate())
        .filter_map(|(r, choice)| choice.is_none().then_some(r))
        .collect()
}

/// Whether a row's output gradient is zero at every node: a tour the loss does not learn
/// from (its advantage zero). Like a forced row's, its logit gradients are `0 − p · 0`.
fn without_gradient(grad: &[f32]) -> bool {
    // Sixteen at a time without a branch each, which vectorises: a row's gradient is
    // usually at one node, and `all` stopped there only after a branch per node before it.
    (grad.chunks(16)).all(|chunk| chunk.iter().fold(true, |zero, &g| zero & (g == 0.0)))
}

/// Rows `first..` of instance `i` (as many as `out` holds) through `kernel`, its forced
/// rows left out. The forward pass keeps nothing for a forced row (the others' values are
/// packed, [`super::Saved`]): the backward pass leaves those rows out too.
pub(super) fn forward_unit(
    dims: Dims,
    scale: Scale,
    (x, i, first): (&Inputs, usize, usize),
    mut out: PieceOut,
    kernel: ForwardPiece,
) {
    let n = dims.nodes;
    let rows = out.log_probs.len() / n;
    let at = i * dims.starts + first;
    let forced = forced_choices(&x.mask[at * n..(at + rows) * n], n);
    let live = live_rows(&forced);
    if !live.is_empty() {
        kernel(dims, scale, (x, i, first), out.reborrow(), &live);
    }
    for (row, choice) in out.log_probs.chunks_exact_mut(n).zip(&forced) {
        if let Some(node) = *choice {
            row.fill(f32::NEG_INFINITY);
            row[node] = 0.0;
        }
    }
}

/// Instance `i`'s gradients through `kernel`, its forced rows and rows without gradient
/// left out: their query gradients are zero, and they add nothing to the node tables'
/// (zero where every row is left out). `out` is unwritten until then.
pub(super) fn backward_unit(
    dims: Dims,
    scale: Scale,
    (from, i): (&BackIn, usize),
    (dq, dk, dv, dl, dt): InstanceGradsOut,
    (kernel, buffers): (BackwardInstance, &mut BackBuffers),
) {
    let (n, s, w) = (dims.nodes, dims.starts, from.x.query_grad_width(dims));
    let (at, piece_rows) = (i * s, from.saved.piece_rows);
    let forced = forced_choices(&from.x.mask[at * n..(at + s) * n], n);
    let grads = from.grad_out[at * n..(at + s) * n].chunks_exact(n);
    let (mut live, mut slots) = (Vec::with_capacity(s), Vec::with_capacity(s));
    let mut slot = 0;
    for (r, (choice, grad)) in forced.iter().zip(grads).enumerate() {
        if r % piece_rows == 0 {
            slot = r;
        }
        if choice.is_some() {
            dq[r * w..(r + 1) * w].fill(0.0);
            continue;
        }
        // The forward pass kept the row at its piece's next slot ([`super::Saved`]).
        slot += 1;
        if without_gradient(grad) {
            dq[r * w..(r + 1) * w].fill(0.0);
        } else {
            live.push(r);
            slots.push(slot - 1);
        }
    }
    if live.is_empty() {
        for table in [dk, dv, dl] {
            table.fill(0.0);
        }
        // Zero, added to a sum, changes no bit ([`super::table_grads`]).
        if !dt.adding {
            dt.out.fill(0.0);
        }
    } else {
        let live = (&live[..], &slots[..]);
        kernel(dims, scale, (from, i), (dq, dk, dv, dl, dt), buffers, live);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{same, StepData};
    use super::super::{
        backward_instance, backward_instance_dispatch, forward_piece, forward_piece_dispatch,
        forward_with, Grads, KeptOut, Pieces, Saved, TableGrad,
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
    /// 2: all; instance 3: row 5 and the last two (so that some blocks of the rows left
    /// are consecutive and some are not). A forced row's output gradient is at its one
    /// open node only, as a decode's loss puts it (on the node chosen).
    fn with_forced_rows(instances: usize, starts: usize, nodes: usize) -> StepData {
        let mut data = StepData::of_size(instances, starts, nodes);
        for row in 0..instances * starts {
            let (instance, start) = (row / starts, row % starts);
            let forced = match instance {
                0 => start % 3 == 0,
                1 => false,
                2 => true,
                // Finished tours at the end, and one row among consecutive ones.
                _ => start == 5 || start + 2 >= starts,
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

    /// [`with_forced_rows`] and, among the rows that are not forced, every fourth from
    /// the second on without an output gradient (a tour the loss does not learn from).
    fn with_rows_without_gradient(instances: usize, starts: usize, nodes: usize) -> StepData {
        let mut data = with_forced_rows(instances, starts, nodes);
        for row in (1..instances * starts).step_by(4) {
            let mask = &data.mask[row * nodes..][..nodes];
            if forced_choice(mask).is_none() {
                data.grad_out[row * nodes..][..nodes].fill(0.0);
            }
        }
        data
    }

    #[test]
    fn a_row_without_gradient_is_left_out_of_the_backward() {
        assert!(without_gradient(&[0.0, 0.0, 0.0]));
        assert!(!without_gradient(&[0.0, -1e-30, 0.0]));
        // Past the first sixteen, and zeros of both signs.
        let mut long = [-0.0f32; 37];
        assert!(without_gradient(&long));
        long[36] = 2.0;
        assert!(!without_gradient(&long));
        let data = with_rows_without_gradient(4, 7, 11);
        let rows = (0..28).filter(|&r| {
            let m = &data.mask[r * 11..][..11];
            forced_choice(m).is_none() && without_gradient(&data.grad_out[r * 11..][..11])
        });
        // Rows 1, 5, 9, ..., 25 but 17 (instance 2's, forced): instance 0's starts 1 and 5
        // (0, 3 and 6 forced), instance 1's 2 and 6, instance 3's 0 and 4 (5, 6 forced).
        assert_eq!(rows.collect::<Vec<_>>(), vec![1, 5, 9, 13, 21, 25]);
    }

    /// The kernels run on every row, no row left out: what [`forward_unit`] and
    /// [`backward_unit`] must reproduce.
    fn every_row(
        data: &StepData,
        (forward, backward): (ForwardPiece, BackwardInstance),
    ) -> (Vec<f32>, Grads) {
        let (dims, scale, x) = (data.dims, Scale::new(10.0, 1.0), data.inputs());
        let (n, h, d, s) = (dims.nodes, dims.heads, dims.embed(), dims.starts);
        let every: Vec<usize> = (0..s).collect();
        // Each instance's table gradient (one unread value without tables).
        let tables = match x.compat {
            Some(_) => super::super::table_len(dims),
            None => 1,
        };
        let mut log_probs = vec![0.0; dims.rows() * n];
        let mut saved = Saved {
            attention: None,
            glimpse: vec![0.0; dims.rows() * d],
            tanh: vec![0.0; dims.rows() * n],
            log_sum: vec![0.0; dims.rows()],
            piece_rows: s,
        };
        let mut attention = vec![0.0; dims.rows() * h * n];
        for i in 0..dims.instances {
            let out = PieceOut {
                log_probs: &mut log_probs[i * s * n..][..s * n],
                kept: Some(KeptOut {
                    glimpse: &mut saved.glimpse[i * s * d..][..s * d],
                    tanh: &mut saved.tanh[i * s * n..][..s * n],
                    log_sum: &mut saved.log_sum[i * s..][..s],
                    attention: Some(&mut attention[i * s * h * n..][..s * h * n]),
                }),
            };
            forward(dims, scale, (&x, i, 0), out, &every);
        }
        saved.attention = Some(attention);
        let from = BackIn {
            x: &x,
            saved: &saved,
            grad_out: &data.grad_out,
        };
        let mut grads = Grads {
            query: vec![0.0; dims.rows() * d],
            glimpse_keys: vec![0.0; dims.instances * n * d],
            glimpse_values: vec![0.0; dims.instances * n * d],
            logit_keys: vec![0.0; dims.instances * n * d],
            compat_tables: vec![0.0; dims.instances * tables],
        };
        for i in 0..dims.instances {
            let out = (
                &mut grads.query[i * s * d..][..s * d],
                &mut grads.glimpse_keys[i * n * d..][..n * d],
                &mut grads.glimpse_values[i * n * d..][..n * d],
                &mut grads.logit_keys[i * n * d..][..n * d],
                TableGrad {
                    out: &mut grads.compat_tables[i * tables..][..tables],
                    adding: false,
                },
            );
            backward(
                dims,
                scale,
                (&from, i),
                out,
                &mut BackBuffers::default(),
                (&every, &every),
            );
        }
        if x.compat.is_none() {
            grads.compat_tables.clear();
        } else {
            // The tables carry the queries' and keys' gradients: none is written.
            grads.query.clear();
            grads.glimpse_keys.clear();
        }
        (log_probs, grads)
    }

    /// With forced rows and rows without gradient left out, kept attention or not and in pieces of 8 rows or whole
    /// instances: the log-probabilities and gradients of every row run, bit for bit, in
    /// the plain form and the one this CPU picks.
    #[test]
    fn leaving_forced_rows_out_changes_no_number() {
        let forms: [(ForwardPiece, BackwardInstance); 2] = [
            (forward_piece::<Plain>, backward_instance::<Plain>),
            (forward_piece_dispatch, backward_instance_dispatch),
        ];
        let sizes = [(20, 21), (7, 11), (1, 5)];
        let cases = sizes.into_iter().flat_map(|(starts, nodes)| {
            [
                with_forced_rows(4, starts, nodes),
                with_forced_rows(4, starts, nodes).with_tables(),
                with_rows_without_gradient(4, starts, nodes),
                with_rows_without_gradient(4, starts, nodes).with_tables(),
            ]
        });
        for data in cases {
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
                    assert!(same(&got.compat_tables, &want.compat_tables), "{case}");
                }
            }
        }
    }
}
