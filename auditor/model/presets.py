"""Terminal-event matchers as data (contract v1.2, "Terminal-event matchers"): what a
protocol's ``terminal_event`` says, and each framework's preset.

A :class:`TerminalSpec` is plain data (patterns as text, never code); the collectors compile
it (:mod:`auditor.collect.terminal`). Each preset matches its framework's own end-of-training
output as its source code prints it (the file and line are in
``tests/terminal/SOURCES.md``), after the scanner has removed ANSI codes and the
launchers' prefixes (Ray's ``(TaskRunner pid=N)``, torchrun's ``[rank0]:``). ``triggers``
are literal words one of which every line a preset can match holds: the log's prefilter
looks for them, so a preset costs no full decode of the log.
"""

from __future__ import annotations

from dataclasses import dataclass

JsonTest = tuple[str, str, object]
"""One JSON predicate: (dotted field path, ``"equals"`` or ``"field"``, the literal it must
equal or the other field's dotted path)."""


@dataclass(frozen=True, slots=True)
class TerminalSpec:
    """What ends training, as a protocol or a preset says it."""

    preset: str | None = None
    patterns: tuple[str, ...] = ()
    """Any may match; each has a named group ``step`` and may have ``total`` (then the event
    needs ``step == total``)."""
    offset: int = 0
    """Added to ``step`` and ``total`` (a 0-based logger's)."""
    veto: tuple[str, ...] = ()
    """A line matching one voids every terminal event of its file."""
    marker: tuple[str, ...] = ()
    """End lines that name no step (weaker evidence)."""
    restart: tuple[str, ...] = ()
    """A line matching one forgets the end lines before it in its file: the framework ran
    trial fits and is restoring the state it saved before them (a preset's own, never a
    protocol's: Lightning's learning-rate and batch-size finders)."""
    markers_count: bool = False
    """Whether the markers may stand for the event (the protocol gave ``marker``)."""
    json: tuple[JsonTest, ...] = ()
    """Predicates a JSON record (``:::MLLOG`` line, JSON-lines file, metrics document) must
    all meet to be the event."""
    triggers: tuple[str, ...] = ()
    """Words for the prefilter; empty: every line is examined (a protocol's own pattern)."""

    @property
    def builtin(self) -> bool:
        """Whether steps are verl's (``step:N ... training/global_step:N``, the built-in
        matcher): the ``verl`` preset, or no preset, and no pattern of its own."""
        return self.preset in ("verl", None) and not self.patterns and not self.json


@dataclass(frozen=True, slots=True)
class Preset:
    """A framework's preset: its spec, and what the README's table says of it."""

    spec: TerminalSpec
    sample: str
    """A line (or record) it matches, as the framework prints it."""
    traps: str
    """What it never accepts."""
    ends: tuple[str, ...] = ()
    """Its end lines in a short human form, ``{step}`` where the logger prints the step (the
    report names what the log lacks in the framework's words, not the pattern's)."""
    markers: tuple[str, ...] = ()
    """Its step-less end lines (markers) in a short human form."""
    json_in_log: bool = False
    """Whether its JSON predicates meet a training log's own records (``:::MLLOG``), not
    only a metrics file's (hf-trainer's ``trainer_state.json``): what a log can lack."""


VERL = TerminalSpec(preset="verl")

_STEP_TOTAL = "(?P<step>[0-9]+)"

PRESETS: dict[str, Preset] = {
    "verl": Preset(
        VERL, "(TaskRunner pid=3165) step:435 - ... - training/global_step:435 - ...",
        "a validation-only `step:N` line (no `training/global_step`, v0.2); "
        "`timing_s/step:`; a step above or below N"),
    "verl-sft": Preset(
        TerminalSpec(preset="verl-sft",
                     # (not only at a line's start: rank 0's tqdm bar on stderr has no newline,
                     # so in a log both streams share the line is `...6.10s/it]step:N - ...`;
                     # only a space, the bar's `]` or a double quote before it: `global_step:`,
                     # `timing_s/step:`, 'step:N ...' stay out; a double quote is the quoted-line
                     # rule's to judge (a forwarder's "msg": "step:N ..." counts, as verl's)
                     patterns=(r"(?:^|(?<=[\s\]\"]))step:(?P<step>[0-9]+)(?:\.0+)? - (?:.* - )?"
                               r"train/loss:",),
                     triggers=("step:",)),
        "step:120 - train/loss:0.41 - train/lr(1e-3):0.010",
        "the `step:N - val/loss:` line after a 0-based run's last training step",
        ends=("step:{step} - ... - train/loss:",)),
    "openrlhf": Preset(
        TerminalSpec(preset="openrlhf", patterns=(r"Global step " + _STEP_TOTAL + r": ",),
                     triggers=("Global step",)),
        "(PPOTrainer pid=88) ✨ Global step 200: {'policy_loss': 0.01, ...}",
        "`Eval at step N`; no total is printed, so only the dispatched N counts",
        ends=("Global step {step}:",)),
    "lightning": Preset(
        TerminalSpec(preset="lightning",
                     # (the line states its own last step: step and total at once)
                     patterns=(r"`Trainer\.fit` stopped: `max_steps=(?P<step>(?P<total>[0-9]+))"
                               r"` reached\.",),
                     marker=(r"`Trainer\.fit` stopped: `max_epochs=[0-9]+` reached\.",),
                     # (tuner.py's finders save the state, fit max_steps=100 (lr_find) or 3
                     # (scale_batch_size) steps a trial, then restore it from that file)
                     restart=(r"Restor(?:ing|ed all) states from the checkpoint (?:path )?"
                              r"at .*\.(?:lr_find|scale_batch_size)_[0-9a-f-]+\.ckpt",),
                     triggers=("Trainer.fit", ".lr_find_", ".scale_batch_size_")),
        "`Trainer.fit` stopped: `max_steps=1000` reached.",
        "`No training batches.`; `max_epochs=K` counts epochs (a marker only); a learning-rate "
        "or batch-size finder's trial fit (its state then restored from `.lr_find_*.ckpt`)",
        ends=("`Trainer.fit` stopped: `max_steps={step}` reached.",),
        markers=("`Trainer.fit` stopped: `max_epochs=K` reached.",)),
    "hf-trainer": Preset(
        TerminalSpec(preset="hf-trainer", marker=(r"""\{['"]train_runtime['"]: """,),
                     json=(("global_step", "field", "max_steps"),),
                     triggers=("train_runtime",)),
        "{'train_runtime': 30.17, 'train_samples_per_second': 4.2, ..., 'epoch': 3.0}; "
        "trainer_state.json `global_step == max_steps`",
        "the final metrics record names no step (a marker only); a checkpoint's state "
        "before the last step",
        markers=("{'train_runtime': ...}",)),
    "llamafactory": Preset(
        TerminalSpec(preset="llamafactory",
                     json=(("current_steps", "field", "total_steps"),),
                     triggers=("current_steps",)),
        '{"current_steps": 1000, "total_steps": 1000, "percentage": 100.0, ...} '
        "(trainer_log.jsonl)",
        "a record short of `total_steps`"),
    "torchtitan": Preset(
        TerminalSpec(preset="torchtitan",
                     patterns=(r"(?:^|- )step:\s*" + _STEP_TOTAL + r"\s+loss:",),
                     veto=(r"Ran out of data; last step was canceled\.",),
                     marker=(r"- Training completed$",),
                     triggers=("step:", "Training completed", "Ran out of data")),
        "[rank0]:[titan] ... - root - INFO - step: 100  loss:  2.89959  grad_norm: ...",
        "`Training completed` after `Ran out of data; last step was canceled.` (vetoed); "
        "`validate step: N`; a last step `log_freq` skipped (only the marker is left)",
        ends=("step: {step}  loss:",), markers=("- Training completed",)),
    "megatron": Preset(
        TerminalSpec(preset="megatron",
                     patterns=(r"(?:^|\s|\] )iteration\s+" + _STEP_TOTAL
                               + r"/\s*(?P<total>[0-9]+) \|",),
                     marker=(r"\[after training is done\] datetime:",),
                     triggers=("iteration", "after training is done")),
        " [2026-08-20 10:11:12] iteration      100/     100 | consumed samples: ...",
        "a last printed iteration below N (`log_interval`); `[exiting program ...]`; "
        "`[before the start of training step]`",
        ends=("iteration {step}/{step} |",), markers=("[after training is done] datetime:",)),
    "nemo": Preset(
        TerminalSpec(preset="nemo",
                     patterns=(r"Training epoch [0-9]+, iteration " + _STEP_TOTAL
                               + r"/(?P<total>[0-9]+)(?: \||$)",
                               # (`iteration` counts within an epoch, so past one epoch the
                               # last line is `iteration 99/299` or, under max_epochs, every
                               # epoch's end reads `99/99`; MegatronStrategy's `global_step`,
                               # 0-based too, counts the run's steps across epochs and resumes)
                               r"Training epoch [0-9]+, iteration [0-9]+/[0-9]+ \|(?:.* \|)? "
                               r"global_step: " + _STEP_TOTAL + r"(?: \||$)"),
                     offset=1, triggers=("iteration",)),
        "Training epoch 0, iteration 149/149 | lr: 3e-05 | ... | global_step: 149",
        "0-based: `iteration 149/149` is step 150 of 150; `Validation: iteration N/M`",
        ends=("Training epoch E, iteration {step}/{step}", "| global_step: {step}")),
    "deepspeed": Preset(
        TerminalSpec(preset="deepspeed",
                     patterns=(r"\[Rank 0\] step=" + _STEP_TOTAL + r", skipped=[0-9]+,",),
                     triggers=("step=",)),
        "[2026-08-20 10:11:12,345] [INFO] [logging.py:123:log_dist] [Rank 0] step=1000, "
        "skipped=0, lr=[3e-05], mom=[(0.9, 0.999)]",
        "the `step=0` line at start-up; off by default (`steps_per_print`)",
        ends=("[Rank 0] step={step}, skipped=",)),
    "mllog": Preset(
        TerminalSpec(preset="mllog",
                     json=(("key", "equals", "run_stop"),
                           ("metadata.status", "equals", "success")),
                     triggers=(":::MLLOG",)),
        ':::MLLOG {"namespace": "", "time_ms": 1744839180560, "event_type": "INTERVAL_END", '
        '"key": "run_stop", "value": null, "metadata": {"file": "...", "lineno": 2113, '
        '"status": "success"}}',
        "`run_stop` with `\"status\": \"aborted\"` (`unclean_exit`, cause `aborted`); "
        "`epoch_stop`, `eval_stop`; no `run_stop`", json_in_log=True),
    "cosmos-rl": Preset(
        TerminalSpec(preset="cosmos-rl",
                     patterns=(r"(?:^|- )Step: " + _STEP_TOTAL
                               + r"/(?P<total>[0-9]+), .*?(?:Average loss|Loss): ",),
                     triggers=("Step:",)),
        "[cosmos] 2025-10-28 11:02:26,101 - cosmos - INFO - Step: 200/200, Reward Mean: "
        "0.5625, ..., Average loss: 0.01230, ...",
        "`Validation at step N/M`; `Training step: N/M` (printed before the step); "
        "a v0.1 reward line without a loss; `Step: N/M` with N below M",
        ends=("Step: {step}/{step}, ... Average loss:",)),
}
"""Every preset the contract names, by name."""
