"""The records that cross steps and hosts, typed: one strict pydantic model each, all owned here.

| record | model | written by | read by |
|---|---|---|---|
| ``<state_dir>/deployment.json`` | ``DeploymentRecord`` | launch, swap-drafter (on the host: the launch script fills in the PID) | server-state, converge, status, the host's PID check |
| ``<state_dir>/last-good.json`` | ``LastGood`` (+ ``Metrics``, ``Baseline``) | record-good | rollback, regression-gate, same-night-control, status, node groups |
| ``<state_dir>/quarantine.json`` | ``QuarantineRecord`` (+ ``QuarantineEntry``) | ``deploy/remote/quarantine.py`` (stdlib, on the host) | the quarantine step, the session's outcome |
| ``<state_dir>/canary.json`` | ``CanaryMark`` | the canary's window (fleet/canary.py) | ``status`` (facts/status.py) |
| the accept-length measurement | ``AcceptMeasurement`` | verify-acceptance (``StepMemory.verify``) | record-good, the host's facts |
| swap-drafter's memory | ``DrafterUpdate`` | swap-drafter (``StepMemory.drafter_update``) | launch (a reload's record), the host's facts |
| the canary's window | ``CanaryWindow`` (+ ``IntervalFigures``, ``CanaryDecision``) | fleet/canary.py (``FleetMemory.canary``) | the fleet report, ``--json``, the canary page |
| the benchmark measurement | ``BenchMeasurement`` | the benchmark step (``StepMemory.bench``) | record-good, regression-gate, the host's facts |
| the same-night control | ``ControlMeasurement`` | same-night-control (``StepMemory.control``) | regression-gate |
| the gate's verdict | ``GateVerdict`` | regression-gate (``StepMemory.gate``) | record-good, the host's facts (history, reports) |

Every model forbids fields it does not know; a record (a file, or a measurement kept in history) carries
``schema_version`` (the step memories and the canary window, never written as files, do not). A reader of a file goes
through ``validated`` or ``record_of``: a document without ``schema_version`` is one written before it existed (this
module's ``MIGRATIONS`` say how it is read: the layout is the same, so it is version 1; the quarantine
record's ``schema`` key is its old spelling); a version this deployctl does not know, or a field of
another shape, is refused with an error naming the file and the field, never guessed. The host side
(``deploy/remote/*.py``) runs without pydantic and writes the same JSON layout;
``tests/unit/test_records.py`` ties the two (what the host helpers write validates here).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deploy.base.errors import RemoteOutputError
from deploy.config.models import CanarySpec

#: a measurement's load (what the throughput depends on besides the deployment: prompts, lengths,
#: concurrency, the dataset's name and sha256): compared only for equality
Load = dict[str, int | float | str | None]


R = TypeVar("R", bound="Record")
S = TypeVar("S", bound="Strict")


class Strict(BaseModel):
    """Strict (no coercion: "12" is not 12), no unknown field, immutable (a change: ``but(field=...)``)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)

    def but(self: S, **changes: Any) -> S:
        """This record with ``changes``, validated (``model_copy(update=)`` would not check them)."""
        return type(self).model_validate(self.model_dump(exclude_unset=True) | changes)

    def without(self: S, *names: str) -> S:
        """This record without the fields ``names`` (absent, as in a record that never had them)."""
        return type(self).model_validate(self.model_dump(exclude_unset=True, exclude=set(names)))

    def document(self) -> dict[str, Any]:
        """As JSON: the fields it was given (None included: an absent ``draft_quantization`` means "older
        record"), keys as the host writes them (``from``)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class Record(Strict):
    """A record with a schema version, read with ``validated`` / ``record_of``."""

    #: the version this deployctl writes and reads
    SCHEMA: ClassVar[int] = 1
    #: what the record is, in an error ("the deployment record")
    WHAT: ClassVar[str] = "record"
    schema_version: Literal[1] = 1

    def document(self) -> dict[str, Any]:
        """The record as the JSON document its file holds, with its version."""
        return super().document() | {"schema_version": self.SCHEMA}


# -- deployment.json and last-good.json ---------------------------------------------------------------


class DrafterUpdate(Strict):
    """``drafter_update`` of a deployment record: how its drafter got there (swap-drafter, issue 29/38/41).

    Also swap-drafter's step memory (``StepMemory.drafter_update``): a reload and why (launch writes it into
    the record it launches) or the swap and what was verified (the host's facts: history, ``--json``)."""

    how: Literal["swapped", "reloaded", "swapping", "swap-failed"]
    #: the order swap-drafter's memory has always had in the report (how, why, asked, at, sent, verified)
    why: str | None = None
    #: reload or swap, as asked
    asked: str | None = None
    at: str | None = None
    sent: bool | None = None
    #: the fingerprint before and after a swap
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    #: what was verified after a swap (weight_version, tensors, accept length, hold times)
    verified: dict[str, Any] | None = None


class NodeGroup(Strict):
    """``node_group`` of a node's deployment (deploy/fleet/nodes.py): which group deployment it is one rank of."""

    id: str
    rank: int
    nnodes: int
    hosts: list[str]
    dist_init_addr: str | None


class DeploymentRecord(Record):
    """``deployment.json``: what launch started (``DesiredDeployment.record()`` plus the PID and log)."""

    WHAT: ClassVar[str] = "deployment record"
    run: str | None = None
    argv: list[str]
    drafter_fingerprint: str | None = None
    drafter_path: str | None = None
    env_hash: str | None = None
    sglang_version: str | None = None
    draft_tokens: int | None = None
    env_file: str | None = None
    #: absent in a record written before it existed: ``recorded_draft_quantization`` reads it from the argv
    draft_quantization: str | None = None
    pid: int | None = None
    log: str | None = None
    launched_at: str | None = None
    #: the argv the server was launched with, kept across drafter swaps (the PID check compares it)
    launched_argv: list[str] | None = None
    drafter_update: DrafterUpdate | None = None
    node_group: NodeGroup | None = None


class Baseline(Strict):
    """One throughput bar of a last good record: one per dataset identity and load (issue 28).

    Its figures are kept as written (``Any``): a hand-edited bar is not trusted into the statistics
    (``record_good.rounds_of`` reads only positive finite rounds), but is not a broken record either."""

    output_tok_s: Any = None
    output_tok_s_rounds: Any = None
    dataset: str | None = None
    dataset_sha256: str | None = None
    drafter_fingerprint: str | None = None
    bench_settings: Load | None = None
    measured_at: str | None = None


class DriftNote(Strict):
    """What a last good record keeps of a night the gate judged the host's drift (issue 39)."""

    night: str
    ratio: float | None = None
    unchanged: bool | None = None
    why: str = ""


class Metrics(Strict):
    """``metrics`` of a last good record: the numbers the deployment was verified with."""

    draft_tokens: int | None = None
    accept_length: float | None = None
    #: the prompt set the accept length was measured on (only the same one compares)
    verify_settings: dict[str, Any] | None = None
    output_tok_s: Any = None
    output_tok_s_rounds: Any = None
    #: the benchmark measurement's ``settings`` (its load), under the name the record has always used
    bench_settings: Load | None = None
    dataset: str | None = None
    dataset_sha256: str | None = None
    throughput_baselines: list[Baseline] | None = None
    throughput_drift: DriftNote | None = None


class LastGood(DeploymentRecord):
    """``last-good.json``: the deployment record that passed verification, with its numbers."""

    WHAT: ClassVar[str] = "last good record"
    metrics: Metrics | None = None
    verified_at: str | None = None


# -- quarantine.json -----------------------------------------------------------------------------------


class QuarantineEntry(Strict):
    failed_at: str
    verb: str | None = None
    run: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    drafter_path: str | None = None


class QuarantineRecord(Record):
    """``quarantine.json``: drafter fingerprint -> how it failed on this host (issue 17)."""

    WHAT: ClassVar[str] = "quarantine record"
    entries: dict[str, QuarantineEntry]


class AcceptMeasurement(Strict):
    """What verify-acceptance measured (``StepMemory.verify``, its step data): the accept length over the
    built-in prompt set; record-good keeps it (and the prompt set as ``verify_settings``), the host's facts
    report it."""

    accept_length: float
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    server_avg_spec_accept_length: float | None = None
    #: the prompt set (verify_acceptance.prompt_set): only an accept length measured on the same one compares
    settings: dict[str, Any]


# -- canary.json ----------------------------------------------------------------------------------------


class CanaryMark(Record):
    """``<state_dir>/canary.json``: the replica is in a canary window (fleet/canary.py writes it when the window
    starts, with the window's figures so far every 10 intervals, and removes it at the end); ``status`` marks
    the replica while ``pid`` is the running server and ``until`` (this machine's clock) has not passed."""

    WHAT: ClassVar[str] = "canary mark"
    run: str
    #: the window's start and end, Unix time (the end: the window plus 60 s)
    since: float
    until: float
    pid: int
    #: the replicas the canary is judged against
    others: list[str]
    #: the window's figures so far (deploy/local/canary_gate.py Decision): absent before 10 intervals
    acceptance_ratio: float | None = None
    speed_ratio: float | None = None
    intervals: int | None = None
    canary_requests: float | None = None
    outcome: str | None = None


# -- the canary's window (fleet/canary.py): FleetMemory.canary, RunResult.canary, --json's fleet.canary ----


class SideFigures(Strict):
    """One side's figures over one interval (deploy/local/canary_gate.py ``Side``)."""

    accept: float | None
    requests: float
    token_s: float | None


class IntervalFigures(Strict):
    """One paired interval: seconds into the window at its end, the canary's figures and the others'."""

    at: float
    canary: SideFigures
    others: SideFigures


class ComparisonFigures(Strict):
    """One figure's comparison (canary_gate ``Comparison.to_dict``)."""

    figure: str
    pairs: int
    ratio: float | None
    low: float | None
    high: float | None
    canary_median: float | None
    others_median: float | None


class CanaryDecision(Strict):
    """The window's decision (canary_gate ``Decision.to_dict``): its outcome, cause, figures and rule."""

    outcome: str
    figure: str | None
    cause: str | None
    why: str
    intervals: int
    canary_requests: float
    others_requests: float
    elapsed_s: float
    comparisons: list[ComparisonFigures]
    tolerance: float
    alpha: float
    rule: str


class CanaryWindow(Strict):
    """The canary's window as the run keeps it and ``--json`` prints it (``fleet.canary``): which hosts
    against which, its settings, the intervals, the decision (or why none) and what was done.
    The field order is the order the keys have always been printed in (``document()``: the set ones)."""

    hosts: list[str]
    others: list[str] | None = None
    #: watching, promote, roll-back, inconclusive; not-run, interrupted, failed (no decision)
    outcome: str
    #: the run's rollout.canary, every field (given as ``CanarySpec.model_validate(spec.model_dump())``)
    settings: CanarySpec | None = None
    seconds: float | None = None
    intervals: list[IntervalFigures] | None = None
    decision: CanaryDecision | None = None
    #: the decision in one line (``Decision.line``)
    line: str | None = None
    #: why no decision (not run, a signal, the reads failed)
    why: str | None = None
    #: promoted, rolled back and quarantined, or kept the last good drafter
    action: str | None = None
    #: the HTML page written for it (deploy/render/canary_report.py), once written
    report_html: str | None = None

    @property
    def why_decided(self) -> str:
        """The decision's why, else why there was none."""
        return (self.decision.why if self.decision is not None else None) or self.why or ""


# -- step to step: the benchmark measurement and the gate's verdict -----------------------------------


class BenchMeasurement(Record):
    """What the benchmark step measured (its step data, ``StepMemory.bench``): the rounds' medians, each
    round's throughput, the dataset and the load (``settings``: record-good keeps it as ``bench_settings``)."""

    WHAT: ClassVar[str] = "benchmark measurement"
    draft_tokens: int | None = None
    successful_requests: int
    duration_s: float
    output_tokens: int
    output_tok_s: float
    accept_length: float | None = None
    request_per_s: float | None = None
    mean_e2e_ms: float | None = None
    mean_ttft_ms: float | None = None
    mean_itl_ms: float | None = None
    p99_ttft_ms: float | None = None
    p99_itl_ms: float | None = None
    output_tok_s_rounds: list[float]
    #: why a round measured nothing (dropped on its own, issue 38); absent when none failed
    failed_rounds: list[str] | None = None
    results_file: str | None = None
    dataset: str | None = None
    dataset_kind: str | None = None
    dataset_sha256: str | None = None
    dataset_uploaded: bool = False
    settings: Load | None = None
    #: the dataset file on the host (a file dataset only)
    dataset_path: str | None = None

    def data(self) -> dict[str, Any]:
        """The step's data, as before the model (no ``failed_rounds`` / ``dataset_path`` when there are none)."""
        return self.model_dump(exclude={k for k in ("failed_rounds", "dataset_path") if getattr(self, k) is None})


class ControlMeasurement(Record):
    """What same-night-control measured (issue 39, ``StepMemory.control``): the last good deployment's rounds
    tonight, before the stop, at the benchmark's load; only ever set when it measured."""

    WHAT: ClassVar[str] = "same-night control measurement"
    measured: bool = True
    output_tok_s_rounds: list[float]
    #: the load, as the benchmark measurement's ``settings`` (the gate compares only equal loads)
    settings: Load | None = None
    drafter_fingerprint: str | None = None
    measured_at: str | None = None
    results_file: str | None = None


class Comparison(Strict):
    """One comparison of rounds (deploy/local/throughput_gate.py ``Verdict.to_dict``)."""

    outcome: Literal["pass", "regression", "inconclusive"]
    ratio: float
    low: float | None
    high: float | None
    floor: float
    now_median: float
    baseline_median: float
    now_rounds: list[float]
    baseline_rounds: list[float]
    rule: str


class GateVerdict(Record):
    """The regression gate's throughput verdict (deploy/local/same_night.py ``NightVerdict.verdict()``):
    its outcome, the figures of the comparison that decided, and all three comparisons."""

    WHAT: ClassVar[str] = "gate verdict"
    outcome: Literal["pass", "regression", "inconclusive", "drift"]
    floor: float
    why: str
    unchanged: bool
    #: what the new rounds were judged against ("the last good deployment tonight" or "the stored bar")
    against: str
    rule: str
    drift_ratio: float | None
    ratio: float
    low: float | None
    high: float | None
    now_median: float
    baseline_median: float
    now_rounds: list[float]
    baseline_rounds: list[float]
    against_bar: Comparison
    against_control: Comparison | None
    control_vs_bar: Comparison | None

    def summary(self) -> dict[str, Any]:
        """What history and the one-line report keep of it (the rounds stay in the JSON report)."""
        return {k: getattr(self, k) for k in ("outcome", "ratio", "low", "high", "floor", "now_median",
                                              "baseline_median", "drift_ratio", "against")} | {
            "rounds": [len(self.now_rounds), len(self.baseline_rounds)]}


# -- reading ---------------------------------------------------------------------------------------------


def _from_schema_key(document: dict[str, Any]) -> dict[str, Any]:
    """quarantine.json as written before ``schema_version``: ``{"schema": 1, "entries": ...}``."""
    rest = {k: v for k, v in document.items() if k != "schema"}
    return rest | {"schema_version": document["schema"]} if "schema" in document else rest | {"schema_version": 1}


def _unversioned(document: dict[str, Any]) -> dict[str, Any]:
    """A record written before ``schema_version`` existed has version 1's layout."""
    return document | {"schema_version": 1}


#: how a document without ``schema_version`` is read (the records deployctl wrote before it had one)
MIGRATIONS = {DeploymentRecord: _unversioned, LastGood: _unversioned, QuarantineRecord: _from_schema_key,
              BenchMeasurement: _unversioned, ControlMeasurement: _unversioned, GateVerdict: _unversioned,
              CanaryMark: _unversioned}


def shape_problem(error: ValidationError) -> str:
    """The first problem of a validation, naming its field: ``entries.ab12.failed_at: Input should be a valid string``."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(the document)"
    return f"{where}: {first['msg']}"


class RecordShapeError(ValueError):
    """A document that is not the record: its first problem, naming the field (or the schema version)."""


def validated(model: type[R], document: Any) -> R:
    """``document`` (parsed JSON) as ``model``, migrated when it has no ``schema_version``; RecordShapeError
    naming the field otherwise (a caller that words its own error, e.g. the quarantine's, catches it)."""
    if not isinstance(document, dict):
        raise RecordShapeError(f"a JSON object expected, got {type(document).__name__}")
    if "schema_version" not in document:
        document = MIGRATIONS[model](document)
    version = document.get("schema_version")
    if version != model.SCHEMA:
        raise RecordShapeError(f"schema_version {version!r}; this deployctl reads schema_version {model.SCHEMA} "
                               "(written by a newer deployctl? upgrade this one)")
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise RecordShapeError(shape_problem(exc)) from None


def record_of(model: type[R], document: Any, where: str) -> R:
    """``document`` (parsed JSON) as ``model``; ``where`` names the file (and host) in the error:
    ``kimi-a: ~/s/last-good.json: not a last good record: metrics.draft_tokens: Input should be a valid integer``."""
    try:
        return validated(model, document)
    except RecordShapeError as exc:
        raise RemoteOutputError(f"{where}: not a {model.WHAT}: {exc}") from None
