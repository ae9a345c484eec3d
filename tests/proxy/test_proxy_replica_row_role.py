"""The proxy's replica row for an upstream nothing else describes carries the role and deploy time it was
given (`infersight proxy --role candidate --deploy-time T`), as the baseline rule reads them."""

from __future__ import annotations

import argparse

import pytest

from engine.serving.proxy.cli import add_arguments
from engine.serving.proxy.upstream_info import UpstreamInfo, replica_record


def test_role_and_deploy_time_reach_the_replica_row():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--upstream", "http://127.0.0.1:1", "--role", "candidate",
                              "--deploy-time", "1700000000.5"])
    info = UpstreamInfo(model="m", owned_by="vllm", version="0.32.0")
    row = replica_record("v1", "http://127.0.0.1:1", info, None, role=args.role, deploy_time=args.deploy_time)
    assert (row.role, row.deploy_time) == ("candidate", 1_700_000_000.5)
    # none given: no role, and no deploy time
    plain = replica_record("v1", "http://127.0.0.1:1", info)
    assert (plain.role, plain.deploy_time) == ("", 0.0)  # unknown: the proxy's launch is not the deploy
    with pytest.raises(SystemExit):  # a role the rule does not know is refused at the command line
        parser.parse_args(["--upstream", "http://127.0.0.1:1", "--role", "canary"])
