"""sparkml_dist.formats.networks: a network out as safetensors + JSON, back in by a builder the caller
names; from DDP, FSDP2 and a pipeline; logged to MLflow and scored by its pyfunc."""

import json
import os
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from sparkml_dist import ConfigurationError
from sparkml_dist.formats import networks as torch_models
from sparkml_dist.formats.checks import UnsafeModelError
from sparkml_dist.runner import BarrierRunner
from tests.support import network_helpers as nh
from tests.support.parallel_helpers import batch, build_model

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast


class Tied(torch.nn.Module):
    """A network whose output layer shares the embedding's weight (stored once)."""

    def __init__(self, vocab=10, dim=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.out = torch.nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids):
        return self.out(self.embed(ids))


def test_a_saved_network_reloads_with_identical_outputs_and_tied_weights_stay_tied(tmp_path):
    net = build_model(layers=3, width=5)
    torch_models.save(
        str(tmp_path / "mlp"), net, builder=build_model, builder_kwargs={"layers": 3, "width": 5}
    )
    back = torch_models.load(str(tmp_path / "mlp"), builder=build_model)
    X = torch.randn(7, 5)
    assert torch.equal(back(X), net.eval()(X)) and not back.training
    meta = json.loads((tmp_path / "mlp" / "model.json").read_text())
    assert (
        meta["builder"] == "tests.support.parallel_helpers:build_model"
        and meta["builder_kwargs"]["width"] == 5
    )
    tied = Tied()
    torch_models.save(str(tmp_path / "tied"), tied, builder=Tied)
    again = torch_models.load(str(tmp_path / "tied"), allowed=[Tied])
    assert again.out.weight.data_ptr() == again.embed.weight.data_ptr()
    ids = torch.tensor([1, 2, 3])
    assert torch.equal(again(ids), tied(ids))
    assert json.loads((tmp_path / "tied" / "model.json").read_text())["aliases"] == {
        "out.weight": "embed.weight"
    }


def test_loading_never_imports_a_builder_named_only_by_the_files(tmp_path, monkeypatch):
    bait = tmp_path / "bait"
    bait.mkdir()
    marker = tmp_path / "imported"
    (bait / "planted_builder.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef make():\n    pass\n")
    monkeypatch.syspath_prepend(str(bait))
    torch_models.save(str(tmp_path / "net"), build_model(), builder=build_model)
    meta_path = tmp_path / "net" / "model.json"
    meta = json.loads(meta_path.read_text())
    meta["builder"] = "planted_builder:make"
    meta_path.write_text(json.dumps(meta))
    for call in (
        lambda: torch_models.load(str(tmp_path / "net")),
        lambda: torch_models.load(str(tmp_path / "net"), allowed=[build_model]),
    ):
        with pytest.raises(UnsafeModelError, match="planted_builder:make.*did not allow"):
            call()
    assert not marker.exists() and "planted_builder" not in sys.modules


def test_changed_weights_an_unsigned_record_and_bad_arguments_are_refused(tmp_path, monkeypatch):
    key = "k" * 32
    path = str(tmp_path / "net")
    torch_models.save(path, build_model(), builder=build_model, key=key)
    assert torch_models.load(path, builder=build_model, key=key) is not None
    weights = tmp_path / "net" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(UnsafeModelError, match="does not match its record"):
        torch_models.load(path, builder=build_model)
    meta_path = tmp_path / "net" / "model.json"
    meta = json.loads(meta_path.read_text())
    meta["builder_kwargs"] = {"layers": 2}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UnsafeModelError, match="signature does not verify"):
        torch_models.load(path, builder=build_model, key=key)
    with pytest.raises(ConfigurationError, match="plain JSON values"):
        torch_models.save(
            str(tmp_path / "x"), build_model(), builder=build_model, builder_kwargs={"f": object()}
        )
    with pytest.raises(ConfigurationError, match="not a lambda"):
        torch_models.save(str(tmp_path / "y"), build_model(), builder=lambda: build_model())
    torch_models.save(
        str(tmp_path / "z"), build_model(layers=3), builder=build_model, builder_kwargs={"layers": 3}
    )
    monkeypatch.setattr(
        torch_models, "_pick_builder", lambda *a: lambda **kw: build_model(layers=4)
    )  # a builder that makes another network: the weights do not fit it
    with pytest.raises(Exception, match="do not fit the network"):
        torch_models.load(str(tmp_path / "z"), builder=build_model)


@pytest.mark.parametrize("kind", ["ddp", "fsdp2", "pipeline"])
def test_networks_trained_split_or_sharded_are_saved_whole(tmp_path, kind):
    path = str(tmp_path / kind)
    fn = {"ddp": nh.save_ddp, "fsdp2": nh.save_fsdp, "pipeline": nh.save_pipeline}[kind]
    out = BarrierRunner(-2, timeout=180).run(fn, path, return_all=True)
    assert [o["written"] for o in out] == [path, None]  # rank 0 writes, after every rank gathered
    back = torch_models.load(path, builder=build_model)
    want = out[0]["state"]
    assert set(back.state_dict()) == set(want)
    assert all(torch.equal(back.state_dict()[k], want[k]) for k in want)
    X, _ = batch(999, 10)
    with torch.no_grad():
        if kind == "pipeline":
            assert torch.allclose(back(X), out[0]["predict"], atol=1e-6)
        reference = build_model()
        reference.load_state_dict(want)
        assert torch.equal(back(X), reference(X))
    if kind == "fsdp2":
        assert out[0]["held"] < sum(t.numel() for t in want.values())  # it was sharded


def test_mlflow_logs_a_network_whose_pyfunc_loads_it_the_same_way(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    from sparkml_dist import mlflow_flavor

    monkeypatch.delenv("SPARKML_DIST_MODEL_KEY", raising=False)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    exp = mlflow.create_experiment("networks", artifact_location=str(tmp_path / "artifacts"))
    net = build_model(layers=3, width=6)
    with mlflow.start_run(experiment_id=exp) as run:
        uri = mlflow_flavor.log_network(
            net, run.info.run_id, builder=build_model, builder_kwargs={"layers": 3, "width": 6}
        )
    X = np.random.default_rng(0).random((12, 6)).astype(np.float32)
    frame = pd.DataFrame({"features": list(X)})
    with pytest.raises(UnsafeModelError, match="SPARKML_DIST_TRUSTED_BUILDERS"):
        mlflow.pyfunc.load_model(uri)
    monkeypatch.setenv("SPARKML_DIST_TRUSTED_BUILDERS", "tests.support.parallel_helpers:build_model")
    got = mlflow.pyfunc.load_model(uri).predict(frame)
    with torch.no_grad():
        want = net.eval()(torch.from_numpy(X)).numpy()
    assert np.array_equal(got, want)
    wide = pd.DataFrame({f"x{j}": X[:, j] for j in range(6)})  # scalar columns spread the same way
    assert np.array_equal(mlflow.pyfunc.load_model(uri).predict(wide), want)
    monkeypatch.delenv("SPARKML_DIST_TRUSTED_BUILDERS")
    direct = mlflow_flavor.load_network(uri, builder=build_model)
    assert isinstance(direct, torch.nn.Module) and os.path.basename(uri) == "model"


@pytest.mark.parametrize("which", ["model.json", "weights.safetensors"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero_link"])
def test_a_fifo_or_a_dev_zero_link_in_a_saved_network_is_refused_at_once(tmp_path, which, kind):
    import time

    path = str(tmp_path / "net")
    torch_models.save(path, build_model(), builder=build_model)
    target = tmp_path / "net" / which
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        os.symlink("/dev/zero", target)
    start = time.monotonic()
    with pytest.raises(Exception, match="not a regular file|symbolic link"):
        torch_models.load(path, builder=build_model)
    assert time.monotonic() - start < 5


def test_arguments_from_an_unsigned_record_never_build_a_network_its_weights_do_not_fit(tmp_path):
    import resource

    path = str(tmp_path / "net")
    torch_models.save(path, build_model(width=5), builder=build_model, builder_kwargs={"width": 5})
    meta_path = tmp_path / "net" / "model.json"
    meta = json.loads(meta_path.read_text())
    meta["builder_kwargs"] = {"width": 10**6}  # 10^12 weights per layer: terabytes if it were built
    meta_path.write_text(json.dumps(meta))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(Exception, match="do not fit the network.*nothing was allocated"):
        torch_models.load(path, builder=build_model)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: under 200 MiB
