"""The docs must match the code: README's knob table is the knob table."""
import os
import re

import maestro_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_knob_table_matches_the_code():
    readme = open(os.path.join(ROOT, "README.md")).read()
    rows = re.findall(r"^\| `(MAESTRO_\w+)` \| `(\w+)` \| `([^`]*)` \| (yes)? *\| (.*) \|$", readme, re.M)
    documented = {env: (name, default, bool(gw), doc) for env, name, default, gw, doc in rows}
    code = {k["env"]: (k["name"], k["default"] or "(unset)", k["group_wide"], k["doc"]) for k in maestro_torch.knobs()}
    assert documented == code, ("README's knob table differs from csrc/common/config.cc: "
                                "run .venv/bin/python scripts/update_readme_knobs.py")


def test_readme_commands_exist():
    readme = open(os.path.join(ROOT, "README.md")).read()
    for script in ("scripts/demo.sh", "scripts/test.sh"):
        assert script in readme and os.access(os.path.join(ROOT, script), os.X_OK)
    assert "scripts/test.sh --full" in readme
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^exec bash scripts/test\.sh --full$", ci, re.M), "CI must run the full tier"
