from pathlib import Path

import pytest

import gpuslice

KINDS = [
    gpuslice.Unsatisfiable,
    gpuslice.InvalidRequest,
    gpuslice.NotFound,
    gpuslice.HostError,
    gpuslice.ConfigError,
]


@pytest.mark.parametrize("kind", KINDS)
def test_every_error_kind_is_a_gpuslice_error_and_not_a_runtime_error(kind):
    assert issubclass(kind, gpuslice.Error)
    assert issubclass(kind, Exception)
    assert not issubclass(kind, RuntimeError)
    assert kind.__module__ == "gpuslice"
    assert kind.__doc__


def test_error_kinds_have_their_attributes_even_when_raised_by_python_code():
    assert gpuslice.HostError("x").path is None
    assert gpuslice.HostError("x").errno is None
    assert tuple(gpuslice.Unsatisfiable("x").reasons) == ()
    assert gpuslice.NotFound("x").kind is None
    assert gpuslice.ConfigError("x").kind is None


def test_the_package_ships_type_information():
    package = Path(gpuslice.__file__).parent

    assert (package / "py.typed").is_file()
    stubs = (package / "__init__.pyi").read_text()
    for name in gpuslice.__all__:
        assert name in stubs, name


def test_every_public_function_and_method_is_documented():
    for name in ["discover", "health", "plan_vgpu_config", "Fleet"]:
        assert getattr(gpuslice, name).__doc__, name
    for method in [
        "from_dict", "add_node", "remove_node", "place", "release", "mark_created",
        "plan_migration", "plan_drain", "plan_evacuation", "allocations", "to_dict",
    ]:
        assert getattr(gpuslice.Fleet, method).__doc__, method


def test_the_version_is_the_core_version():
    assert gpuslice.__version__ == "0.1.0"
