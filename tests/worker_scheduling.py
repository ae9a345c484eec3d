"""How `pytest -n 2 --dist loadscope` splits the suite between its workers (tests/conftest.py installs
this scheduler for loadscope): a test module is one unit of work, so its module fixtures (a store, a
fleet) are built once, on one worker; and the vLLM directories together are one unit, so one worker runs
every test that starts a vLLM. A vLLM server costs minutes and GBs to start, two at once would crowd
this 2-core machine, and tests/vllm_fleet's plain vLLM is shared by several modules and stopped after the
last of them, which must run in the process that started it.

xdist's own loadscope makes a unit of each class rather than each module, and its loadgroup (units by
`xdist_group` mark) does not group on this pytest: it renames the test ids through an attribute that
pytest 9 no longer reads. The controller that schedules sees only test ids, so the vLLM unit is named by
directory; tests/conftest.py fails the collection of a test marked `vllm` outside these directories."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

VLLM_DIRS = ("tests/vllm_fleet/", "tests/vllm_plugin/")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: "vllm", or its module's path."""
    if nodeid.startswith(VLLM_DIRS):
        return "vllm"
    return nodeid.split("::", 1)[0]


class ModulesAndVllm(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
