"""Regenerate the generated parts of docs/ from the code (`make docs`).

docs/machine.md and docs/codes.md whole, the CSE mapping table between its markers in
docs/provisioning-hook.md, the man page docs/man/bootfsm.1, the shell completions in
docs/completion/ (installed with the wheel) and the unit's RestartPreventExitStatus=
(every permanent code). The tests fail when a generated part drifts from the code.
"""

from __future__ import annotations

import re
from pathlib import Path

from bootfsm.cli import EXIT_CODES, build_parser
from bootfsm.commands.codes import cse_markdown
from bootfsm.commands.codes import markdown as codes_markdown
from bootfsm.commands.completion import bash, manpage, zsh
from bootfsm.commands.graph import markdown as machine_markdown
from bootfsm.commands.unit import restart_prevent_codes

DOCS = Path(__file__).resolve().parent
UNIT = DOCS.parent / "systemd" / "bootfsm.service"


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
    codes = " ".join(map(str, restart_prevent_codes()))
    unit = re.sub(r"(?m)^RestartPreventExitStatus=.*$", f"RestartPreventExitStatus={codes}",
                  UNIT.read_text())  # fmt: skip
    UNIT.write_text(unit)
    parser = build_parser()
    (DOCS / "man").mkdir(exist_ok=True)
    (DOCS / "man" / "bootfsm.1").write_text(manpage(parser, EXIT_CODES))
    (DOCS / "completion").mkdir(exist_ok=True)
    (DOCS / "completion" / "bootfsm.bash").write_text(bash(parser))
    (DOCS / "completion" / "_bootfsm").write_text(zsh(parser))


if __name__ == "__main__":
    main()
