"""Stages placed one per node: a local Ray cluster of two node processes (ray.cluster_utils.Cluster,
a head and a worker raylet on this machine, each its own node id). The 2-stage test runs in CI
(~11 s with the cluster's start); 3 stages on 2 nodes is `slow`."""
from __future__ import annotations

import pytest

from ramforge.errors import ClusterError


@pytest.fixture(scope="module")
def tiny():
    from tools.make_models import ensure_model

    return str(ensure_model("llama", "F16"))


@pytest.fixture(scope="module")
def two_nodes():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from ramforge.cluster import RAY_SYSTEM_CONFIG

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": RAY_SYSTEM_CONFIG})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield ray, sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    ray.shutdown()
    cluster.shutdown()


def test_two_stages_on_two_nodes_one_each(two_nodes, tiny):
    from ramforge.cluster import Pipeline
    from ramforge.engine.engine import Engine

    ray, nodes = two_nodes
    assert len(nodes) == 2
    with Engine.load(tiny, n_ctx=64) as e:
        want = list(e.generate([1, 415, 4996, 17354], 6))
    with Pipeline(tiny, 2, n_ctx=64) as p:
        assert sorted(i["node_id"] for i in p.infos) == nodes
        assert p.infos[1]["node_id"] == ray.get_runtime_context().get_node_id()   # the last beside the driver
        assert list(p.generate([1, 415, 4996, 17354], 6)) == want


@pytest.mark.slow
def test_more_stages_than_nodes_share_them_or_are_refused(two_nodes, tiny):
    from ramforge.cluster import Pipeline

    ray, nodes = two_nodes
    with pytest.raises(ClusterError, match="3 stages, one per node, but the Ray cluster has 2 nodes: add nodes"):
        Pipeline(tiny, 3, n_ctx=64, placement="strict")
    with Pipeline(tiny, 3, n_ctx=64) as p:                # spread: round robin over the two
        ids = [i["node_id"] for i in p.infos]
        assert ids[0] == ids[2] != ids[1] and sorted(set(ids)) == nodes
