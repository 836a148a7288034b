//! How a `repr` lists a few items of many: the first [`REPR_ITEMS`], then how many more.

/// How many items a `repr` shows before it counts the rest.
pub(crate) const REPR_ITEMS: usize = 5;

/// `a, b, c` and `... (N more)` when `total` is larger than what is shown; `none` when empty.
pub(crate) fn listed(shown: &[String], total: usize) -> String {
    if shown.is_empty() {
        return "none".to_owned();
    }
    let mut s = shown.join(", ");
    if total > shown.len() {
        s.push_str(&format!(", ... ({} more)", total - shown.len()));
    }
    s
}
