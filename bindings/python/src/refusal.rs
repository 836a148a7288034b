//! `Unsatisfiable.refusal` and `.reasons`: a refusal that costs what it says.
//!
//! A refusal on 10,000 nodes says a handful of different things. The exception carries the
//! grouped summary (`.groups`: per set of reasons the node count, the first few node names and
//! the reasons), built at once; the per-node list (`.reasons`, `.refusal["nodes"]`) is a lazy
//! sequence, built the first time an element is read and kept. `len()` costs nothing.

use std::sync::{Arc, OnceLock};

use pyo3::exceptions::{PyIndexError, PyKeyError};
use pyo3::prelude::*;
use pyo3::types::PyList;

/// The keys `Refusal` answers to, as the JSON document spells them.
const KEYS: [&str; 6] = [
    "machine",
    "nodesTotal",
    "nodesRefused",
    "message",
    "groups",
    "nodes",
];

/// Every refused node with its reasons, in node order: a sequence built when first read.
#[pyclass(module = "gpuslice", name = "RefusedNodes", frozen, sequence)]
pub struct RefusedNodes {
    refusal: Arc<gpu_sched::Refusal>,
    built: OnceLock<Py<PyList>>,
}

impl RefusedNodes {
    fn list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        if let Some(l) = self.built.get() {
            return Ok(l.bind(py).clone());
        }
        let nodes = py.detach(|| self.refusal.nodes());
        let list = to_py(py, &nodes)?.cast_into::<PyList>()?;
        let _ = self.built.set(list.clone().unbind());
        Ok(list)
    }
}

#[pymethods]
impl RefusedNodes {
    fn __len__(&self) -> usize {
        self.refusal.refused_count()
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(i) = index.extract::<isize>() {
            let n = isize::try_from(self.__len__()).unwrap_or(isize::MAX);
            if i >= n || i < -n {
                return Err(PyIndexError::new_err("refused node index out of range"));
            }
        }
        self.list(py)?.as_any().get_item(index)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.list(py)?.as_any().try_iter()?.into_any())
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let mine = self.list(py)?;
        if let Ok(o) = other.cast::<RefusedNodes>() {
            if Arc::ptr_eq(&o.get().refusal, &self.refusal) {
                return Ok(true);
            }
            return mine.as_any().eq(o.get().list(py)?);
        }
        mine.as_any().eq(other)
    }

    /// The refused nodes with their reasons (the first few, and how many more).
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let list = self.list(py)?;
        let n = list.len();
        let shown = list.get_slice(0, crate::repr::REPR_ITEMS);
        let mut s = format!("RefusedNodes({}", shown.repr()?);
        if n > shown.len() {
            s.pop();
            s.push_str(&format!(", ... ({} more)]", n - shown.len()));
        }
        s.push(')');
        Ok(s)
    }
}

/// Why a Machine could not be placed: `machine`, `nodes_total`, `nodes_refused`, `message`,
/// `groups` (the grouped summary) and `nodes` (every refused node, lazily); read as attributes
/// or, as the JSON document, by key (`refusal["nodesTotal"]`). `detail()` gives the per-node
/// list as plain data, `to_dict(detail=False)` the whole document.
#[pyclass(module = "gpuslice", name = "Refusal", frozen)]
pub struct Refusal {
    refusal: Arc<gpu_sched::Refusal>,
    nodes: Py<RefusedNodes>,
    groups: Py<PyAny>,
}

#[pymethods]
impl Refusal {
    /// The Machine.
    #[getter]
    fn machine(&self) -> &str {
        &self.refusal.machine
    }

    /// Nodes in the fleet.
    #[getter]
    fn nodes_total(&self) -> usize {
        self.refusal.nodes_total
    }

    /// Nodes considered and refused.
    #[getter]
    fn nodes_refused(&self) -> usize {
        self.refusal.refused_count()
    }

    /// The one node the Machine was asked to go to, when it was.
    #[getter]
    fn target(&self) -> Option<&str> {
        self.refusal.target.as_deref()
    }

    /// The one-line message.
    #[getter]
    fn message(&self) -> String {
        self.refusal.render()
    }

    /// The grouped summary: `[{"nodeCount", "firstNodes", "reasons"}]`, most nodes first.
    #[getter]
    fn groups<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.groups.bind(py).clone()
    }

    /// Every refused node with its reasons (a lazy sequence).
    #[getter]
    fn nodes<'py>(&self, py: Python<'py>) -> Bound<'py, RefusedNodes> {
        self.nodes.bind(py).clone()
    }

    /// Every refused node with its reasons, as a list of dicts.
    fn detail<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.nodes.get().list(py)
    }

    /// The refusal document: the summary, and with `detail=True` every node.
    #[pyo3(signature = (detail = false))]
    fn to_dict<'py>(&self, py: Python<'py>, detail: bool) -> PyResult<Bound<'py, PyAny>> {
        let report = py.detach(|| self.refusal.report(detail));
        to_py(py, &report)
    }

    fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        Ok(match key {
            "machine" => self.machine().into_pyobject(py)?.into_any(),
            "nodesTotal" => self.nodes_total().into_pyobject(py)?.into_any(),
            "nodesRefused" => self.nodes_refused().into_pyobject(py)?.into_any(),
            "message" => self.message().into_pyobject(py)?.into_any(),
            "groups" => self.groups(py),
            "nodes" => self.nodes(py).into_any(),
            _ => return Err(PyKeyError::new_err(key.to_owned())),
        })
    }

    fn __contains__(&self, key: &str) -> bool {
        KEYS.contains(&key)
    }

    /// The keys, as the JSON document spells them.
    fn keys(&self) -> Vec<&'static str> {
        KEYS.to_vec()
    }

    /// `refusal[key]`, or `default` for another key.
    #[pyo3(signature = (key, default = None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if self.__contains__(key) {
            self.__getitem__(py, key)
        } else {
            Ok(default.unwrap_or_else(|| py.None().into_bound(py)))
        }
    }

    /// The Machine, the message and the grouped reasons.
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let text = |s: &str| pyo3::types::PyString::new(py, s).repr();
        Ok(format!(
            "Refusal(machine={}, nodes_total={}, nodes_refused={}, message={}, groups={})",
            text(&self.refusal.machine)?,
            self.refusal.nodes_total,
            self.refusal.refused_count(),
            text(&self.refusal.render())?,
            self.groups.bind(py).repr()?
        ))
    }
}

/// Sets `.refusal`, `.reasons` and `.groups` on an `Unsatisfiable` exception. A failure here
/// leaves the attributes at their class defaults rather than replacing the error being raised.
pub fn attach(py: Python<'_>, err: &PyErr, refusal: Arc<gpu_sched::Refusal>) {
    let _ = try_attach(py, err, refusal);
}

fn try_attach(py: Python<'_>, err: &PyErr, refusal: Arc<gpu_sched::Refusal>) -> PyResult<()> {
    let summary = refusal.summary();
    let groups = to_py(py, &summary)?.unbind();
    let nodes = Py::new(
        py,
        RefusedNodes {
            refusal: Arc::clone(&refusal),
            built: OnceLock::new(),
        },
    )?;
    let value = err.value(py);
    value.setattr("reasons", nodes.clone_ref(py))?;
    value.setattr("groups", groups.clone_ref(py))?;
    let r = Py::new(
        py,
        Refusal {
            refusal,
            nodes,
            groups,
        },
    )?;
    value.setattr("refusal", r)?;
    Ok(())
}

/// Registers the classes and the `groups` default of `Unsatisfiable`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Refusal>()?;
    m.add_class::<RefusedNodes>()?;
    let unsat = m.getattr("Unsatisfiable")?;
    unsat.setattr("groups", ())?;
    Ok(())
}

/// A value as a Python object; a value that does not convert (a gpuslice bug) is the base
/// `RuntimeError` here, since the refusal is itself part of an exception being built.
fn to_py<'py, T: serde::Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    crate::pyserde::to_py(py, value).map_err(|e| {
        pyo3::exceptions::PyRuntimeError::new_err(format!("cannot convert the refusal: {e}"))
    })
}
