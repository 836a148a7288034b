"""The fleet carries GPU-instance slots: a MIG-backed vGPU's allocation says where its GPU
instance starts (``gpuInstanceStart``, chosen keep-most by the solver), and a fleet document
read back holds the same starts and places the same."""

import gpuslice

VFS = ["0000:10:00.4", "0000:10:00.5", "0000:10:00.6"]


def h200_in_mig_mode(name="h200-a"):
    """One H200 in MIG mode with three VFs, its pool tracking GPU-instance slots."""

    def profile(type_id, type_name, fb, slices):
        return {
            "id": type_id,
            "name": f"NVIDIA {type_name}",
            "framebufferMiB": fb,
            "availableInstances": 1,
            "migSlices": slices,
        }

    profiles = [
        profile("1414", "H200X-1-18C", 18432, 1),
        profile("1424", "H200X-4-71C", 72704, 4),
    ]
    health = {"state": "Healthy", "reasons": []}
    return {
        "node": name,
        "gpus": [
            {
                "name": "nvidia0",
                "address": "0000:10:00.0",
                "vendorId": "10de",
                "deviceId": "2335",
                "class": "0x030200",
                "vendor": "nvidia",
                "model": "H200 SXM",
                "state": "in-use",
                "memoryMiB": 144384,
                "sriov": {"totalVfs": 3, "numVfs": 3, "vfs": VFS},
                "vgpuFramework": "vendor-vfio",
                "health": health,
            }
        ],
        "mediatedDevices": {
            "parents": [
                {
                    "id": vf,
                    "gpu": "0000:10:00.0",
                    "framework": "vendor-vfio",
                    "health": health,
                    "profiles": profiles,
                    "instances": [],
                }
                for vf in VFS
            ],
            "pools": [
                {
                    "gpu": "0000:10:00.0",
                    "parents": VFS,
                    "totalMiB": 144384,
                    "usedMiB": 0,
                    "migSlicesTotal": 7,
                    "migSlicesUsed": 0,
                    "migSlots": {"board": "H200X"},
                }
            ],
        },
    }


def vgpu(name, profile):
    return {"name": name, "devices": [{"name": "gpu", "profile": profile}]}


def test_a_mig_backed_vgpu_is_placed_at_the_start_that_keeps_a_4g_possible():
    fleet = gpuslice.Fleet.from_dict({"nodes": [h200_in_mig_mode()], "allocations": []})

    [one] = fleet.place(vgpu("vm-1", "H200X-1-18C"))["devices"]
    [four] = fleet.place(vgpu("vm-4", "H200X-4-71C"))["devices"]

    assert one["gpuInstanceStart"] == 6
    assert four["gpuInstanceStart"] == 0
    assert "placementId" not in one


def test_a_fleet_document_read_back_keeps_the_starts_and_places_the_same():
    fleet = gpuslice.Fleet.from_dict({"nodes": [h200_in_mig_mode()], "allocations": []})
    fleet.place(vgpu("vm-1", "H200X-1-18C"))

    doc = fleet.to_dict()
    [allocation] = doc["allocations"]
    assert allocation["devices"][0]["gpuInstanceStart"] == 6
    back = gpuslice.Fleet.from_dict(doc)

    assert back.allocations() == fleet.allocations()
    [four] = back.place(vgpu("vm-4", "H200X-4-71C"))["devices"]
    assert four["gpuInstanceStart"] == 0


def test_an_allocation_given_with_a_start_holds_it():
    given = {
        "machine": "vm-0",
        "node": "h200-a",
        "devices": [
            {
                "kind": "vgpu",
                "request": "gpu",
                "index": 0,
                "parent": VFS[0],
                "gpu": "0000:10:00.0",
                "framework": "vendor-vfio",
                "profile": "1414",
                "profileName": "NVIDIA H200X-1-18C",
                "framebufferMiB": 18432,
                "migSlices": 1,
                "uuid": "abc73e73-307c-5fb6-af8b-b425771b9b0d",
                "gpuInstanceStart": 0,
            }
        ],
    }
    fleet = gpuslice.Fleet.from_dict({"nodes": [h200_in_mig_mode()], "allocations": [given]})

    # The 1g at slot 0 holds the 4g's only start.
    try:
        fleet.place(vgpu("vm-4", "H200X-4-71C"))
    except gpuslice.Unsatisfiable as e:
        assert "4g.71gb starts at [0]" in str(e)
    else:
        raise AssertionError("a 4g was placed over the 1g at slot 0")
    assert fleet.allocations()[0]["devices"][0]["gpuInstanceStart"] == 0
