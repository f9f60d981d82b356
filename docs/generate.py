"""Regenerate the generated parts of docs/ from the code (`make docs`).

docs/machine.md and docs/codes.md whole, and the CSE mapping table between its markers
in docs/provisioning-hook.md. tests/test_docs.py and tests/test_cse_codes.py fail when
a generated part drifts from the code.
"""

from __future__ import annotations

import re
from pathlib import Path

from bootfsm.commands.codes import cse_markdown
from bootfsm.commands.codes import markdown as codes_markdown
from bootfsm.commands.graph import markdown as machine_markdown

DOCS = Path(__file__).resolve().parent


def main() -> None:
    (DOCS / "machine.md").write_text(machine_markdown())
    (DOCS / "codes.md").write_text(codes_markdown())
    hook = DOCS / "provisioning-hook.md"
    text = hook.read_text()
    text = re.sub(
        r"(<!-- cse-table: generated.*?-->\n)(.*?)(<!-- /cse-table -->)",
        lambda m: m.group(1) + cse_markdown() + m.group(3),
        text,
        count=1,
        flags=re.S,
    )
    hook.write_text(text)


if __name__ == "__main__":
    main()
