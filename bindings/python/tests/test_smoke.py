import gpuslice


def test_the_package_reports_its_version():
    assert gpuslice.__version__ == "0.1.0"
