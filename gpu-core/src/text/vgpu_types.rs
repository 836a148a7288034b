//! Each parent's vGPU types as `mdevctl types` prints them.

use crate::vgpu_types::ParentTypes;

/// Each parent's types with their free instances, in `mdevctl types`'s text.
#[must_use]
pub fn vgpu_types(listing: &[ParentTypes]) -> String {
    let mut s = String::new();
    for p in listing {
        s.push_str(&format!("{}\n", p.parent));
        for t in &p.types {
            s.push_str(&format!("  {}\n", t.id));
            s.push_str(&format!(
                "    Available instances: {}{}\n",
                t.available_instances,
                t.driver_reports
                    .map(|r| format!(" (the driver says {r}; the GPU's pool holds fewer)"))
                    .unwrap_or_default()
            ));
            s.push_str(&format!("    Device API: {}\n", t.device_api));
            s.push_str(&format!("    Name: {}\n", t.name));
            if t.needs_gpu_instance {
                s.push_str("    Needs a GPU instance: yes (made when asked for)\n");
            }
            if let Some(d) = &t.description {
                s.push_str(&format!("    Description: {d}\n"));
            }
        }
    }
    s
}
