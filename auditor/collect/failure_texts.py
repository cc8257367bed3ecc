"""The texts that tell what ended a run, as :mod:`auditor.collect.log_events` looks for them
in a line: memory, NCCL, Slurm's cancellations, crashes and signals, a dead actor or child,
a node failure, the contract v1.2 causes (a GPU fault, storage, rendezvous, Ray's control
plane, the network, divergence, an engine's death), a coordinated shutdown; and the hedges
after which a message only lists what *might* have happened. Data: each text from real
logs of that ending (``fixtures/causes``)."""

from __future__ import annotations

import re
from collections.abc import Callable

import ahocorasick_rs

from auditor.model.lines import (
    CONTROLLER_ENDED,
    ROLE_EXIT_WORDS,
    mentions_exit,
    role_exit,
    step_end,
)

# Failure texts, most specific first: the first one found is the event's detail.
_HOST_OOM = (
    "killed due to memory pressure",  # Ray's raylet: "N Workers ... killed due to memory
    # pressure (OOM)" (contract v1.2: a raylet's memory-pressure kill is the host's)
    "exceeded memory limit",  # slurmstepd: "Job 123 exceeded memory limit (.. > ..)"
    "Out Of Memory",  # srun: "task 0: Out Of Memory"
    "ray.exceptions.OutOfMemoryError",  # Ray's memory monitor killed the task: host RAM
    "RayOutOfMemoryError",  # (its legacy ray.memory_monitor's: "More than 95% of the memory")
    "Task was killed due to the node running low on memory",
    "exceeds the memory usage threshold",
    "oom-kill",  # kernel "invoked oom-killer", slurmstepd "oom-kill event(s)"
    "oom_kill",
    "Out of memory: Killed process",
    "Out of memory: Kill process",
    "out-of-memory handler",
    "Memory cgroup out of memory",
)
_GPU_OOM = (
    "torch.cuda.OutOfMemoryError",
    "torch.OutOfMemoryError",
    "RayTaskError(OutOfMemoryError)",  # a remote task raised torch's OutOfMemoryError
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUDA Error: out of memory",  # vLLM's cumem allocator (sleep mode wake-up)
    "cudaErrorMemoryAllocation",
    "HIP out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS's handle or workspace: its cudaMalloc failed
    "Cuda failure 'out of memory'",  # NCCL's own allocation: "NCCL WARN Cuda failure '...'"
)
_KV_CACHE = "No available memory for the cache blocks"  # vLLM V0
_KV_CACHE_NAMES = ("KV cache", "kv cache", "KV Cache")
_KV_CACHE_TROUBLE = (  # vLLM V1: "... larger than the available KV cache memory ..."
    "Error",
    "nsufficient",
    "not enough",
    "Not enough",
    "larger than the available",
    "Try increasing",
)
_NCCL_TIMEOUT = (
    "Watchdog caught collective operation timeout",
    "Timeout at NCCL work",
    "NCCL operations have failed or timed out",
    "Heartbeat monitor timed out",
    "heartbeat monitor timed out",
    "watchdog got stuck",
)
_NCCL_ERROR = (
    "NCCL error",  # torch: "DistBackendError: NCCL error in: ...ProcessGroupNCCL.cpp..."
    "ncclSystemError",
    "ncclInternalError",
    "ncclRemoteError",
)
"""An NCCL communication failure: the system, NCCL itself or a peer (a network error)."""
_NOT_NCCL_FAULT = ("invalid usage", "nvalidUsage", "cuda error", "udaError", "out of memory")
"""What makes an "NCCL error" the code's (invalid usage) or the GPU's (a CUDA error, out of
memory), not the communication's."""
_TIMEOUT_WORD = re.compile(r"\bTimeout\b(?!\s*\(ms\))")
"""After ``ProcessGroupNCCL``: a timeout named in other words (not the ``Timeout(ms)`` setting)."""
# What ended a run (contract v1.1 "Causes"), from real logs of each ending (fixtures/causes):
# each a literal the prefilter finds (training_log._TRIGGER_WORDS) and a check on the line.
_SEGFAULT = re.compile(r"Segmentation fault|\bSIGSEGV\b|return code = -11\b")
"""A worker's own crash report (torchrun's summary of a child killed by SIGSEGV is its
``child_failed``, read from that summary)."""
_DEATH_SIGNAL = re.compile(
    r"Received (?:(?P<number>\d{1,9})|Signals\.(?P<name>SIG[A-Z0-9]+)) death signal"
    # (torch's agent logs its Signals member: "15" on Python 3.11+, "Signals.SIGTERM" before)
    r"|<Signals\.(?P<member>SIG[A-Z0-9]+): \d+>"
    r"|SignalException: Process \d+ got signal: (?P<got>\d{1,9})\b"
    r"|exits with return code = -(?P<code>\d{1,9})\b")
_SHELL_KILL = re.compile(r"(?:^|\bline \d+:\s+\d+ |task \d+: )(Killed|Aborted|Bus error)\b")
_ACTOR_DIED = re.compile(r"(?:ActorDiedError|RayActorError)(?:\)|:)|The actor died unexpectedly"
                         r"|The actor is dead because|A worker died or was killed while")
_RAY_TASK_ERROR = re.compile(r"RayTaskError\((\w+)\)")
_CHILD_FAILED = "ChildFailedError"
_ROOT_CAUSE = "Root Cause (first observed failure)"
_ROOT_FIELD = re.compile(r"^\s*(rank|exitcode)\s*: (-?\d{1,9})\b")
"""A field of torchrun's root-cause table (numbers of at most 9 digits: a longer one is no
rank nor exit code, and never reaches int())."""
_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d{1,9})\) local_rank: (\d{1,9}) \(pid: \d+\)")
_NODE_FAILURE = re.compile(r"\b(?:srun|salloc|sbatch): error: Node failure on (\S+)"
                           r"|DUE TO NODE FAILURE")
# contract v1.2 "More causes", each from real public logs (fixtures/causes/SOURCES.md): the
# first pattern a line matches names its event (an engine's death first: the error inside
# the engine that caused it is its root, a gpu_error or gpu_oom line of its own)
_MORE_CAUSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("engine_dead", re.compile(
        r"\b(?:Async)?EngineDeadError\b|EngineCore encountered an issue|EngineCore failed to start"
        r"|Engine core initialization failed|Background loop has errored already"
        r"|Background loop is stopped|AsyncLLM output_handler failed"
        r"|Received sigquit from a child process|Scheduler hit an exception"
        r"|output_handler failed|EngineCore encountered a fatal error"
        r"|Worker proc \S{1,100} died unexpectedly, shutting down executor")),
    ("gpu_error", re.compile(
        r"CUDA error: (?:an illegal memory access was encountered|unspecified launch failure"
        r"|uncorrectable ECC error encountered|an illegal instruction was encountered"
        r"|misaligned address|unknown error|the launch timed out and was terminated"
        r"|ECC error)|NVRM: Xid \([^)]{0,40}\): \d{1,4}|cudaErrorIllegalAddress"
        r"|cudaErrorLaunchFailure|cudaErrorECCUncorrectable|GPU has fallen off the bus"
        r"|\bGPU is lost\b")),
    ("nan_loss", re.compile(
        r"found (?:NaN|Inf) in local grad norm|Unexpected result (?:nan|inf)\b"
        r"|Got NaN losses|\b[Ll]oss (?:is|was|became) (?:NaN|nan|inf|Inf)\b"
        r"|\bLoss became infinite or NaN\b|\bNaN detected in (?:the )?loss\b"
        r"|loss scale already at minimum|Minimum loss scale reached")),
    ("storage", re.compile(
        r"No space left on device|Disk quota exceeded|\[Errno (?:28|122|5)\]"
        r"|failed with Input/output error|: Input/output error\b"
        r"|PytorchStreamWriter failed writing file|\bunexpected pos \d+ vs \d+")),
    ("rendezvous", re.compile(
        r"Rendezvous(?:Timeout|Connection|Closed)Error|DistStoreError"
        r"|clients? joined|The client socket has (?:timed out after|failed to connect)"
        r"|TCP client failed to connect")),
    ("ray_system", re.compile(
        r"Failed to connect to GCS|Failed to get (?:the )?cluster ID from GCS"
        r"|GCS may have been killed|GCS has been unresponsive|RaySystemError"
        r"|GCS server [^.]{0,80}is unreachable")),
    ("network", re.compile(
        r"429 Client Error|HTTP Error 429|Too Many Requests|We couldn't connect to '"
        r"|Max retries exceeded with url|Failed to establish a new connection"
        r"|Temporary failure in name resolution|NameResolutionError|errors\.CommError\b"
        r"|ConnectionPool\(host=[^)]{1,200}\): Read timed out|ConnectTimeoutError"
        r"|Connection to \S{1,200} timed out\. \(connect timeout"
        r"|Run initialization has timed out")),
)
_MORE_WORDS: dict[str, tuple[str, ...]] = {
    "engine_dead": ("EngineDead", "EngineCore", "Engine core", "Background loop",
                    "output_handler", "sigquit", "Scheduler hit", "died unexpectedly"),
    "gpu_error": ("CUDA error", "NVRM: Xid", "cudaError", "fallen off", "GPU is lost"),
    "nan_loss": ("NaN", "in local grad norm", "Unexpected result", "oss is", "oss was",
                 "oss became", "oss scale"),
    "storage": ("space left", "quota", "Errno", "StreamWriter", "unexpected pos",
                "Input/output error"),
    "rendezvous": ("Rendezvous", "DistStore", "joined", "client socket", "TCP client"),
    "ray_system": ("GCS", "RaySystemError"),
    "network": ("429", "Too Many", "couldn't connect", "Max retries", "new connection",
                "name resolution", "NameResolution", "CommError",
                "initialization has timed out", "Read timed out", "ConnectTimeout",
                "connect timeout"),
}
"""Per kind of :data:`_MORE_CAUSES`, a literal of each alternative of its pattern: a line
holding none of a kind's is not searched by its pattern (a test checks each alternative
holds one)."""
_MORE_ANY = ahocorasick_rs.AhoCorasick(
    [word for words in _MORE_WORDS.values() for word in words],
    matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
"""Every :data:`_MORE_WORDS` literal: a line holding none is not searched by the patterns (one
automaton pass: 39 substring tests a line were most of a small log's scan)."""
_MORE_EVERY = ahocorasick_rs.AhoCorasick([word for words in _MORE_WORDS.values()
                                          for word in words])
"""The same words, every occurrence found (overlapping), on a line :data:`_MORE_ANY` hit (a
pass of this one alone on every line was 5-9% slower on dense logs than the quick look
first: measured, and kept)."""
_MORE_KINDS: tuple[str, ...] = tuple(kind for kind, words in _MORE_WORDS.items() for _ in words)
"""The kind of each of :data:`_MORE_EVERY`'s words, by index."""
_RAY_NODE_DEAD = re.compile(r"has been marked dead because the (?:detector|monitor) has missed "
                            r"too many heartbeats|been marked as dead by the GCS")
"""Ray's GCS marking a node dead, or the node's raylet told so as it exits ("Exiting because
this node manager has mistakenly been marked as dead by the GCS": ray-project/ray#28562)
(contract v1.2: ``node_failure``)."""
_NO_RAYLET_KILL = re.compile(r"(?<![\d,])0 Workers \(tasks / actors\) killed due to memory")
"""A raylet's periodic summary that counts no memory-pressure kill ("0 Workers (tasks /
actors) killed due to memory pressure (OOM), 2 Workers crashed due to other reasons")."""
ROOT_CAUSE_LINES = 12
"""Lines after torchrun's ``Root Cause`` header in which its rank and exit code are read."""

_SLURM_CANCEL = re.compile(
    r"\*\*\* (?P<what>JOB|STEP) (?P<id>[\w.+\[\]-]+)(?: ON \S+)? CANCELLED AT \S+(?P<rest>[^*]*)"
)
_SHUTDOWN = re.compile(  # run on the lower-cased line; bounded repeats keep it linear
    r"coordinated[\s_-]{1,3}(?:[a-z]{1,20}[\s_-]{1,3})?shut(?:ting)?[\s_-]{0,3}down"
    r"|cosmos_shutdown_on_no_policy_replicas(?!\s*=|['\"]\s*[:,=])"  # not an assignment
    r"|shut(?:ting)?[\s_-]{0,3}down\b.{0,120}?\bno\s{1,3}(?:[a-z]{1,20}\s{1,3})?policy[\s_-]"
    r"{1,3}replicas?"
    r"|\bno\s{1,3}(?:[a-z]{1,20}\s{1,3})?policy[\s_-]{1,3}replicas?\b.{0,120}?shut(?:ting)?"
    r"[\s_-]{0,3}down"
)


_HEDGES = ("Some common causes include", "There are some potential root causes",
           "Possible causes", "possible causes")
"""Where a message starts listing what *might* have happened (Ray's worker-death text names
"SIGSEGV" and "the OOM killer" among them): never evidence (contract v1.2)."""


def _unhedged(content: str) -> str:
    """``content`` before its first hedge (:data:`_HEDGES`): what it says happened."""
    for hedge in _HEDGES:
        at = content.find(hedge)
        if at >= 0:
            content = content[:at]
    return content

_RETRYING = re.compile(r"\bRetrying \(Retry\(|\bRetrying in \d")
"""A client's notice that it will try again (urllib3's "Retrying (Retry(total=4, ...)) after
connection broken by 'ConnectTimeoutError(...)'"): no end of the run (contract v1.2)."""
_EXCEPTION_STANDALONE = re.compile(
    r"((?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception)(?:\([\w.]+\))?):\s"
)  # (a bare ``Exception: ...`` too)


CHILD = "child_failed?"
"""What :func:`failure_events` gives where torchrun's summary of a failed child is to be read
(by :meth:`_Scanner._child_failed`, which keeps its table's state)."""

FAILURE_GATE_WORDS = (
    "emory", "oom", "ALLOC_FAILED", "cache", "Cache", "NCCL", "atchdog", "eartbeat", "nccl",
    "CANCELLED", *ROLE_EXIT_WORDS, "hut", "HUT", "olicy", "OLICY",
    # (_ends)
    "failed (exitcode", "egmentation", "SIGSEGV", "-11", "ignal", "Killed", "Aborted",
    "Bus error", "return code", "ctor", "worker died", "RayTaskError(", _CHILD_FAILED,
    _ROOT_CAUSE, "ode failure", "NODE FAILURE", "marked",
    *(word for words in _MORE_WORDS.values() for word in words),
)  # fmt: skip
"""The words each test of :func:`failure_events` starts with (``"emory" in content or ...``),
with no root-cause table open: a text holding none shows no event, and one automaton pass
says so (a test checks every such word is here)."""
FAILURE_GATE = ahocorasick_rs.AhoCorasick(
    list(FAILURE_GATE_WORDS), matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)


def failure_events(content: str, root_cause_open: bool = False) -> tuple[tuple[str, str], ...]:
    """The events ``content`` (a line's text, before any hedge) shows, as (kind, detail) in
    the order they are added; :data:`CHILD` where torchrun's summary of a failed child is
    read (stateful: the scanner reads it). A pure function of its arguments, so its result
    for a text already seen is remembered (``_Scanner.memo``)."""
    out: list[tuple[str, str]] = []
    add = out.append
    if "emory" in content or "oom" in content or "ALLOC_FAILED" in content:
        host = _first(content, _HOST_OOM)
        if host == _HOST_OOM[0] and _NO_RAYLET_KILL.search(content):
            host = None  # (a raylet's summary that counts no memory kill)
        if host:
            add(("host_oom", host))
        else:
            gpu = _first(content, _GPU_OOM)
            if gpu:
                add(("gpu_oom", gpu))
    if ("cache" in content or "Cache" in content) and (
        _KV_CACHE in content
        or (_first(content, _KV_CACHE_NAMES) and _first(content, _KV_CACHE_TROUBLE))
    ):
        exception = _EXCEPTION_STANDALONE.match(content)
        detail = exception.group(1) if exception else ""
        add(("kv_cache_init_failure", detail))
    if "NCCL" in content or "atchdog" in content or "eartbeat" in content \
            or "nccl" in content:
        nccl = _first(content, _NCCL_TIMEOUT)
        if nccl:
            add(("nccl_timeout", nccl))
        elif "Timeout" in content and _nccl_timeout_word(content):
            add(("nccl_timeout", "ProcessGroupNCCL Timeout"))
        else:
            error = _first(content, _NCCL_ERROR)
            if error and not _first(content, _NOT_NCCL_FAULT):
                add(("nccl_error", error))
    if "CANCELLED" in content:
        slurm = _SLURM_CANCEL.search(content)
        if slurm:
            rest = slurm["rest"].upper()
            kind = "slurm_time_limit" if "DUE TO TIME LIMIT" in rest \
                else "slurm_preempted" if "DUE TO PREEMPTION" in rest \
                or "DUE TO JOB REQUEUE" in rest \
                else "node_failure" if "DUE TO NODE FAILURE" in rest \
                else "slurm_task_failure" if "DUE TO TASK FAILURE" in rest \
                else "slurm_step_cancelled" if slurm["what"] == "STEP" \
                else "slurm_cancelled"
            add((kind, slurm["id"]))
    # (the controller's wrapper's line, "... command exited with 143; ...": the steps Slurm
    # cancelled after it in the log were reaped; an earlier kit's line reaches here where it
    # says "coordinated_shutdown")
    if CONTROLLER_ENDED in content:  # (its detail: the record it names, whose end it marks)
        add(("controller_ended", (step_end(content) or ("", ""))[1]))
    if mentions_exit(content):
        said = role_exit(content)
        if said is not None:
            add(("role_exit", f"{said[0]} {said[1]}"))
    _ends(content, root_cause_open, add)
    if "hut" in content or "HUT" in content or "olicy" in content or "OLICY" in content:
        lowered = content.lower()
        if "shut" in lowered and _SHUTDOWN.search(lowered):
            add(("coordinated_shutdown", ""))

    return tuple(out)


def _ends(text: str, root_cause_open: bool,
         add: Callable[[tuple[str, str]], None]) -> None:
    """What ended a run, beyond memory, NCCL and Slurm's own lines: a segmentation
    fault, a signal, a dead actor, a failed child (torchrun's root cause), a node
    failure, an exception a Ray task raised (``text``: the line before any hedge)."""
    if root_cause_open or "failed (exitcode" in text:
        # torchrun's summary of a failed child (its agent line, its root-cause table):
        # what it says of a signal is the child's exit, read as child_failed
        add((CHILD, ""))
        return
    if "egmentation" in text or "SIGSEGV" in text or "-11" in text:  # (exitcode: -11)
        if _SEGFAULT.search(text):
            add(("segfault", "segmentation fault (SIGSEGV)"))
            return
    if "ignal" in text or "Killed" in text or "Aborted" in text or "Bus error" in text \
            or "return code" in text:
        # (death signal, <Signals.SIGKILL: 9>, got signal; a shell's Killed/Aborted)
        found = _DEATH_SIGNAL.search(text)
        if found:
            number_or_name = found["name"] or found["member"] or _signal_name(
                found["number"] or found["got"] or found["code"])
            # (torchrun's agent *received* it and passes it on to its workers; who sent
            # it, the log does not say: contract v1.2, signals named as received)
            received = (", received by torchrun's elastic agent (sender not in the log)"
                        if "death signal" in text or "SignalException" in text else "")
            # (the agent's signal handler raises SignalException in the agent itself)
            add(("signal", f"{number_or_name}{received}"))
        elif (shell := _SHELL_KILL.search(text.strip())) is not None:
            name = {"Killed": "SIGKILL", "Aborted": "SIGABRT",
                    "Bus error": "SIGBUS"}[shell.group(1)]
            add(("signal", f"{name} (the shell's report)"))
    if ("ctor" in text or "actor" in text or "worker died" in text) \
            and _ACTOR_DIED.search(text):
        add(("actor_died", "a Ray actor died"))
    elif "RayTaskError(" in text and _EXCEPTION_STANDALONE.match(text) is None:
        # (a line that is the exception itself is one already)
        task = _RAY_TASK_ERROR.search(text)
        if task and task.group(1) not in ("ActorDiedError", "RayActorError"):
            add(("exception", f"RayTaskError({task.group(1)})"))
    if _CHILD_FAILED in text or _ROOT_CAUSE in text:
        add((CHILD, ""))
    if ("ode failure" in text or "NODE FAILURE" in text) and "CANCELLED" not in text:
        node = _NODE_FAILURE.search(text)
        if node:
            add(("node_failure",
                 f"node failure on {node.group(1)}" if node.group(1) else ""))
    if "marked" in text and _RAY_NODE_DEAD.search(text):
        add(("node_failure", "Ray marked a node dead (missed heartbeats)"))
    if _MORE_ANY.find_matches_as_indexes(text):
        # (only the patterns of a kind one of whose words the line holds: most lines hold
        # one kind's, and a pattern of a dozen alternatives searches slowly)
        held = {_MORE_KINDS[index] for index, _, _ in
                _MORE_EVERY.find_matches_as_indexes(text, overlapping=True)}
        for kind, pattern in _MORE_CAUSES:
            if kind not in held:
                continue
            found = pattern.search(text)
            if found and not (kind == "network" and _RETRYING.search(text)):
                add((kind, found.group(0)))
                break


def _nccl_timeout_word(content: str) -> bool:
    """``ProcessGroupNCCL`` followed later by the word ``Timeout`` (linear, no backtracking)."""
    start = content.find("ProcessGroupNCCL")
    return start >= 0 and _TIMEOUT_WORD.search(content, start) is not None


def _signal_name(number: str | None) -> str:
    """``SIGTERM`` for ``"15"`` (the number as it is when Python does not know it)."""
    import signal

    try:
        return signal.Signals(int(number or "")).name
    except ValueError:
        return f"signal {number}"


def _first(text: str, needles: tuple[str, ...]) -> str | None:
    """The first of ``needles`` (in their order) that occurs in ``text``."""
    for needle in needles:
        if needle in text:
            return needle
    return None
