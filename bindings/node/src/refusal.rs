//! `refusal`, `reasons` and `groups` of an `UNSATISFIABLE` error: a refusal that costs what it
//! says.
//!
//! A refusal on 10,000 nodes says a handful of different things. The error carries the grouped
//! summary (`groups`, also `refusal.groups`: per set of reasons the node count, the first few
//! node names and the reasons), built at once; the per-node list (`reasons`, `refusal.nodes`)
//! is a getter that builds it when read (each read builds a fresh array: keep it in a variable).

use std::sync::Arc;

use napi::bindgen_prelude::{JsObjectValue, Object};
use napi::{Env, Property, PropertyAttributes};

/// A getter that builds every refused node with its reasons, in node order.
fn nodes_getter(name: &str, refusal: &Arc<gpu_sched::Refusal>) -> napi::Result<Property> {
    let r = Arc::clone(refusal);
    Ok(Property::new()
        .with_utf8_name(name)?
        .with_property_attributes(PropertyAttributes::Enumerable | PropertyAttributes::Configurable)
        .with_getter_closure(move |_env, _this| {
            serde_json::to_value(r.nodes()).map_err(|e| napi::Error::from_reason(e.to_string()))
        }))
}

/// Sets `groups`, `refusal` (`machine`, `nodesTotal`, `nodesRefused`, `message`, `groups`, and
/// the `nodes` getter) and the `reasons` getter on the error object.
///
/// # Errors
/// The VM cannot create the objects.
pub fn attach(
    env: &Env,
    err: &mut Object<'_>,
    refusal: &Arc<gpu_sched::Refusal>,
) -> napi::Result<()> {
    let groups = env.to_js_value(&refusal.summary())?;
    let mut r = Object::new(env)?;
    r.set("machine", refusal.machine.as_str())?;
    r.set(
        "nodesTotal",
        u32::try_from(refusal.nodes_total).unwrap_or(u32::MAX),
    )?;
    r.set(
        "nodesRefused",
        u32::try_from(refusal.refused_count()).unwrap_or(u32::MAX),
    )?;
    if let Some(t) = &refusal.target {
        r.set("target", t.as_str())?;
    }
    r.set("message", refusal.render())?;
    r.set("groups", groups)?;
    r.define_properties(&[nodes_getter("nodes", refusal)?])?;
    err.set("groups", groups)?;
    err.set("refusal", r)?;
    err.define_properties(&[nodes_getter("reasons", refusal)?])?;
    Ok(())
}
