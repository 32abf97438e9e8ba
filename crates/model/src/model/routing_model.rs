//! Either model behind one interface, so evaluation and solving treat them alike.

use burn::module::Module;

use crate::model::attention_model::AttentionModel;
use crate::model::decode::{DecodeOptions, DecodeOutput, Policy};
use crate::model::pointer_network::PointerNetwork;
use crate::model::problem::DeviceBatch;

// A program holds one or two of these, never a collection: the size difference between the
// variants costs nothing, and Burn's `Module` is not implemented for `Box`.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum RoutingModel {
    Attention(AttentionModel),
    Pointer(PointerNetwork),
}

impl RoutingModel {
    /// A full decode of every instance; see [`AttentionModel::decode`].
    pub fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput {
        match self {
            Self::Attention(m) => m.decode(problem, options),
            Self::Pointer(m) => m.decode(problem, options),
        }
    }
}

impl From<AttentionModel> for RoutingModel {
    fn from(m: AttentionModel) -> Self {
        Self::Attention(m)
    }
}

impl From<PointerNetwork> for RoutingModel {
    fn from(m: PointerNetwork) -> Self {
        Self::Pointer(m)
    }
}

impl Policy for RoutingModel {
    fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput {
        RoutingModel::decode(self, problem, options)
    }
}
