"""Per-attempt evidence content: allocator traces, device evidence, trial records and
training logs, streamed as byte chunks."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from auditor._studygen.plan import _Run
from auditor._studygen.spec import (
    _CONTROLLER_OUTCOMES,
    _FULL_PHASE_OUTCOMES,
    _LAUNCHER_VERDICT,
    _PARTIAL_PHASE_OUTCOMES,
    _PCI_BUS_IDS,
    _TERMINAL_OUTCOMES,
    GPU_MEMORY_MIB,
    GPU_NAME,
    MIB,
    MS,
    NS,
    SEED_DISPATCH,
    SHUTDOWN_FLAG,
    StudySpec,
    _gpu_uuid,
    _iso_z,
    _jitter,
    _node_ip,
    _ray_time,
    _sacct_time,
    _vllm_time,
)

# --------------------------------------------------------------------------- evidence


class _HashingFile:
    """Write bytes to a file while hashing them, so big files never sit in memory."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("wb")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self._handle.write(data)
        self._hash.update(data)
        self.size += len(data)

    def close(self) -> str:
        self._handle.close()
        return self._hash.hexdigest()


def _write_file(path: Path, chunks: Iterable[bytes]) -> tuple[str, int]:
    """Write ``chunks`` to ``path`` and return (sha256, size) of what was written."""
    sink = _HashingFile(path)
    try:
        for chunk in chunks:
            sink.write(chunk)
    finally:
        digest = sink.close()
    return digest, sink.size


def _rank_offset(run: _Run, rank: int, what: str) -> int:
    """How much earlier than the latest rank this rank finished ``what`` (last rank: 0)."""
    if rank == run.period.gpus - 1:
        return 0
    return _jitter(f"{what}:{run.job_id}:{run.step_index}:{rank}", 3_000_000, 420_000_000)


def _phase_records(run: _Run, rank: int) -> list[dict[str, Any]]:
    """The allocator phase records of one rank, in the order they were written."""
    start = run.started_ns
    peak = (
        run.peak_mib
        if rank == 0
        else run.peak_mib - _jitter(f"rankpeak:{run.job_id}:{run.step_index}:{rank}", 40, 900)
    )
    peak_bytes = peak * MIB
    stagger = rank * 3 * MS + _jitter(f"stagger:{run.job_id}:{run.step_index}:{rank}", 0, MS)
    phases: list[tuple[str, int, int, int, float]] = []
    outcome = run.outcome
    if outcome in _FULL_PHASE_OUTCOMES:
        assert run.actor_update_finished_ns is not None
        assert run.weight_sync_finished_ns is not None
        update_end = run.actor_update_finished_ns - _rank_offset(run, rank, "au")
        sync_end = run.weight_sync_finished_ns - _rank_offset(run, rank, "ws")
        span = run.actor_update_finished_ns - start
        update_len = min(span * 18 // 100, 60 * NS)
        update_start = run.actor_update_finished_ns - update_len + stagger
        phases = [
            ("init_model", 0, start + span * 3 // 100 + stagger, start + span * 35 // 100, 0.42),
            (
                "rollout_init",
                0,
                start + span * 355 // 1000 + stagger,
                start + span * 58 // 100,
                0.88,
            ),
            ("weight_sync", 0, start + span * 585 // 1000 + stagger, start + span * 62 // 100, 0.9),
            (
                "rollout_generate",
                1,
                start + span * 625 // 1000 + stagger,
                update_start - 250 * MS,
                0.96,
            ),
            ("actor_update", 1, update_start, update_end, 1.0),
            ("weight_sync", 1, run.actor_update_finished_ns + 200 * MS + stagger, sync_end, 0.97),
            ("idle", 1, sync_end + 5 * MS, sync_end + 300 * MS + stagger, 0.35),
        ]
    elif outcome == "rollout_init_oom":
        span = run.finished_ns - start
        init_end = start + span * 55 // 100 - _rank_offset(run, rank, "im") // 4
        phases = [
            ("init_model", 0, start + span * 5 // 100 + stagger, init_end, 0.41),
            (
                "rollout_init",
                0,
                start + span * 56 // 100 + stagger,
                start + span * (93 if rank == 0 else 90) // 100 - stagger,
                1.0,
            ),
        ]
    elif outcome in _PARTIAL_PHASE_OUTCOMES:
        assert run.kill_ns is not None
        span = run.kill_ns - start
        phases = [
            ("init_model", 0, start + span * 3 // 100 + stagger, start + span * 30 // 100, 0.42),
            ("rollout_init", 0, start + span * 31 // 100 + stagger, start + span * 50 // 100, 0.88),
            ("weight_sync", 0, start + span * 51 // 100 + stagger, start + span * 54 // 100, 0.9),
            (
                "rollout_generate",
                1,
                start + span * 55 // 100 + stagger,
                start + span * 85 // 100 - stagger,
                1.0,
            ),
        ]
    records = []
    for phase, step, began, ended, fraction in phases:
        reserved = (
            peak_bytes if fraction == 1.0 else int(peak_bytes * fraction) // (2 * MIB) * (2 * MIB)
        )
        allocated = reserved - (2349 if rank == 0 else 1900 + 97 * rank) * MIB
        if fraction != 1.0:
            allocated = reserved * 93 // 100
        record: dict[str, Any] = {
            "pid": run.worker_pids[rank],
            "rank": rank,
            "role": "actor_rollout",
            "seq": 0,
            "phase": phase,
            "step": step,
            "started_ns": began,
            "finished_ns": ended,
            "error_type": "",
            "peak_allocated_bytes": allocated,
            "peak_reserved_bytes": reserved,
        }
        if outcome == "rollout_init_oom" and rank == 0 and phase == "rollout_init":
            record["error_type"] = "torch.OutOfMemoryError"
            record["error_message"] = _oom_message(run)
        records.append(record)
    return records


def _oom_message(run: _Run) -> str:
    free = _jitter(f"free:{run.job_id}:{run.step_index}", 180, 640)
    return (
        "CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity of "
        f"39.38 GiB of which {free}.06 MiB is free. Including non-PyTorch memory, this process "
        f"has {run.peak_mib / 1024:.2f} GiB memory in use."
    )


def _device_peaks(run: _Run, rank: int) -> tuple[int, int]:
    """(peak_allocated_mib, peak_reserved_mib) of one rank, matching its trace."""
    records = _phase_records(run, rank)
    reserved = max(record["peak_reserved_bytes"] for record in records) // MIB
    allocated = max(record["peak_allocated_bytes"] for record in records) // MIB
    return allocated, reserved


_SAMPLE_LINE = '{"pid":%d,"seq":%d,"sample_ns":%d,"allocated_bytes":%d,"reserved_bytes":%d}\n'


def _trace_chunks(run: _Run, rank: int, samples: int) -> Iterator[bytes]:
    """The allocator trace of one rank: phase records and memory samples, in write order.

    Phase records are written when a phase returns, samples when taken; the two are
    merged by time (a record before a sample taken at the same nanosecond). Samples are
    formatted with a plain template so benchmark-sized traces stay fast to write.
    """
    records = sorted(_phase_records(run, rank), key=lambda record: record["finished_ns"])
    pid = run.worker_pids[rank]
    first = run.started_ns + 2 * NS
    span = records[-1]["finished_ns"] - first
    peak = max(record["peak_reserved_bytes"] for record in records)
    block = 2 * MIB
    lines: list[str] = []
    seq = 0
    pending = iter(records)
    record = next(pending, None)
    for index in range(1, samples + 1):
        when = first + span * index // (samples + 1)
        while record is not None and record["finished_ns"] <= when:
            record["seq"] = seq
            lines.append(orjson.dumps(record).decode() + "\n")
            seq += 1
            record = next(pending, None)
        reserved = peak * (index * 90 // (samples + 1)) // 100 // block * block
        lines.append(_SAMPLE_LINE % (pid, seq, when, reserved * 91 // 100, reserved))
        seq += 1
        if len(lines) >= 8192:
            yield "".join(lines).encode()
            lines = []
    while record is not None:
        record["seq"] = seq
        lines.append(orjson.dumps(record).decode() + "\n")
        seq += 1
        record = next(pending, None)
    yield "".join(lines).encode()


def _device_evidence(run: _Run, rank: int) -> dict[str, Any]:
    records = _phase_records(run, rank)
    allocated, reserved = _device_peaks(run, rank)
    captured = max(record["finished_ns"] for record in records) + 100 * MS
    return {
        "schema": "run-evidence/device/v1",
        "role": "actor_rollout",
        "rank": rank,
        "pid": run.worker_pids[rank],
        "job_id": run.job_id,
        "hostname": run.node,
        "cuda_visible_devices": ",".join(str(index) for index in range(run.period.gpus)),
        "local_device": rank,
        "gpu": {
            "uuid": _gpu_uuid(run.node, rank),
            "name": GPU_NAME,
            "pci_bus_id": _PCI_BUS_IDS[rank % len(_PCI_BUS_IDS)],
            "memory_total_mib": GPU_MEMORY_MIB,
        },
        "peak_allocated_mib": allocated,
        "peak_reserved_mib": reserved,
        "captured_ns": captured,
    }


def _invocation_exit(run: _Run) -> tuple[int, str | None, list[dict[str, Any]]]:
    """(exit code, received_signal, processes) of one attempt's trial record."""
    outcome = run.outcome
    driver = run.driver_pid
    if outcome not in _CONTROLLER_OUTCOMES:
        code = 1 if outcome == "rollout_init_oom" else 0
        return code, None, [{"role": "driver", "pid": driver, "exit_code": code}]
    controller, peers, signal = {
        "coordinated_shutdown": (143, 0, None),
        "flag_off_143": (143, 0, None),
        "scancel_sigusr1": (143, 143, "SIGUSR1"),
        "sigkill_137": (137, 0, None),
        "cancelled": (143, 143, "SIGTERM"),
        "timed_out": (143, 143, None),
    }[outcome]
    processes = [
        {"role": "controller", "pid": driver, "exit_code": controller},
        {"role": "policy", "pid": driver + 1, "exit_code": peers},
        {"role": "rollout", "pid": driver + 2, "exit_code": peers},
    ]
    return controller, signal, processes


def _trial_record(run: _Run) -> dict[str, Any]:
    code, signal, processes = _invocation_exit(run)
    status, error = _LAUNCHER_VERDICT[run.outcome]
    return {
        "schema": "run-evidence/trial/v1",
        "job_id": run.job_id,
        "pair": run.period.pair,
        "period": run.period.period,
        "gpus": run.period.gpus,
        "attempt": run.attempt_number,
        "dispatch": dict(SEED_DISPATCH),
        "env": {SHUTDOWN_FLAG: "0" if run.outcome == "flag_off_143" else "1"},
        "invocation": {
            "started_ns": run.started_ns,
            "finished_ns": run.finished_ns,
            "exit_code": code,
            "received_signal": signal,
        },
        "processes": processes,
        "status": status,
        "validation_error": error,
        "peak_mib": run.peak_mib,
    }


# --------------------------------------------------------------------------- training log

_FILLER_TEMPLATES = (
    "{wd}INFO {vt} [gpu_model_runner.py:1245] Loading model weights took 7.1{n3} GiB",
    "{wd}NCCL version 2.21.5+cuda12.4",
    "{tr}[validate_config] All configuration checks passed successfully!",
    "{wd}INFO {vt} [kv_cache_utils.py:716] GPU KV cache size: 11{n3}04 tokens",
    "{wd}Capturing CUDA graph shapes: {pct:3d}%|          | {k}/67 [00:0{d}<00:12,  5.21it/s]",
    "{wd}[Rank {rank}] actor/entropy_coeff=0.001 micro_batch={k} tokens={n3}12",
    "{tr}dataloader worker {k}: prefetched batch {n3} of 234",
)


def _log_chunks(run: _Run, filler: int, study: StudySpec) -> Iterator[bytes]:
    """A realistic verl/Ray console log for one attempt (see OUTCOME_NOTES for markers)."""
    period = run.period
    outcome = run.outcome
    ip = _node_ip(run.node)
    cyan, reset = ("\x1b[36m", "\x1b[0m") if period.ansi else ("", "")
    tr = f"{cyan}(TaskRunner pid={run.driver_pid}){reset} "

    def wd(rank: int) -> str:
        return f"{cyan}(WorkerDict pid={run.worker_pids[rank]}, ip={ip}){reset} "

    begin = run.started_ns
    lines = [
        f"[launcher] {_iso_z(begin)} job {run.job_id} array "
        f"{study.array_job_id}_{run.element.array_task_id} pair {period.pair} "
        f"period {period.period} gpus {period.gpus} attempt {run.attempt_number}",
        '[launcher] dispatch TOTAL_TRAINING_STEPS=1 TRAINER_LOGGER=["console"] RESUME_MODE=disable',
        f"{_ray_time(begin + 5 * NS)}\tINFO worker.py:1917 -- Started a local Ray instance. "
        "View the dashboard at 127.0.0.1:8265 ",
        f"{tr}TaskRunner hostname: {run.node}, PID: {run.driver_pid}",
        f"{tr}{{'trainer': {{'total_training_steps': 1, 'logger': ['console'], "
        f"'resume_mode': 'disable', 'n_gpus_per_node': {period.gpus}, 'nnodes': 1, "
        "'val_before_train': False, 'test_freq': -1, 'save_freq': -1}}",
        f"{tr}Size of train dataloader: 234, Size of val dataloader: 1",
        f"{tr}Total training steps: 1",
    ]
    if outcome in _CONTROLLER_OUTCOMES:
        lines.append(
            f"[controller] {_iso_z(begin + 7 * NS)} {SHUTDOWN_FLAG}="
            f"{'0' if outcome == 'flag_off_143' else '1'}; policy replicas: 1, rollout replicas: 1"
        )
    head = "".join(line + "\n" for line in lines).encode()
    yield head
    if filler:
        yield from _filler_chunks(run, filler, tr, wd)
    lines = [
        f"{wd(0)}Qwen2ForCausalLM contains 7.62B parameters",
        f"{wd(0)}Before building vllm rollout, memory allocated (GB): 14.19, "
        "memory reserved (GB): 14.53",
    ]
    mid = begin + (run.finished_ns - begin) // 2
    if outcome == "rollout_init_oom":
        lines.extend(_oom_lines(run, tr, wd(0), ip))
    else:
        lines.append(
            f"{wd(0)}After building vllm rollout, memory allocated (GB): 31.92, "
            "memory reserved (GB): 33.40"
        )
        lines.append(
            f"{wd(0)}INFO {_vllm_time(mid)} [gpu_worker.py:276] Available KV cache memory: 6.12 GiB"
        )
        lines.append(f"{tr}Training Progress:   0%|          | 0/1 [00:00<?, ?it/s]")
    if outcome in _TERMINAL_OUTCOMES:
        lines.append(tr + _terminal_line(run))
        if period.validation_tail:
            lines.append(f"{tr}step:2 - val-core/openai/gsm8k/reward/mean@1:0.874")
        lines.append(f"{tr}Training Progress: 100%|██████████| 1/1 [02:31<00:00, 151.20s/it]")
    lines.extend(_ending_lines(run, wd))
    lines.extend(period.extra_log_lines)
    yield "".join(line + "\n" for line in lines).encode()


def _ending_lines(run: _Run, wd: Callable[[int], str]) -> list[str]:
    """The log's last lines: how the attempt ended (shutdown, signal, kill, exit status)."""
    outcome = run.outcome
    period = run.period
    lines: list[str] = []
    finished = run.finished_ns
    if outcome == "coordinated_shutdown":
        lines.append(
            f"[controller] {_iso_z(finished - NS)} All policy replicas unregistered; "
            f"{SHUTDOWN_FLAG} is set: coordinated shutdown, sending SIGTERM to self"
        )
    if outcome == "scancel_sigusr1":
        lines.append(
            f"[cosmos-rl-sbatch]: Received SIGUSR1 at {_iso_z(finished - NS)} "
            "(pre-timeout warning); forwarding SIGTERM to the controller"
        )
    if outcome == "sigkill_137":
        lines.append(f"srun: error: {run.node}: task 0: Killed")
    if outcome in ("cancelled", "timed_out"):
        assert run.kill_ns is not None
        reason = " DUE TO TIME LIMIT" if outcome == "timed_out" else ""
        when = _sacct_time(run.kill_ns)
        if outcome == "cancelled":
            lines.append(
                f"[launcher] {_iso_z(run.kill_ns)} received SIGTERM; forwarding to the payload"
            )
        lines.append("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
        lines.append(
            f"slurmstepd: error: *** JOB {run.job_id} ON {run.node} CANCELLED AT {when}{reason} ***"
        )
        lines.append(
            f"slurmstepd: error: *** STEP {run.job_id}.{run.step_index} ON {run.node} "
            f"CANCELLED AT {when}{reason} ***"
        )
    if outcome in _CONTROLLER_OUTCOMES:
        code = _invocation_exit(run)[0]
        lines.append(f"[cosmos-rl-sbatch]: Main loop exited with status: {code}")
    if outcome != "node_failure":
        status, error = _LAUNCHER_VERDICT[outcome]
        code = _invocation_exit(run)[0]
        lines.append(f"[launcher] {_iso_z(finished)} payload exited {code}")
        lines.append(f"[launcher] status: {status}" + (f" ({error})" if error else ""))
        lines.append("INFO:    Terminating squashfuse_ll after timeout")
        lines.append("INFO:    Timeouts can be caused by a running background process")
    else:
        lines.append(
            f"{wd(period.gpus - 1)}INFO {_vllm_time(run.kill_ns or finished)} "
            "[block_pool.py:321] prefix cache hit rate: 0.00%"
        )
    return lines


def _filler_chunks(run: _Run, count: int, tr: str, wd: Any) -> Iterator[bytes]:
    batch: list[str] = []
    vt = _vllm_time(run.started_ns + 30 * NS)
    for index in range(count):
        rank = index % run.period.gpus
        template = _FILLER_TEMPLATES[index % len(_FILLER_TEMPLATES)]
        batch.append(
            template.format(
                wd=wd(rank),
                tr=tr,
                vt=vt,
                n3=f"{index % 1000:03d}",
                pct=index % 101,
                k=index % 67,
                d=index % 10,
                rank=rank,
            )
            + "\n"
        )
        if len(batch) >= 8192:
            yield "".join(batch).encode()
            batch = []
    if batch:
        yield "".join(batch).encode()


def _terminal_line(run: _Run) -> str:
    style = run.period.terminal_style
    metrics = (
        "actor/pg_loss:-0.036 - actor/entropy:0.839 - actor/grad_norm:0.014 - "
        "critic/score/mean:0.412 - response_length/mean:299.922 - timing_s/gen:30.208 - "
        "timing_s/update_actor:40.716 - timing_s/step:152.605 - "
        f"perf/max_memory_reserved_gb:{run.peak_mib / 1024:.3f}"
    )
    if style == "int":
        return f"step:1 - training/global_step:1 - {metrics}"
    if style == "float":
        return f"step:1 - {metrics} - actor/lr:0.000 - training/global_step:1.000"
    if style == "np":
        return (
            f"step:1 - {metrics} - actor/lr:np.float64(1e-06) - "
            "training/global_step:np.int64(1) - training/epoch:np.int64(0)"
        )
    raise ValueError(f"unknown terminal_style {style!r}")


def _oom_lines(run: _Run, tr: str, worker: str, ip: str) -> list[str]:
    actor_id = hashlib.sha256(f"actor:{run.job_id}:{run.step_index}".encode()).hexdigest()[:32]
    return [
        f"{worker}INFO {_vllm_time(run.finished_ns - 20 * NS)} [gpu_worker.py:276] "
        "Allocating KV cache blocks",
        f"{tr}Traceback (most recent call last):",
        f'{tr}  File "/opt/verl/verl/trainer/main_ppo.py", line 93, in run',
        f"{tr}    ray.get(runner.run.remote(config))",
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict."
        f"actor_rollout_init_model() (pid={run.worker_pids[0]}, ip={ip}, actor_id={actor_id}, "
        "repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f3c2c1b5e10>)",
        '  File "/opt/verl/verl/workers/fsdp_workers.py", line 611, in init_model',
        "    self.rollout, self.rollout_sharding_manager = self._build_rollout()",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", '
        "line 243, in initialize_from_config",
        "    self.model_runner.initialize_kv_cache(kv_cache_config)",
        f"torch.OutOfMemoryError: {_oom_message(run)} If reserved but unallocated memory is "
        "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.",
        "Error executing job with overrides: ['trainer.total_training_steps=1', "
        f"\"trainer.logger=['console']\", 'trainer.n_gpus_per_node={run.period.gpus}']",
    ]
