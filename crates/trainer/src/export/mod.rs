//! Trained attention models as PyTorch checkpoints that the field's code loads: Kool et
//! al.'s (`epoch-N.pt` and `args.json`, [`kool`]) and rl4co's (`AttentionModelPolicy`
//! weights with `policy_kwargs`, [`rl4co`]). Each is the import's table of names read from
//! right to left, so that the published and fixture models come back out as the tensors
//! they went in as; [`torch_file`] writes the file.

pub(crate) mod kool;
pub(crate) mod rl4co;
pub(crate) mod torch_file;

use std::collections::HashMap;

use burn::store::ModuleSnapshot;
use burn::tensor::DType;
use routeburn_model::{AttentionModel, Normalization};
use thiserror::Error;

use crate::config::AttentionConfig;
use crate::import::{f32s_from_le, norm_parameters, transposed};
use torch_file::NamedTensor;

/// Whose checkpoint `export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Kool et al.'s attention-learn-to-route: `epoch-N.pt` and `args.json`.
    Kool,
    /// rl4co's `AttentionModelPolicy`: `policy.ckpt` with `state_dict` and
    /// `hyper_parameters.policy_kwargs`.
    Rl4co,
}

impl Format {
    /// "Kool's", "rl4co's": whose model the files hold.
    pub(crate) fn whose(self) -> &'static str {
        match self {
            Format::Kool => "Kool's",
            Format::Rl4co => "rl4co's",
        }
    }
}

/// Why a model cannot be written in the other project's format.
#[derive(Debug, Error)]
pub(crate) enum ExportError {
    /// A configuration the other project's model has no form for.
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("`{name}` is {dtype}; PyTorch's models are float32")]
    NotFloat32 { name: String, dtype: String },
    #[error("routeburn's attention model has no `{0}`")]
    Missing(String),
    #[error("`{name}` has shape {shape:?}, not {expected}")]
    Shape {
        name: String,
        shape: Vec<usize>,
        expected: &'static str,
    },
    /// A parameter left over once the other model's tensors are all made.
    #[error("routeburn's `{name}` has no place in {model}")]
    Unplaced { name: String, model: &'static str },
    #[error("reading the model's tensors: {0}")]
    Snapshot(String),
    #[error("writing the PyTorch archive: {0}")]
    Archive(#[from] zip::result::ZipError),
}

/// The files of an exported model (names within the output directory, bytes), and what a
/// user of them should know.
pub(crate) struct Exported {
    pub(crate) files: Vec<(String, Vec<u8>)>,
    /// Where the other code would not decode as routeburn does without a change.
    pub(crate) warnings: Vec<String>,
}

/// `model` (built from `config`, trained on `graph_size` customers, checkpointed after
/// `epochs` epochs) in `format`, or why that format cannot hold it.
pub(crate) fn export(
    format: Format,
    model: &AttentionModel,
    config: &AttentionConfig,
    graph_size: usize,
    epochs: usize,
) -> Result<Exported, ExportError> {
    match format {
        Format::Kool => kool::checkpoint(model, config, graph_size, epochs),
        Format::Rl4co => rl4co::checkpoint(model, config),
    }
}

/// routeburn's parameters not yet placed, and the other model's tensors made from them so
/// far.
struct Params {
    remaining: HashMap<String, (Vec<usize>, Vec<f32>)>,
    out: Vec<NamedTensor>,
}

impl Params {
    fn of(model: &AttentionModel) -> Result<Self, ExportError> {
        let mut remaining = HashMap::new();
        for t in model.collect(None, None, false) {
            if t.dtype != DType::F32 {
                return Err(ExportError::NotFloat32 {
                    name: t.name.clone(),
                    dtype: format!("{:?}", t.dtype),
                });
            }
            let (name, _, shape, _, bytes) = t
                .into_parts()
                .map_err(|e| ExportError::Snapshot(e.to_string()))?;
            remaining.insert(name, (shape.to_vec(), f32s_from_le(&bytes)));
        }
        Ok(Self {
            remaining,
            out: vec![],
        })
    }

    fn take(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f32>), ExportError> {
        self.remaining
            .remove(name)
            .ok_or_else(|| ExportError::Missing(name.to_string()))
    }

    fn push(&mut self, name: String, shape: Vec<usize>, values: Vec<f32>) {
        self.out.push(NamedTensor {
            name,
            shape,
            values,
        });
    }

    /// Burn's `[in, out]` linear weight as PyTorch's `[out, in]`, the bias as it is.
    fn linear(&mut self, from: &str, to: &str, bias: bool) -> Result<(), ExportError> {
        let (shape, w) = self.take(&format!("{from}.weight"))?;
        let [rows, cols] = shape[..] else {
            return Err(ExportError::Shape {
                name: format!("{from}.weight"),
                shape,
                expected: "[in, out]",
            });
        };
        self.push(
            format!("{to}.weight"),
            vec![cols, rows],
            transposed(&w, rows, cols),
        );
        if bias {
            let (shape, b) = self.take(&format!("{from}.bias"))?;
            self.push(format!("{to}.bias"), shape, b);
        }
        Ok(())
    }

    /// A normaliser as PyTorch's (`weight`, `bias`, batch norm's running statistics).
    fn norm(&mut self, from: &str, to: &str, norm: Normalization) -> Result<(), ExportError> {
        let (variant, stats) = norm_parameters(norm);
        for (ours, theirs) in [("gamma", "weight"), ("beta", "bias")]
            .into_iter()
            .chain(stats.iter().map(|s| (*s, *s)))
        {
            let (shape, values) = self.take(&format!("{from}.{variant}.{ours}"))?;
            self.push(format!("{to}.{theirs}"), shape, values);
        }
        Ok(())
    }

    /// Encoder layer `from` after its attention, as PyTorch's `Sequential` of skip
    /// connections `to`: normaliser 1, the feed-forward pair in module 2 (`feed_forward`:
    /// the pair's names there), normaliser 3.
    fn norms_and_feed_forward(
        &mut self,
        from: &str,
        to: &str,
        feed_forward: [&str; 2],
        norm: Normalization,
    ) -> Result<(), ExportError> {
        self.norm(
            &format!("{from}.attention_norm"),
            &format!("{to}.1.normalizer"),
            norm,
        )?;
        for (ours, theirs) in ["feed_forward_in", "feed_forward_out"]
            .into_iter()
            .zip(feed_forward)
        {
            self.linear(
                &format!("{from}.{ours}"),
                &format!("{to}.2.module.{theirs}"),
                true,
            )?;
        }
        self.norm(
            &format!("{from}.feed_forward_norm"),
            &format!("{to}.3.normalizer"),
            norm,
        )
    }

    /// The tensors made, once every routeburn parameter has been placed.
    fn finish(self, model: &'static str) -> Result<Vec<NamedTensor>, ExportError> {
        match self.remaining.keys().min() {
            Some(left) => Err(ExportError::Unplaced {
                name: left.clone(),
                model,
            }),
            None => Ok(self.out),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};

    use burn::store::pytorch::PytorchReader;

    use crate::config::AttentionConfig;

    /// A scratch directory for one test.
    pub(crate) fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("routeburn-export-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A small attention model's config: d = 16, one layer, a 32-wide feed-forward.
    pub(crate) fn small_config(num_heads: usize) -> AttentionConfig {
        AttentionConfig {
            embed_dim: 16,
            num_heads,
            num_layers: 1,
            feed_forward_dim: 32,
            ..AttentionConfig::default()
        }
    }

    /// Every tensor of the file's `top_key` state dict: its shape and bytes by name.
    pub(crate) fn state_dict(path: &Path, top_key: &str) -> HashMap<String, (Vec<usize>, Vec<u8>)> {
        PytorchReader::with_top_level_key(path, top_key)
            .unwrap()
            .into_tensors()
            .into_iter()
            .map(|(name, t)| (name, (t.shape().to_vec(), t.read().unwrap())))
            .collect()
    }
}
