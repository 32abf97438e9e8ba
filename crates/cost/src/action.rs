//! What a decoder emits as a node index.

/// An integer type a decoder may emit as a node index (Burn's int tensors are i64 on
/// ndarray and i32 on flex).
pub trait ActionIndex: Copy + Send + Sync {
    fn to_i64(self) -> i64;
}

macro_rules! impl_action_index {
    ($($t:ty),*) => {$(
        impl ActionIndex for $t {
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
        }
    )*};
}
impl_action_index!(i32, i64, u8, u16, u32);

impl ActionIndex for usize {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::try_from(self).unwrap_or(i64::MAX)
    }
}
