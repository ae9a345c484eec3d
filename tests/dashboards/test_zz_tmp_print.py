import sys
sys.path.insert(0, "/work/main/tests/dashboards")
from test_streamlit_pages import *  # noqa

def test_print(app):
    at = app("compare")
    at.radio(key="cmp_dimension").set_value("engine version").run()
    print("ERR", [e.value for e in at.error], "SUCC", [s.value for s in at.success], "INFO", [i.value for i in at.info])
