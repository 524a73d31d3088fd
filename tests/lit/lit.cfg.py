# lit configuration for tlc's tool tests (see docs/testing.md).
# ruff: noqa: F821  (lit injects `config` and `lit_config`)
import importlib.util
import os
import sys

import lit.formats

config.name = "tlc"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".tlir", ".mlir"]
config.excludes = ["Inputs", "lit.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.environment["PATH"] = os.pathsep.join(
    [os.path.dirname(sys.executable), config.environment.get("PATH", os.environ.get("PATH", ""))]
)
config.environment["PYTHONHASHSEED"] = "0"
# %roundtrip: print then re-parse a file; the result must equal printing it once.
roundtrip = "python -m tlc.tools.roundtrip"
# The tools and filecheck run as forks of one server that has imported them (tests/toolserver.py
# says how and why); TLC_FRESH_TOOLS=1 starts each command as a new process instead.
if os.environ.get("TLC_FRESH_TOOLS") != "1":
    sys.path.insert(0, os.path.dirname(config.test_source_root))
    import toolserver

    tools = toolserver.start(dict(config.environment))
    config.environment["PATH"] = tools + os.pathsep + config.environment["PATH"]
    roundtrip = "tlc-roundtrip"
config.substitutions.append(("%roundtrip", roundtrip))
if os.path.exists("/usr/bin/dot") or any(
    os.path.exists(os.path.join(p, "dot")) for p in os.environ.get("PATH", "").split(os.pathsep)
):
    config.available_features.add("dot")
# Optional importers/exporters: `REQUIRES: torch` / `REQUIRES: onnx`.
for _module in ("torch", "onnx", "onnxruntime"):
    if importlib.util.find_spec(_module) is not None:
        config.available_features.add(_module)
