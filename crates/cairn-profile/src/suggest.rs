//! The closest valid name to a misspelt one (Levenshtein distance).

/// Edit distance between `a` and `b` (insertions, deletions, substitutions), in characters.
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diag + usize::from(ca != cb)).min(up + 1).min(row[j] + 1);
            diag = up;
        }
    }
    row[b.len()]
}

/// The candidate closest to `wrong`, if one is close enough to be a likely typo (at most a
/// third of its length away, and at least one edit; `_` and `-` count as the same).
pub fn closest<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
    let w = norm(wrong);
    // Very long inputs (a fuzzer's) are not typos of a key; the distance is quadratic.
    if w.len() > 256 {
        return None;
    }
    candidates
        .into_iter()
        .map(|c| (distance(&w, &norm(c)), c))
        .filter(|&(d, c)| d <= (c.chars().count() / 3).max(2))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("", ""), 0);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("exclude", "exlcude"), 2);
        assert_eq!(distance("é", "e"), 1);
    }

    #[test]
    fn closest_names_a_typo_and_nothing_far() {
        let keys = ["exclude", "iexclude", "tag", "one-file-system"];
        assert_eq!(closest("exlude", keys), Some("exclude"));
        assert_eq!(closest("one_file_system", keys), Some("one-file-system"));
        assert_eq!(closest("tags", keys), Some("tag"));
        assert_eq!(closest("compression", keys), None);
    }
}
