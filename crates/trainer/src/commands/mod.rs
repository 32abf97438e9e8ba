pub(crate) mod check;
pub(crate) mod compare;
pub(crate) mod eval;
pub(crate) mod gen;
pub(crate) mod label;
pub(crate) mod plot;
pub(crate) mod solve;
pub(crate) mod train;
