"""httpcore imports sniffio on every request; where it is absent the proxy records the absence once
(engine/serving/proxy/app.py), so each import fails at once instead of searching sys.path again."""

import importlib.util
import sys

import pytest

import engine.serving.proxy.app  # noqa: F401 - the import is what records it


def test_an_absent_sniffio_is_recorded_so_httpcore_does_not_search_for_it_per_request():
    if "sniffio" in sys.modules and sys.modules["sniffio"] is not None:
        pytest.skip("sniffio is installed: there is no absence to record")
    assert "sniffio" in sys.modules and sys.modules["sniffio"] is None
    assert importlib.util.find_spec("sniffio") is None  # answered from sys.modules: no path search
