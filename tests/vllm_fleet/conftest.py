"""One plain vLLM for the modules here that only talk to it (plain_vllm.py says why and what it serves)."""

from __future__ import annotations

import pytest
from plain_vllm import FIXTURE, SERVED, TEMPLATE, last_module_using

from engine.core.model_refs import REFERENCE_MODEL


@pytest.fixture(scope="session")
def chat_template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(TEMPLATE)
    return path


@pytest.fixture(scope="session")
def _plain_vllm_server(chat_template_file, tmp_path_factory):
    """{"server": the running vLLM or None}; started on first use, stopped by plain_vllm after its last module."""
    held: dict = {"server": None}
    yield held
    if held["server"] is not None:
        held["server"].stop()


@pytest.fixture(scope="module")
def plain_vllm(request, _plain_vllm_server, chat_template_file, tmp_path_factory):
    from engine.serving.vllm_adapter.launch import start_vllm_server

    held = _plain_vllm_server
    if held["server"] is None:
        held["server"] = start_vllm_server(REFERENCE_MODEL, served_model_name=SERVED, plugin=False,
                                           chat_template=chat_template_file,
                                           log_path=tmp_path_factory.mktemp("vllm-log") / "vllm.log")
    yield held["server"]
    if last_module_using(request.session.items, FIXTURE) is request.module:
        held["server"].stop()  # the modules after this one start vLLMs of their own
        held["server"] = None
