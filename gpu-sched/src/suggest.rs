//! The names a fleet offers that come nearest to one it does not: what a refusal of an unknown
//! profile lists, so that a typo (`A2-44Q`) is answered with the names meant (`A2-4Q`).

use std::collections::BTreeSet;

/// At most this many names are suggested.
pub(crate) const MAX_SUGGESTIONS: usize = 5;

/// The Levenshtein distance of `a` and `b`, by characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(diagonal + 1).min(row[j] + 1);
        }
    }
    row[b.len()]
}

/// The family of a vGPU type name: what comes before its first `-` (`A2` of `A2-4Q`, `A100`
/// of `A100-3-20C`).
fn family(name: &str) -> &str {
    name.split_once('-').map_or(name, |(f, _)| f)
}

/// The names of `offered` nearest to `wanted` (compared without case): those of the same family
/// and those a few edits away, nearest first, at most [`MAX_SUGGESTIONS`].
pub(crate) fn nearest<'a>(wanted: &str, offered: &'a BTreeSet<String>) -> Vec<&'a str> {
    let w = wanted.trim().to_ascii_lowercase();
    // A third of the name, at least 2: `A2-44Q` -> `A2-4Q`, not every short name.
    let reach = (w.chars().count() / 3).max(2);
    let mut near: Vec<(usize, &str)> = offered
        .iter()
        .filter_map(|name| {
            let n = name.to_ascii_lowercase();
            let d = distance(&w, &n);
            (d <= reach || family(&n) == family(&w)).then_some((d, name.as_str()))
        })
        .collect();
    near.sort_unstable();
    near.into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, n)| n)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_typo_is_answered_with_the_names_of_its_family_nearest_first() {
        let offered = names(&["A2-4Q", "A2-8Q", "A2-16Q", "L40S-24Q", "mbochs-small"]);
        // Nearest first; ties by name.
        assert_eq!(nearest("A2-44Q", &offered), ["A2-4Q", "A2-16Q", "A2-8Q"]);
        assert_eq!(nearest("l40s-48q", &offered), ["L40S-24Q"]);
        assert!(nearest("T4-8Q", &offered).len() <= 2);
        assert!(nearest("completely-else", &offered).is_empty());
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("a2-44q", "a2-4q"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
