"""Test-session settings. Under CI (`CI` set, as `.ci/run`'s runner does) hypothesis draws the
same examples on every run (`derandomize`), so a submission's result does not depend on the
random draw; locally each run explores new examples."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
