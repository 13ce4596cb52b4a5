"""Action strings: WebShop's ``name[arg]`` grammar."""

import re

_ACTION_RE = re.compile(r'(.+)\[(.+)\]')


def parse_action(action: str) -> tuple[str, str | None]:
    """Split ``"name[arg]"`` into ``(name, arg.lower())``.

    Same rule as the original ``parse_action``: a greedy prefix match (so text
    after the first line is ignored), the argument lowercased, the name kept as
    typed (``Click[x]`` is not ``click``). No match gives ``(action, None)``.
    """
    match = _ACTION_RE.match(action)
    if match is None:
        return action, None
    name, arg = match.groups()
    return name, arg.lower()
