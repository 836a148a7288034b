//! The model as people read it: left-aligned tables and the topology page. The CLI prints these
//! and the bindings may hand them out; they are plain strings built from the model, so every
//! front-end shows one rendering.

mod fleet;
mod topology;
mod vgpu_types;

pub use fleet::{FleetGpu, fleet_gpu_table, fleet_gpus};
pub use topology::{HolderOf, PendingRow, Shown, add_holder_column, topology};
pub use vgpu_types::vgpu_types;

use crate::Gpu;

/// Renders rows as a left-aligned table with two spaces between columns; trailing spaces are
/// trimmed.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(c);
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(c.chars().count());
            s.extend(std::iter::repeat_n(' ', pad));
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// GPUs as a table under [`GPU_HEADERS`], with a HOLDER column when `holder` names anyone.
#[must_use]
pub fn gpu_table(gpus: &[Gpu], holder: HolderOf<'_, crate::PciAddress>) -> String {
    let mut rows: Vec<Vec<String>> = gpus.iter().map(gpu_row).collect();
    let mut headers = GPU_HEADERS.to_vec();
    add_holder_column(&mut headers, &mut rows, gpus, holder);
    render_table(&headers, &rows)
}

/// `s`, or `-` when it is absent or empty.
pub fn dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_owned()
}

/// Every line of `s` indented by two spaces.
pub fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}

/// The columns of a GPU's row ([`gpu_row`]).
pub const GPU_HEADERS: [&str; 7] = [
    "NAME", "ADDRESS", "VENDOR", "MODEL", "DRIVER", "STATE", "HEALTH",
];

/// A GPU's row under [`GPU_HEADERS`].
pub fn gpu_row(g: &Gpu) -> Vec<String> {
    vec![
        g.name.clone(),
        g.address.to_string(),
        g.vendor.as_str().to_owned(),
        dash(Some(&g.model)),
        dash(g.driver.as_deref()),
        g.state.as_str().to_owned(),
        g.health.state.as_str().to_owned(),
    ]
}
