"""Every framework's end of training, and its traps (issue 42, contract v1.2 "Terminal-event
matchers"). Each line is made here from the framework's own format string (cited in
``SOURCES.md``), under its launchers' prefixes and colours; each preset must find the
dispatched step's line and accept none of its framework's traps."""

from __future__ import annotations

import io
import json
import pprint
from pathlib import Path
from typing import Any

import pytest

from auditor._cli import main
from auditor.collect.terminal import SpecError, resolve
from auditor.collect.training_log import scan_training_log
from auditor.model import TrainingLogScan
from auditor.model.presets import PRESETS

N = 100
RAY = "\x1b[36m({actor} pid=3165)\x1b[0m "  # (ray worker.py: coloured unless RAY_COLOR_PREFIX=0)


def _scan(lines: list[str], preset: str | None, steps: int | None = N,
          **extra: Any) -> TrainingLogScan:
    spec = resolve(preset, **extra)
    data = "".join(line + "\n" for line in lines).encode()
    return scan_training_log(io.BytesIO(data), "training-1.log", steps, terminal=spec)


def _found(lines: list[str], preset: str, **extra: Any) -> bool:
    return _scan(lines, preset, **extra).terminal_event is not None


# ------------------------------------------------------------------------- formats


def verl_line(step: int, metrics: dict[str, float], pformat: bool = False) -> str:
    """verl's ``concat_dict_to_str`` (v0.4.1 ``{v:.3f}``; v0.5+ ``pprint.pformat(v)``)."""
    out = [f"step:{step}"]
    for key, value in metrics.items():
        out.append(f"{key}:{pprint.pformat(value)}" if pformat else f"{key}:{value:.3f}")
    return " - ".join(out)


def titan_step(step: int, loss: float = 2.89959) -> str:
    red, green, orange, reset = "\033[31m", "\033[32m", "\033[38;2;180;60;0m", "\033[39m"
    message = (f"{red}step: {step:2}  {green}loss: {loss:8.5f}  "
               f"{orange}grad_norm: {0.9573:7.4f}{reset}")
    return f"[rank0]:[titan] 2026-05-18 16:06:47,301 - root - INFO - {message}"


def titan_info(message: str, level: str = "INFO") -> str:
    return f"[rank0]:[titan] 2026-05-18 16:06:51,630 - root - {level} - {message}"


def megatron_iteration(iteration: int, total: int) -> str:
    log_string = " [2026-08-20 10:11:12]"
    # (Megatron's own str.format calls, as training.py writes them)
    log_string += " iteration {:8d}/{:8d} |".format(iteration, total)  # noqa: UP032
    log_string += " consumed samples: {:12d} |".format(iteration * 128)  # noqa: UP032
    return log_string + " lm loss: 1.702113E+00 |"


def nemo_line(n: int, total: int, epoch: int = 0, description: str = "Training",
              step: int | None = None) -> str:
    """``n`` counts within the epoch (``strategy.current_epoch_step``); ``step`` is the run's
    (MegatronStrategy logs ``global_step``, 0-based), ``n`` unless given."""
    log_string = description + f" epoch {epoch}, iteration {n - 1}/{total - 1}"
    for metric, val in {"lr": 3e-05, "global_step": float((n if step is None else step) - 1),
                        "reduced_train_loss": 1.234}.items():
        log_string += f" | {metric}: {int(val)}" if val.is_integer() else f" | {metric}: {val:.4}"
    return log_string


def deepspeed_line(step: int) -> str:
    return (f"[2026-08-20 10:11:12,345] [INFO] [logging.py:123:log_dist] [Rank 0] "
            f"step={step}, skipped=0, lr=[3e-05], mom=[(0.9, 0.999)]")


def mllog(key: str, status: str | None = None, prefix: str = "") -> str:
    metadata: dict[str, object] = {"file": "/workspace/run.py", "lineno": 2113}
    if status is not None:
        metadata["status"] = status
    record = {"namespace": "", "time_ms": 1744839180560, "event_type": "INTERVAL_END",
              "key": key, "value": None, "metadata": metadata}
    return prefix + ":::MLLOG " + json.dumps(record)


def cosmos_rl(step: int, total: int) -> str:
    return ("[cosmos] 2025-10-28 11:02:26,101 - cosmos - INFO - "
            f"Step: {step}/{total}, Reward Mean: {0.5625:.4f}, Reward Std: {0.49:.4f}, "
            f"Average loss: {0.0123:.5f}, Max loss: {0.0456:.5f}, Iteration time: {12.59:.2f}s.")


def cosmos_sft(step: int, total: int) -> str:
    return ("[rank0]:[cosmos] 2025-10-28 11:02:26,976 - cosmos - INFO - "
            f"Step: {step}/{total}, Loss: {1.23456:.5f}, Grad norm: {2.5:.5f}, "
            f"Iteration time: {3.21:.2f}s")


# ------------------------------------------------------------------------- presets


def test_verl_default_unchanged_and_its_trap() -> None:
    done = RAY.format(actor="TaskRunner") + verl_line(N, {"actor/pg_loss": -0.012,
                                                          "training/global_step": N})
    assert _found([done], "verl") and _scan([done], None).terminal_event is not None
    newer = RAY.format(actor="TaskRunner") + verl_line(
        N, {"actor/entropy": 0.118, "training/global_step": N}, pformat=True)
    assert _found([newer], "verl")
    # v0.2: the last line is validation-only (`val/test_score`), after `step:N-1`
    v02 = [RAY.format(actor="main_task") + verl_line(N - 1, {"critic/score/mean": 0.512}),
           RAY.format(actor="main_task") + verl_line(N, {"val/test_score/gsm8k": 0.731})]
    assert not _found(v02, "verl")


def test_verl_sft() -> None:
    line = "[rank0]:" + verl_line(N, {"train/loss": 0.41, "train/lr(1e-3)": 0.01})
    assert _found([line], "verl-sft")
    # v0.2: 0-based training, then `step:N - val/loss` (the trap: no train/loss there)
    old = [verl_line(N - 1, {"train/loss": 0.412, "train/lr(1e-3)": 0.01}),
           verl_line(N, {"val/loss": 0.439})]
    assert not _found(old, "verl-sft")


def tqdm_bar(desc: str, n: int, total: int = N) -> str:
    """A tqdm refresh as it reaches a file: ``\\r``, the bar, no newline (tqdm ``std.py``
    ``format_meter``: ``{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate}]``)."""
    return f"\r{desc}: {n * 100 // total:3d}%|█████████▉| {n}/{total} [10:00<00:06,  6.10s/it]"


def test_verl_sft_step_line_glued_to_rank_zeros_progress_bar() -> None:
    """verl's SFT trainers (``fsdp_sft_trainer.py`` ``:757-773``, ``sft_trainer.py``
    ``:301-344``) iterate under a tqdm bar on stderr and print the step line on stdout: where
    both streams go to one file (SLURM's ``--output``) each step line follows its bar on the
    same line, ``...6.10s/it]step:N - train/loss:...``, and the last of them is the end."""
    metrics = {"train/loss": 0.41, "train/grad_norm": 1.2, "train/lr": 1e-05,
               "train/global_tokens": 81920}
    lines = [tqdm_bar("Epoch 1/1", N - 2) + verl_line(N - 1, metrics, pformat=True)
             + tqdm_bar("Epoch 1/1", N - 1) + verl_line(N, metrics, pformat=True),
             verl_line(N, {"val/loss": 0.439}, pformat=True),
             "Final validation metrics: {'val/loss': 0.439}"]
    scan = _scan(lines, "verl-sft")
    assert scan.terminal_event is not None and scan.terminal_event.line == 1
    # (the bar's count is no step: a line short of N still ends nothing)
    assert not _found([tqdm_bar("Epoch 1/1", N - 1) + verl_line(N - 1, metrics)], "verl-sft")
    # (other keys ending in `step:` are not verl's step, glued or not)
    for key in ("timing_s/step", "train/global_step", "]global_step"):
        assert not _found([f"{key}:{N} - train/loss:0.410"], "verl-sft"), key


def test_openrlhf() -> None:
    prefix = RAY.format(actor="PPOTrainer")
    line = prefix + f"INFO 11-30 10:00:00 ppo_trainer.py:547] ✨ Global step {N}: " + \
        str({"policy_loss": 0.01})
    assert _found([line], "openrlhf")
    assert not _found([prefix + f"Eval at step {N}", line.replace(f" {N}:", f" {N - 1}:")],
                      "openrlhf")


def test_a_presets_line_a_message_quotes_is_no_end() -> None:
    """A launcher's or an exception's message quoting a framework's end line (as verl's
    matcher refuses one): never that framework's own output, for every preset's pattern."""
    ray = RAY.format(actor="PPOTrainer")
    openrlhf = f"✨ Global step {N}: " + str({"policy_loss": 0.01})
    for quoted in (f'[launcher] error: the log lacks "{openrlhf}"',
                   f"[launcher] error: the log lacks '{openrlhf}'",
                   f"ValueError: no end line: {openrlhf}"):
        assert not _found([ray + quoted], "openrlhf"), quoted
    assert _found([ray + "INFO 11-30 10:00:00 ppo_trainer.py:547] " + openrlhf], "openrlhf")
    own = deepspeed_line(N).split("[logging.py:123:log_dist] ")[1]  # ([Rank 0] step=N, ...)
    for quoted_ds in (f"[launcher] no end: '{own}'", f'[launcher] no end: "{own}"',
                      f"AssertionError: {own}"):
        assert not _found([deepspeed_line(0), quoted_ds], "deepspeed"), quoted_ds
    assert _found([deepspeed_line(0), f"[launcher] ok: {own}"], "deepspeed")  # (unquoted)
    assert _found([deepspeed_line(0), deepspeed_line(N)], "deepspeed")


def test_a_frame_line_ends_nothing_yet_its_veto_holds() -> None:
    """A traceback's frame or source line is code quoting text: its copy of an end line
    is no end, yet a veto there still voids the file's end (errs towards unresolved)."""
    frame = ["Traceback (most recent call last):",
             '  File "/opt/torchtitan/train.py", line 9, in <module>']
    # (a source line shows its comment too: no quote there, and still code, not output)
    assert not _found([*frame, f"    trainer.fit()  # step:{N} - training/global_step:{N}"],
                      "verl")
    assert not _found([titan_step(N), *frame,
                       '    raise RuntimeError("Ran out of data; last step was canceled.")',
                       "RuntimeError: stop"], "torchtitan")
    assert _found([titan_step(N), *frame, "    trainer.close()", "RuntimeError: stop"],
                  "torchtitan")


def test_lightning() -> None:
    bar = "Epoch 0: 100%|██████████| 100/100 [00:10<00:00,  9.8it/s, v_num=0]"
    stopped = f"`Trainer.fit` stopped: `max_steps={N!r}` reached."
    assert _found([bar + stopped], "lightning")  # (stderr glued to stdout's bar)
    epochs = "`Trainer.fit` stopped: `max_epochs=3` reached."
    assert not _found([epochs], "lightning")  # (counts epochs: a marker, not by default)
    scan = _scan([epochs], "lightning", marker=True)
    assert scan.terminal_event is not None and scan.terminal_event.kind == "terminal_marker"
    assert not _found(["No training batches."], "lightning", marker=True)
    assert not _found([f"`Trainer.fit` stopped: `max_steps={N - 10}` reached."], "lightning")
    # (the line states its own last step: without a dispatched count it is the end alone)
    assert _scan([stopped], "lightning", steps=None).terminal_event is not None


LR_FIND = "/workspace/.lr_find_0b1c6a52-4e2d-4b6f-9a0e-4a1f2f0d9b3c.ckpt"
BATCH_FIND = "/workspace/.scale_batch_size_ecc0c8e8-6ba5-426f-963f-e717de5a9ec6.ckpt"


def _tuned(found: str, ckpt: str) -> list[str]:
    """A tuner's trial fit (tuner/lr_finder.py, batch_size_scaling.py: max_steps set to its
    trial's steps, then the state saved before it restored: checkpoint_connector.py's two
    lines), as a real log shows it."""
    return [f"Finding best initial lr: 100%|██████████| {N}/{N} [00:20<00:00]{found}",
            f"Restoring states from the checkpoint path at {ckpt}",
            f"Restored all states from the checkpoint at {ckpt}",
            "Learning rate set to 0.0003019951720402019"]


def test_lightning_tuners_trial_fits_are_not_the_end() -> None:
    stopped = f"`Trainer.fit` stopped: `max_steps={N}` reached."
    timer = ("Epoch 0:  60%|██████    | 60/100 [10:00<06:40]Time limit reached. Elapsed time "
             "is 0:10:00. Signaling Trainer to stop.")
    for ckpt in (LR_FIND, BATCH_FIND):
        scan = _scan([*_tuned(stopped, ckpt), timer], "lightning")
        assert scan.terminal_event is None and scan.last_step is None
        assert [e.line for e in scan.events if e.kind == "terminal_forgotten"] == [2]
        scan = _scan([*_tuned(stopped, ckpt), stopped], "lightning")
        assert scan.terminal_event is not None and scan.terminal_event.line == 5
    # (an epoch marker of the trial's is forgotten too; a checkpoint of the run's own is no
    # trial's, and restoring from it forgets nothing)
    epochs = "`Trainer.fit` stopped: `max_epochs=1` reached."
    assert not _found([*_tuned(epochs, LR_FIND), timer], "lightning", marker=True)
    assert _found([stopped, f"Restoring states from the checkpoint path at {LR_FIND[:11]}"
                   "last.ckpt"], "lightning")


def test_hf_trainer_final_record_is_a_marker_only() -> None:
    final = str({"train_runtime": 30.17, "train_samples_per_second": 4.2,
                 "train_loss": 1.2, "epoch": 3.0})
    assert not _found([final], "hf-trainer")  # (no step number: never by default)
    scan = _scan([final], "hf-trainer", marker=True)
    assert scan.terminal_event is not None and scan.terminal_event.kind == "terminal_marker"
    assert not _found([str({"loss": 1.2, "learning_rate": 1e-5, "epoch": 2.9})], "hf-trainer",
                      marker=True)


def test_torchtitan_and_running_out_of_data() -> None:
    end = [titan_step(N), titan_info("Sleeping 2 seconds for other ranks to complete"),
           titan_info("Training completed")]
    assert _found(end, "torchtitan")
    out_of_data = [titan_step(90), titan_info("Ran out of data; last step was canceled.",
                                              "WARNING"),
                   titan_info("Training completed")]
    assert not _found(out_of_data, "torchtitan", marker=True)  # (vetoed, marker or not)
    vetoed = _scan([titan_step(N), *out_of_data[1:]], "torchtitan")
    assert vetoed.terminal_event is None
    assert [e.kind for e in vetoed.events if e.kind == "terminal_vetoed"] == ["terminal_vetoed"]
    assert not _found([titan_info(f"\033[33mvalidate step: {N}  loss: 2.0\033[39m")],
                      "torchtitan")
    skipped = [titan_step(90), titan_info("Training completed")]  # (log_freq skipped step N)
    assert not _found(skipped, "torchtitan")
    marked = _scan(skipped, "torchtitan", marker=True)
    assert marked.terminal_event is not None and marked.terminal_event.kind == "terminal_marker"


def test_megatron() -> None:
    assert _found([megatron_iteration(N, N)], "megatron")
    assert _found(["[rank7]:" + megatron_iteration(N, N)], "megatron")
    below = [megatron_iteration(90, N), "[after training is done] datetime: 2026-08-20 "
             "10:11:14 "]
    assert not _found(below, "megatron")  # (a last printed iteration below N)
    marked = _scan(below, "megatron", marker=True)
    assert marked.terminal_event is not None and marked.terminal_event.kind == "terminal_marker"
    assert not _found([megatron_iteration(N, N + 50)], "megatron")  # (step below its total)
    assert not _found(["[exiting program at iteration 100] datetime: 2026-08-20 10:11:14 "],
                      "megatron", marker=True)
    assert _scan([megatron_iteration(N, N)], "megatron", steps=None).terminal_event is not None


def test_nemo_is_zero_based() -> None:
    assert _found([nemo_line(N, N)], "nemo")  # (iteration 99/99 is step 100 of 100)
    assert not _found([nemo_line(N - 1, N)], "nemo")
    assert not _found([nemo_line(N, N, description="Validation:")], "nemo")


def test_nemo_past_one_epoch_ends_at_its_global_step() -> None:
    """NeMo's ``iteration`` counts within an epoch (``progress_printer.py:125``,
    ``current_epoch_step``: Lightning resets it every epoch) and its total is ``max_steps``,
    or one epoch's batches under ``max_epochs``: a run longer than one epoch never prints
    ``iteration N-1/N-1``. Its last line's ``global_step`` (0-based) is the run's step."""
    epochs = [nemo_line(N, N, epoch=k, step=(k + 1) * N) for k in range(3)]  # (max_epochs=3)
    scan = _scan(epochs, "nemo", steps=3 * N)
    assert scan.terminal_event is not None and scan.terminal_event.line == 3
    steps = [nemo_line(N, 3 * N, epoch=k, step=(k + 1) * N) for k in range(3)]  # (max_steps)
    scan = _scan(steps, "nemo", steps=3 * N)
    assert scan.terminal_event is not None and scan.terminal_event.line == 3
    # (a last line short of the dispatched step, and the first epoch's end, are no end)
    assert not _found([*steps[:2], nemo_line(N - 1, 3 * N, epoch=2, step=3 * N - 1)], "nemo",
                      steps=3 * N)
    assert not _found(epochs[:1], "nemo", steps=3 * N)
    assert not _found([nemo_line(N, N, description="Validation:", step=3 * N)], "nemo",
                      steps=3 * N)


def test_deepspeed() -> None:
    assert _found([deepspeed_line(0), deepspeed_line(N)], "deepspeed")
    assert not _found([deepspeed_line(0)], "deepspeed")


def test_mllog_run_stop_success_aborted_and_missing() -> None:
    assert _found([mllog("run_start"), mllog("run_stop", "success", " 0: ")], "mllog")
    aborted = _scan([mllog("run_stop", "aborted", "[1,0]<stdout>:")], "mllog")
    assert aborted.terminal_event is None
    assert [e.kind for e in aborted.events] == ["aborted"]
    assert not _found([mllog("run_start"), mllog("epoch_stop"), mllog("eval_stop")], "mllog")
    # an aborted run_stop is the trainer's own abort under any protocol, verl's included
    assert [e.kind for e in _scan([mllog("run_stop", "aborted")], None).events] == ["aborted"]


def test_cosmos_rl() -> None:
    assert _found([cosmos_rl(N, N)], "cosmos-rl")
    assert _found([cosmos_sft(N, N)], "cosmos-rl")
    traps = [cosmos_rl(N - 1, N),
             f"[cosmos] x - cosmos - INFO - Validation at step {N}/{N}...",
             f"[cosmos] x - cosmos - INFO - Training step: {N}/{N}",
             f"[cosmos] x - cosmos - INFO - Step: {N}/{N}, Reward Mean: 0.5, Reward Std: 0.4"]
    assert not _found(traps, "cosmos-rl")


# ------------------------------------------------------------------------- matchers


def test_patterns_total_offset_and_veto_as_a_protocol_gives_them() -> None:
    patterns = (r"done (?P<step>\d+) of (?P<total>\d+)",)
    assert _scan([f"done {N} of {N}"], None, patterns=patterns).terminal_event is not None
    assert _scan([f"done {N} of {N + 1}"], None, patterns=patterns).terminal_event is None
    assert _scan([f"done {N - 1} of {N - 1}"], None, patterns=patterns,
                 offset=1).terminal_event is not None
    assert _scan([f"done {N} of {N}", "ABORT"], None, patterns=patterns,
                 veto=("ABORT",)).terminal_event is None


@pytest.mark.parametrize(("preset", "patterns", "said"), [
    ("tensorflow", (), "is not one of"),
    (None, (r"finished (\d+)",), "no named group 'step'"),
    (None, (r"finished (?P<step>\d+",), "does not compile"),
])
def test_an_unusable_matcher_is_refused_in_one_line(
        preset: str | None, patterns: tuple[str, ...], said: str) -> None:
    with pytest.raises(SpecError, match=said):
        resolve(preset, patterns=patterns)


def test_the_schema_names_every_preset() -> None:
    schema = json.loads((Path(__file__).parents[2] / "auditor" / "schemas"
                         / "protocol.schema.json").read_text())
    enum = schema["properties"]["terminal_event"]["properties"]["preset"]["enum"]
    assert enum == list(PRESETS)


def test_causes_applies_a_protocols_matcher(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join([titan_step(90), titan_info("Training completed")]) + "\n")
    protocol = tmp_path / "protocol.json"
    protocol.write_text(json.dumps({"terminal_event": {"preset": "torchtitan",
                                                       "marker": True}}))
    assert main(["causes", str(log), "--steps", str(N), "--protocol", str(protocol),
                 "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["terminal_event"] == 2
    assert document["terminal_evidence"].startswith("marker (no step number shown")
    assert main(["causes", str(log), "--steps", str(N)]) == 0  # (verl's default: none)
    assert "cause: none found" in capsys.readouterr().out
    protocol.write_text(json.dumps({"terminal_event": {"preset": "tensorflow"}}))
    assert main(["causes", str(log), "--protocol", str(protocol)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tensorflow" in err
    # (refused: no built-in matcher applies instead, as the audit's finding says; and the
    # key the protocol gave is not called another's)
    protocol.write_text(json.dumps({"terminal_event": {"patterns": [r"done (?P<n>\d+)"]}}))
    assert main(["causes", str(log), "--protocol", str(protocol)]) == 2
    err = capsys.readouterr().err
    assert "no named group 'step'" in err and "built-in matcher applies" not in err
    assert "terminal_event.pattern " not in err


def test_a_line_at_its_own_total_is_not_another_runs_end() -> None:
    """``iteration 50/50`` is the end of a 50-step run: with 100 dispatched, not this one's."""
    assert not _found([megatron_iteration(N // 2, N // 2)], "megatron")
    assert not _found([cosmos_rl(N // 2, N // 2)], "cosmos-rl")


@pytest.mark.parametrize(("records", "found"), [
    ([{"current_steps": N, "total_steps": N, "percentage": 100.0}], True),
    ([{"current_steps": N - 1, "total_steps": N, "loss": 1.0}], False),
    ([{"current_steps": N // 2, "total_steps": N // 2, "percentage": 100.0}], False),
    ([{"current_steps": True, "total_steps": True}], False),
])
def test_json_lines_records(records: list[dict[str, object]], found: bool) -> None:
    """LlamaFactory's ``trainer_log.jsonl`` (``LogCallback``): the record at
    ``total_steps``, where that is the dispatched count."""
    from auditor.collect.metrics import read_metrics

    data = "".join(json.dumps(record) + "\n" for record in records).encode()
    scan = read_metrics(io.BytesIO(b"not json\n" + data), "metrics/trainer_log.jsonl",
                        PRESETS["llamafactory"].spec, N)
    assert (scan.terminal_event is not None) is found


def test_a_json_lines_file_a_resumed_run_appended_to_ends_at_its_own_end() -> None:
    """LlamaFactory's ``trainer_log.jsonl`` is appended to and kept across a resume
    (``callbacks.py``: removed only under ``overwrite_output_dir``): an earlier run's
    ``N/N``, then the resumed run's records from step 10 again, is no end; the step going
    back is named where a marker would be refuted."""
    from auditor.collect.metrics import read_metrics

    def scan(counts: list[int]) -> Any:
        data = "".join(json.dumps({"current_steps": n, "total_steps": N, "loss": 0.5}) + "\n"
                       for n in counts).encode()
        return read_metrics(io.BytesIO(data), "metrics/trainer_log.jsonl",
                            PRESETS["llamafactory"].spec, N)

    earlier = list(range(10, N + 1, 10))
    cut = scan([*earlier, 10, 20, 30])
    assert cut.terminal_event is None
    assert [(e.kind, e.line) for e in cut.events] == [("stopped_short", len(earlier) + 1)]
    assert "go back to step 10" in cut.events[0].detail
    ended = scan([*earlier, 10, 20, *earlier[2:]])
    assert ended.terminal_event is not None and ended.terminal_event.line == 2 * len(earlier)
    assert ended.events == ()
    again = scan([*earlier, N])  # (an evaluation record at the end's step: still the end)
    assert again.terminal_event is not None and again.terminal_event.line == len(earlier)


def test_a_json_line_cut_is_named_and_text_between_is_not() -> None:
    """A metrics file's line that opens a JSON object and is none (cut as it was written)
    is an AUD003 at its line; a line of plain text (an MLPerf log's, a banner) is passed
    over without one, as before."""
    from auditor.collect.metrics import read_metrics

    data = (b"a banner line\n" + json.dumps({"current_steps": 1}).encode() + b"\n"
            + b'{"current_steps": 2, "total_st\n')
    scan = read_metrics(io.BytesIO(data), "metrics/trainer_log.jsonl",
                        PRESETS["llamafactory"].spec, N)
    assert [(f.rule_id, f.citations[0].line) for f in scan.findings] == [("AUD003", 3)]


def test_the_readmes_protocols_read_without_a_finding() -> None:
    """The README's ``terminal_event`` examples are protocols the audit takes as they are."""
    import re

    from auditor.collect.protocol import read_protocol

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    blocks = [block for block in re.findall(r"```json\n(.*?)```", readme, re.S)
              if '"terminal_event"' in block]
    assert len(blocks) >= 2
    for block in blocks:
        protocol = read_protocol(io.BytesIO(block.encode()), "protocol.json")
        assert protocol.findings == () and protocol.terminal is not None, block


def test_a_metrics_file_of_broken_lines_keeps_a_hundred_findings() -> None:
    """Review T: each broken line of a metrics file was made a finding, and a file of
    millions held gigabytes (6.6 GB for 204 MB). Line findings are capped as a trace's are
    (:data:`~auditor.collect.allocator_trace.FINDINGS_CAP`), the rest counted in one
    ``AUD013``; a terminal record after them is still found."""
    from auditor.collect.allocator_trace import FINDINGS_CAP
    from auditor.collect.metrics import read_metrics

    data = b"{'step': 1}\n" * 1000 + json.dumps({"current_steps": N, "total_steps": N}
                                               ).encode() + b"\n"
    scan = read_metrics(io.BytesIO(data), "metrics/trainer_log.jsonl",
                        PRESETS["llamafactory"].spec, N)
    assert [f.rule_id for f in scan.findings] == ["AUD003"] * FINDINGS_CAP + ["AUD013"]
    assert scan.findings[-1].message.endswith(
        f"{1000 - FINDINGS_CAP} further findings not kept (cap {FINDINGS_CAP})")
    assert scan.terminal_event is not None and scan.terminal_event.line == 1001
