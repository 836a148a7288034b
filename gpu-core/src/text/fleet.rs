//! The GPUs of a fleet's nodes as its allocations leave them (what `gpuslice gpu list
//! --inventory` prints).

use crate::fleet::FleetNode;
use crate::{Allocation, Gpu};

use super::{GPU_HEADERS, gpu_row, render_table};

/// One GPU of a fleet node, as the fleet's allocations leave it.
#[derive(Debug, Clone)]
pub struct FleetGpu<'a> {
    /// The node's name.
    pub node: &'a str,
    /// The GPU; one an allocation holds is not free ([`crate::usage::allocated_view`]).
    pub gpu: Gpu,
    /// The Machines whose allocations hold it.
    pub allocated_to: Vec<String>,
}

impl FleetGpu<'_> {
    /// The GPU's document with `node` and `allocatedTo` added.
    ///
    /// # Errors
    /// A GPU that does not serialize.
    pub fn document(&self) -> Result<serde_json::Value, serde_json::Error> {
        let mut v = serde_json::to_value(&self.gpu)?;
        if let Some(obj) = v.as_object_mut() {
            let node = serde_json::Value::String(self.node.to_owned());
            obj.insert("node".to_owned(), node);
            obj.insert(
                "allocatedTo".to_owned(),
                serde_json::to_value(&self.allocated_to)?,
            );
        }
        Ok(v)
    }
}

/// Every GPU of `nodes`, in order, as `allocations` leave it.
#[must_use]
pub fn fleet_gpus<'a>(nodes: &[&'a FleetNode], allocations: &[Allocation]) -> Vec<FleetGpu<'a>> {
    nodes
        .iter()
        .flat_map(|t| {
            t.gpus().iter().map(|gpu| {
                let (gpu, allocated_to) = crate::usage::allocated_view(t.name(), allocations, gpu);
                FleetGpu {
                    node: t.name(),
                    gpu,
                    allocated_to,
                }
            })
        })
        .collect()
}

/// The GPUs as a table: NODE, the GPU's columns, ALLOCATED TO.
#[must_use]
pub fn fleet_gpu_table(gpus: &[FleetGpu<'_>]) -> String {
    let mut headers = vec!["NODE"];
    headers.extend(GPU_HEADERS);
    headers.push("ALLOCATED TO");
    let rows: Vec<Vec<String>> = gpus
        .iter()
        .map(|g| {
            let mut r = vec![g.node.to_owned()];
            r.extend(gpu_row(&g.gpu));
            r.push(if g.allocated_to.is_empty() {
                "-".to_owned()
            } else {
                g.allocated_to.join(",")
            });
            r
        })
        .collect();
    render_table(&headers, &rows)
}
