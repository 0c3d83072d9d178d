"""What Redis ran between two `INFO commandstats` samples: its script calls,
and every command (those the scripts ran inside included, as commandstats
counts them) less the benchmark's own. Standard library only; used by
bench/python/bench.py and bench/saturation/saturation.py."""

from __future__ import annotations

#: The commands that run a script, as INFO commandstats names them.
SCRIPT_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})


def command_counts(
    before: dict[str, int], after: dict[str, int], own: frozenset[str]
) -> tuple[int, int]:
    """Script calls and all commands between two samples (calls per command,
    `config|get` for subcommands), less the commands named in `own`."""
    ran = {name: calls - before.get(name, 0) for name, calls in after.items()}
    scripts = sum(calls for name, calls in ran.items() if name in SCRIPT_COMMANDS)
    commands = sum(calls for name, calls in ran.items() if name.split("|")[0] not in own)
    return scripts, commands
