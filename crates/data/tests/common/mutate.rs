//! Byte-level mutations of valid files for property tests of parsers (proptest). Shared
//! by the data crate's and the trainer's fuzz tests (`#[path]`-included).

use proptest::prelude::*;

/// Numbers that break parsers that trust them.
pub const HOSTILE: [&str; 9] = [
    "999999999999",
    "18446744073709551616",
    "4294967296",
    "-1",
    "0",
    "1e308",
    "NaN",
    "inf",
    "100001",
];

#[derive(Debug, Clone)]
pub enum Mutation {
    Flip(usize, u8),
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
    /// Replace the run of digits at (or after) a position by a hostile number.
    Number(usize, usize),
    /// Repeat the line at a position.
    DuplicateLine(usize),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), 1usize..40).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..12)
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 0..HOSTILE.len()).prop_map(|(i, h)| Mutation::Number(i, h)),
        any::<usize>().prop_map(Mutation::DuplicateLine),
    ]
}

pub fn apply(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        let len = bytes.len();
        match m {
            Mutation::Flip(i, b) => bytes[i % len] = *b,
            Mutation::Delete(i, n) => {
                let start = i % len;
                bytes.drain(start..(start + n).min(len));
            }
            Mutation::Insert(i, b) => {
                let at = i % len;
                bytes.splice(at..at, b.iter().copied());
            }
            Mutation::Number(i, h) => {
                let Some(start) = (i % len..len).find(|&k| bytes[k].is_ascii_digit()) else {
                    continue;
                };
                let end = (start..len)
                    .find(|&k| !bytes[k].is_ascii_digit())
                    .unwrap_or(len);
                bytes.splice(start..end, HOSTILE[*h].bytes());
            }
            Mutation::DuplicateLine(i) => {
                let at = i % len;
                let start = bytes[..at]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |p| p + 1);
                let end = bytes[at..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(len, |p| at + p + 1);
                let line = bytes[start..end].to_vec();
                bytes.splice(start..start, line);
            }
        }
    }
    bytes
}

pub fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (0..seeds.len(), proptest::collection::vec(mutation(), 1..6))
        .prop_map(move |(s, m)| apply(seeds[s].clone(), &m))
}

pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 600,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
