pub mod check;
pub mod compare;
pub mod eval;
pub mod gen;
pub mod label;
pub mod plot;
pub mod solve;
pub mod train;
