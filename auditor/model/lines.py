"""Lines a launcher prints that the contract gives a meaning to, as patterns (no I/O).

Shared by the audit's log scanner (:mod:`auditor.collect.log_events`) and the producer kit's
own check at the end of a run (:mod:`auditor.capture.launch`), which may not import a stage:
both must read a launcher's line the same way.
"""

from __future__ import annotations

import re

from auditor.model.kinds import PROCESS_RECORD

ROLE_EXIT = re.compile(
    r"\b(?P<role>[A-Za-z][\w-]*?)(?:[ _-](?:replica|process|worker|rank))?(?:[ _-]?\d+)?"
    r"(?: \(pid \d+\))? (?:exited|terminated)(?: with|,) (?:non-?zero |exit |return )?"
    r"(?:code|status|rc)[:=]? ?(?P<code>-?\d{1,4})\b", re.IGNORECASE)
"""A launcher's own line naming a process's exit: ``policy exited with code 143``,
``rollout replica 1 exited with status 1``, ``policy exited with return code 143``,
``policy terminated with exit code 143``, ``policy exited with non-zero status 143``,
``policy exited, rc=143``."""
NOT_A_ROLE = frozenset({"loop", "main", "job", "script", "command", "launcher", "srun", "step",
                        "task", "it", "process"})
"""Words before "exited with" that name no process of the launcher's (seed 000's own
``Main loop exited with status: 143`` is the controller's status, as the launcher saw it:
:func:`role_exit` reads it as the controller's)."""


ROLE_EXIT_WORDS = ("xited with", "xited,", "erminated with")
"""Words every line :data:`ROLE_EXIT` reads holds (one of them): the logs' prefilters
search for these, and only lines holding one are matched."""


STEP_ENDED = "auditor run --step {role}: command exited"
"""How ``auditor run --step ROLE``'s own line (its stderr, which srun forwards into the batch
log) opens once its command ended."""
CONTROLLER_ENDED = STEP_ENDED.format(role="controller")
"""The controller's wrapper's line: the log's order after it is after the controller's end
(its srun returns only once the step's output is written; the launcher stops its peers
after). The kit writes ``... command exited with 143; ...``: "xited with" is a word the
training log's prefilter looks for (a line of an earlier kit, ``command exited 143``, reaches
the scan only where it excused the 143: ``coordinated_shutdown``, "hut")."""


STEP_CANCELLED = re.compile(r"\*\*\* STEP \S+ ON (\S+) CANCELLED AT "
                            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?! DUE TO )")
"""Slurm's ``*** STEP <job>.<n> ON <node> CANCELLED AT <time> ***``, a step's cancellation
(a launcher's reaping among them; 25.05's ``DUE to SIGNAL Killed`` too): group 1 the node.
Never a ``JOB`` line, nor a step ended ``DUE TO`` a time limit, a preemption, a node failure,
a requeue or a task failure (each a cause of its own, as the log scan reads them)."""


_LAST_PATH = re.compile(r"([^/\s]+)\s*$")
"""The file name the wrapper's line ends by naming (``...; process record
/.../processes/n1-controller-454.json``): its controller's process record."""


def step_end(line: str) -> tuple[str, str] | None:
    """What a batch log's line says of the steps' ends: ``("controller", <record name>)``
    for the controller's wrapper's line (the name empty where it names none: an earlier
    kit's, or one cut short), ``("step", <node>)`` for a step's own cancellation
    (:data:`STEP_CANCELLED`), else None."""
    if CONTROLLER_ENDED in line:
        named = _LAST_PATH.search(line)
        name = named[1] if named is not None else ""
        parts = PROCESS_RECORD.parts(name)
        return "controller", name if parts and parts["role"] == "controller" else ""
    found = STEP_CANCELLED.search(line)
    return ("step", found[1]) if found is not None else None


def mentions_exit(line: str) -> bool:
    """Whether ``line`` holds one of :data:`ROLE_EXIT_WORDS`."""
    return any(word in line for word in ROLE_EXIT_WORDS)


def role_exit(line: str) -> tuple[str, int] | None:
    """(role, exit code) of a launcher's line saying a process exited non-zero, or None."""
    if not mentions_exit(line):
        return None
    match = ROLE_EXIT.search(line)
    if match is None:
        return None
    role = match["role"].lower()
    if role == "loop" and "main loop" in line.lower():
        role = "controller"  # (seed 000's monitor: the controller's status, as it saw it)
    code = int(match["code"])
    if role in NOT_A_ROLE or code == 0:
        return None
    return role, code


def launcher_status(status: str, error: str | None) -> str:
    """The diagnosis's sentence of the launcher's own status (the trial's ``status`` and
    ``validation_error``): one wording, so the report can tell where it says it again."""
    return f"The launcher recorded status {inline_code(status)}" \
        + (f" ({error})" if error else "") + "."


def inline_code(text: str) -> str:
    """``text`` (a value from the evidence) as a markdown code span fenced by more backticks
    than it holds in a row, on one line: a backtick in it never ends the span early."""
    text = " ".join(text.splitlines()) if "\n" in text or "\r" in text else text
    longest = max(map(len, re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
