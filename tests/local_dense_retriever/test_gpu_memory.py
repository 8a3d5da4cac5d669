"""GET /health's ``gpus``: the memory this server holds on each GPU it uses, with the GPU's identity. No GPU exists
here, so the report reads a fake ``torch.cuda`` (the one seam); the GPUs an engine uses and the fleet's list are
real code on real objects."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_dense_retriever.memory import gpu_report, gpu_uuid
from local_dense_retriever.serve.fleet_view import fleet_health

H100 = 81_559 << 20


@dataclass
class FakeProperties:
    name: str
    uuid: str
    total_memory: int


class FakeCuda:
    """Four H100s, of which this process has 6 GiB reserved on ordinal 2 and 5 GiB on the others."""

    def get_device_properties(self, device: int) -> FakeProperties:
        return FakeProperties("NVIDIA H100 80GB HBM3", f"8f3c0e2a-0000-4000-8000-00000000000{device}", H100)

    def memory_reserved(self, device: int) -> int:
        return (6 if device == 2 else 5) << 30


def test_each_gpu_in_use_is_reported_with_its_identity_and_memory():
    measured = {"GPU-8f3c0e2a-0000-4000-8000-000000000002": 7 << 30}
    report = gpu_report([0, 2], cuda=FakeCuda(), process_bytes=measured.get)
    assert report == [
        {"index": 0, "uuid": "GPU-8f3c0e2a-0000-4000-8000-000000000000", "name": "NVIDIA H100 80GB HBM3",
         "total_bytes": H100, "reserved_bytes": 5 << 30, "process_bytes": None},
        {"index": 2, "uuid": "GPU-8f3c0e2a-0000-4000-8000-000000000002", "name": "NVIDIA H100 80GB HBM3",
         "total_bytes": H100, "reserved_bytes": 6 << 30, "process_bytes": 7 << 30},
    ]  # fmt: skip


def test_no_gpu_in_use_reads_no_cuda():
    class NoCuda:
        def __getattr__(self, name):
            raise AssertionError(f"torch.cuda.{name} read on a server without GPUs")

    assert gpu_report([], cuda=NoCuda()) == []


def test_uuids_read_as_nvidia_smi_writes_them():
    assert gpu_uuid(FakeProperties("x", "8f3c", 0)) == "GPU-8f3c"
    assert gpu_uuid(FakeProperties("x", "MIG-1a2b", 0)) == "MIG-1a2b"


def test_an_engine_uses_the_gpus_of_its_index_and_encoder(animal_corpus, make_hash_engine):
    engine = make_hash_engine(animal_corpus)
    assert engine.gpus() == []  # everything on the CPU
    # where a GPU holds them (no GPU here: only the devices are read, as TorchFlatIndex and HFEncoder record them)
    engine.backend.index.devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    engine.backend.encoder.device = torch.device("cuda", 3)
    assert engine.gpus() == [0, 1, 3]
    engine.backend.encoder.device = torch.device("cuda")  # torch's current device: 0
    assert engine.gpus() == [0, 1]


def test_a_fleet_lists_every_replicas_gpus():
    gpu = {"index": 0, "uuid": "GPU-a", "name": "H100", "total_bytes": H100, "reserved_bytes": 1, "process_bytes": 2}
    replicas = {
        name: {"health": {"status": "ready", "detail": "", "passages": 3, "gpus": [gpu]}, "healthy": True}
        for name in ("r1", "r2")
    }
    replicas["r3"] = {"health": {"status": "loading", "detail": ""}, "healthy": False}
    body, status = fleet_health(replicas)
    assert status == 200 and body["gpus"] == [gpu, gpu]  # two replicas on one GPU: once each, by the same uuid
    assert [r["gpus"] for r in body["replicas"]] == [[gpu], [gpu], []]
