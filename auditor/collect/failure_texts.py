"""The texts that tell what ended a run, as :mod:`auditor.collect.log_events` looks for them
in a line: memory, NCCL, Slurm's cancellations, crashes and signals, a dead actor or child,
a node failure, the contract v1.2 causes (a GPU fault, storage, rendezvous, Ray's control
plane, the network, divergence, an engine's death), a coordinated shutdown; and the hedges
after which a message only lists what *might* have happened. Data: each text from real
logs of that ending (``fixtures/causes``)."""

from __future__ import annotations

import re

import ahocorasick_rs

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
"""The same words, every occurrence found (overlapping), on a line :data:`_MORE_ANY` hit."""
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
