"""Rewrite README.md's knob table from the code's knob table (the one place
knobs are declared: csrc/common/config.cc). tests/python/test_docs.py fails
when they differ; run this to fix it:  .venv/bin/python scripts/update_readme_knobs.py"""
import os
import re

import maestro_torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = "| variable | Options field | default | group-wide | meaning |\n|---|---|---|---|---|\n"


def table() -> str:
    rows = [f"| `{k['env']}` | `{k['name']}` | `{k['default'] or '(unset)'}` | {'yes' if k['group_wide'] else ''} | "
            f"{k['doc']} |" for k in maestro_torch.knobs()]
    return HEADER + "\n".join(rows) + "\n"


def main():
    path = os.path.join(ROOT, "README.md")
    text = open(path).read()
    new, n = re.subn(re.escape(HEADER) + r"(?:\|.*\|\n)*", table(), text)
    if n != 1:
        raise SystemExit("README.md: knob table not found")
    open(path, "w").write(new)


if __name__ == "__main__":
    main()
