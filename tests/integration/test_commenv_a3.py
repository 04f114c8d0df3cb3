"""Rendering the communication environment on the simulated A3 nodes through
the runner: each node gets its own IP and NIC, a second run changes nothing,
check mode writes nothing."""

import roles.commenv as commenv
from llmdeploy.inventory import load_cluster
from sim.paths import host_dir
from flows.binding import bind

SIM_CLUSTER = "sim-a3"


def _env_file(cluster, node):
    return host_dir(cluster.name, node.name) / "root" / cluster.etc_dir.lstrip("/") / f"{cluster.name}.env"


def test_render_check_then_write_then_unchanged(sim_cluster):
    c = load_cluster(sim_cluster)
    with bind(c).runner() as r:
        res = r.run(commenv.render_step(c, check=True, diff=True))
        assert {h: x.status for h, x in res.items()} == {n.name: "changed" for n in c.nodes}
        assert "+HCCL_IF_IP=198.19.3.12" in res["sim-a3-2"].data["diff"]
        assert not any(_env_file(c, n).exists() for n in c.nodes)

        res = r.run(commenv.render_step(c))
        assert all(x.status == "changed" for x in res.values())
        for n in c.nodes:
            env = commenv.parse_env_file(_env_file(c, n).read_text())
            assert env["HCCL_IF_IP"] == str(n.ip) and env["HCCL_SOCKET_IFNAME"] == n.nic

        res = r.run(commenv.render_step(c))
        assert all(x.status == "ok" and x.msg.endswith("unchanged") for x in res.values())

        # a hand edit on one node is a change on that node only
        f = _env_file(c, c.nodes[1])
        f.write_text(f.read_text().replace("HCCL_BUFFSIZE=1024", "HCCL_BUFFSIZE=512"))
        res = r.run(commenv.render_step(c, check=True, diff=True))
        assert [h for h, x in res.items() if x.status == "changed"] == ["sim-a3-1"]
        assert "-HCCL_BUFFSIZE=512" in res["sim-a3-1"].data["diff"]
        assert r.round_trips == {n.name: 4 for n in c.nodes}
