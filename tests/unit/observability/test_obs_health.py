from __future__ import annotations

from tensoryard.observability.health import HealthAction, decide, node_of


def _alert(name: str, action: str, state: str = "firing", **labels: str) -> dict:
    return {"state": state, "labels": {"alertname": name, "health_action": action, **labels}}


def test_a_fatal_xid_drains_its_node_once_whatever_the_number_of_alerts():
    alerts = [
        _alert("GpuFatalXid", "drain_node", Hostname="n7", gpu="3", xid="79", job="llama"),
        _alert("GpuRowRemapFailure", "drain_node", Hostname="n7", gpu="5"),
        _alert("InfinibandPortDown", "drain_node", instance="n7:9410", device="mlx5_3"),
    ]
    assert decide(alerts) == [
        HealthAction(
            "drain_node",
            "n7",
            reasons=(
                "GpuFatalXid(gpu=3, xid=79)",
                "GpuRowRemapFailure(gpu=5)",
                "InfinibandPortDown(device=mlx5_3)",
            ),
        )
    ]


def test_a_hung_job_is_restarted_unless_its_node_is_being_drained():
    hang = _alert("JobHang", "restart_job", job="bert", team="nlp")
    timeout = _alert(
        "JobNcclTimeout", "restart_job", job="llama", team="research", rank="8", op="ALLREDUCE"
    )
    xid = _alert("GpuFatalXid", "drain_node", Hostname="n7", gpu="3", xid="79", job="llama")
    assert decide([hang, timeout, xid]) == [
        HealthAction("drain_node", "n7", reasons=("GpuFatalXid(gpu=3, xid=79)",)),
        HealthAction("restart_job", "bert", "nlp", ("JobHang",)),
    ]


def test_pending_and_notify_only_alerts_do_nothing():
    assert (
        decide(
            [
                _alert("InfinibandPortDown", "drain_node", state="pending", instance="n1:9100"),
                _alert("JobCheckpointStale", "notify", job="llama", team="research"),
            ]
        )
        == []
    )


def test_nodes_are_named_by_hostname_or_instance_without_port():
    assert node_of({"Hostname": "n7", "instance": "10.0.0.7:9400"}) == "n7"
    assert node_of({"instance": "n7:9410"}) == "n7"
    assert node_of({"instance": "[fe80::1]:9410"}) == "fe80::1"
    assert node_of({}) == ""


def test_a_failed_check_reads_as_its_command_and_how_it_failed() -> None:
    from tensoryard.observability.health import describe

    labels = {
        "alertname": "HealthCheckFailed",
        "health_action": "drain_node",
        "Hostname": "n7",
        "check": "test ! -e /host/fault/n7",
        "outcome": "exit code 1",
    }
    (action,) = decide([{"labels": labels}])
    assert (
        describe(action.reasons) == "health check `test ! -e /host/fault/n7` failed (exit code 1)"
    )
    del labels["outcome"]  # Alertmanager's own alerts, or an older agent: the short words
    (action,) = decide([{"labels": labels}])
    assert describe(action.reasons) == "health check test ! -e /host/fault/n7 failed"
