import json

import pytest

import gpuslice


def test_health_reports_every_gpu_with_its_verdict_and_signals(host):
    reports = gpuslice.health(str(host.root))

    assert [r["name"] for r in reports] == ["nvidia0", "radeon0"]
    for r in reports:
        assert r["health"]["state"] == "Healthy"
        assert r["signals"]["link"]["currentWidth"] == {"value": 16}


def test_health_grades_a_link_trained_below_its_width_as_degraded(host):
    host.file("sys/devices/pci0000:00/0000:af:00.0/current_link_width", "8\n")

    reports = {r["name"]: r for r in gpuslice.health(str(host.root))}

    assert reports["radeon0"]["health"]["state"] == "Degraded"
    assert reports["radeon0"]["health"]["reasons"]
    assert reports["nvidia0"]["health"]["state"] == "Healthy"


def test_health_applies_a_policy_given_as_dict_text_or_file(host, tmp_path):
    host.file("sys/devices/pci0000:00/0000:af:00.0/current_link_width", "8\n")
    policy = {"link": {"judgeWidth": False}}
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(policy))

    for given in (policy, "link: {judgeWidth: false}\n", json.dumps(policy), policy_file):
        reports = {r["name"]: r for r in gpuslice.health(str(host.root), policy=given)}
        assert reports["radeon0"]["health"]["state"] == "Healthy", given


def test_health_rejects_an_unknown_policy_key_with_config_error(host):
    with pytest.raises(gpuslice.ConfigError) as info:
        gpuslice.health(str(host.root), policy={"colour": "red"})

    assert "colour" in str(info.value)


def test_health_rejects_malformed_policy_text_with_config_error(host):
    with pytest.raises(gpuslice.ConfigError):
        gpuslice.health(str(host.root), policy="aer: [unclosed")


def test_health_with_a_missing_policy_file_raises_host_error(host, tmp_path):
    missing = tmp_path / "missing.toml"

    with pytest.raises(gpuslice.HostError) as info:
        gpuslice.health(str(host.root), policy=missing)

    assert info.value.path == str(missing)
    assert info.value.errno == 2


def test_health_of_a_missing_root_raises_host_error(tmp_path):
    with pytest.raises(gpuslice.HostError):
        gpuslice.health(str(tmp_path / "nowhere"))
