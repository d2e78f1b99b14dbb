"""benchmark: ``python3 -m sglang.bench_serving`` against the server, on the host.

The prompts are a dataset (deploy/local/datasets.py): by default deployctl's built-in set, else the
ShareGPT JSON or ``custom`` JSONL file of the ``dataset`` setting (``bench/nightly --dataset``),
sent once per sha256 over SFTP into ``<state_dir>/datasets/<sha256>.json`` and read by SGLang
0.5.23's ``--dataset-name sharegpt|custom --dataset-path FILE`` (local: no Hugging Face download).
``--sharegpt-output-len`` fixes the output length and bench_serving's sglang backend sends
``ignore_eos`` by default, so runs with different draft-token counts generate the same number of
tokens. ``random-ids`` (fixed lengths, ``--random-range-ratio 1``) only when asked: acceptance on
random ids says little (sglang#25359). The result block is parsed strictly; each run also appends
its JSON line to the state dir; the step's data names the dataset and its sha256.

``rounds``: bench_serving runs that many times in a row; the figures are the rounds' medians and
``output_tok_s_rounds`` keeps each round's throughput, so nightly's gate (deploy/local/throughput_gate.py)
can tell a slowdown from one noisy run. A failure here (bench_serving exits non-zero, prints no
result block, loses requests, times out) is the benchmark harness's: ``BenchmarkHarnessFailed``,
never the checkpoint's (deploy/steps/failure_cause.py), unless the server died meanwhile.
"""

from __future__ import annotations

import statistics

from pydantic import Field

from deploy.local import datasets
from deploy.local.throughput_gate import rounds_needed, usable_rounds
from deploy.base.errors import BenchmarkHarnessFailed, DeployError, ExitCode
from deploy.facts.bench import parse_bench_result
from deploy.facts.helpers import helper_state_command, parse_helper_state
from deploy.facts.host_helper import api_key_env
from deploy.host.records import BenchMeasurement
from deploy.base.shell import path_join, quote, quote_path
from deploy.steps.base import Action, Command, StepContext, StepOutcome, StepSettings, Upload, UploadFile
from deploy.steps.verify_acceptance import base_url

NAME = "benchmark"


class Settings(StepSettings):
    num_prompts: int = Field(default=64, ge=1, le=100000)
    #: random-ids only: a dataset's prompts have their own lengths
    input_len: int = Field(default=1024, ge=1, le=1_000_000)
    output_len: int = Field(default=512, ge=4, le=1_000_000)
    max_concurrency: int = Field(default=8, ge=1, le=4096)
    #: ``builtin``, ``random-ids`` or a ShareGPT .json / custom .jsonl file (relative: to the config file)
    dataset: str = Field(default=datasets.BUILTIN, min_length=1, max_length=4096)
    #: bench_serving runs in a row: the regression gate needs several to tell a slowdown from noise
    rounds: int = Field(default=1, ge=1, le=50)


def dataset(ctx: StepContext) -> datasets.Dataset:
    # the CLI resolved a relative path against the config file and validated it (exit 3) already
    return datasets.resolve(ctx.settings.dataset)


def results_path(ctx: StepContext) -> str:
    # same-night-control's rounds (the last good deployment, before the stop) go to a file of their own
    kind = getattr(ctx.settings, "results_kind", "bench")
    return path_join(ctx.paths.root, "bench", f"{kind}-{ctx.launch_stamp}-t{ctx.draft_tokens}.jsonl")


def load(ctx: StepContext, ds: datasets.Dataset) -> dict:
    """What the throughput depends on besides the deployment: the regression gate compares only equal loads."""
    s = ctx.settings
    load = {"num_prompts": s.num_prompts, "output_len": s.output_len, "max_concurrency": s.max_concurrency}
    if not ds.is_file:
        load["input_len"] = s.input_len
    return load | ds.identity()


def command(ctx: StepContext, ds: datasets.Dataset | None = None) -> str:
    s = ctx.settings
    ds = ds or dataset(ctx)
    argv = [quote(a) for a in (ctx.run.sglang_python, "-m", "sglang.bench_serving", "--backend", "sglang",
                               "--base-url", base_url(ctx))]
    if ds.is_file:
        # quote_path: the state dir may start with ~ (expanded by the host's shell)
        argv += ["--dataset-name", ds.kind, "--dataset-path", quote_path(ds.remote_path(ctx.paths.root)),
                 "--num-prompts", str(s.num_prompts), "--sharegpt-output-len", str(s.output_len)]
    else:
        argv += ["--dataset-name", "random-ids", "--num-prompts", str(s.num_prompts),
                 "--random-input-len", str(s.input_len), "--random-output-len", str(s.output_len),
                 "--random-range-ratio", "1.0"]
    argv += ["--max-concurrency", str(s.max_concurrency), "--flush-cache", "--disable-tqdm"]
    out = results_path(ctx)
    # a server launched with --api-key refuses /generate without it (401): bench_serving reads it from
    # OPENAI_API_KEY, which the host's helper fills in from the deployment record (never this line)
    key = api_key_env(ctx.host.python, ctx.paths.helper("host_ops.py"), ctx.paths.deployment)
    return f"mkdir -p -m 700 -- {quote_path(out.rsplit('/', 1)[0])} && {key} " + " ".join(argv) + \
        f" --output-file {quote_path(out)}"


def check_action(ctx: StepContext, ds: datasets.Dataset) -> Command:
    return Command(description=f"read the sha256 of the dataset on the host ({ds.name}, sha256 {ds.sha256})",
                   command=helper_state_command(ctx.host.python, [ds.remote_path(ctx.paths.root)]), timeout_s=120)


def upload_action(ctx: StepContext, ds: datasets.Dataset) -> Upload:
    remote = ds.remote_path(ctx.paths.root)
    return Upload(description=f"upload the dataset {ds.name} ({len(ds.content)} bytes, {len(ds.prompts)} prompts)",
                  when="it is not on the host yet with this sha256 (once per content)",
                  directory=remote.rsplit("/", 1)[0],
                  files=(UploadFile(remote=remote, content=ds.content, mode=0o600),))


def action(ctx: StepContext, ds: datasets.Dataset | None = None, number: int = 1) -> Command:
    """Round ``number`` of ``rounds`` (each the same bench_serving command, one after the other)."""
    s = ctx.settings
    ds = ds or dataset(ctx)
    if ds.is_file:
        what = f"dataset {ds.name} (sha256 {ds.sha256[:12] if ds.sha256 else '-'}), {s.output_len} out"
    else:
        what = f"random ids, {s.input_len} in / {s.output_len} out"
    rounds = f" (round {number} of {s.rounds}, one after the other)" if s.rounds > 1 else ""
    return Command(description=f"bench_serving: {s.num_prompts} prompts, {what}, concurrency {s.max_concurrency}"
                               f"{rounds}",
                   command=command(ctx, ds), timeout_s=ctx.timeout(3600))


def plan(ctx: StepContext) -> list[Action]:
    ds = dataset(ctx)
    rounds: list[Action] = [action(ctx, ds, n) for n in range(1, ctx.settings.rounds + 1)]
    if not ds.is_file:
        return rounds
    return [check_action(ctx, ds), upload_action(ctx, ds), *rounds]


def ensure_dataset(ctx: StepContext, ds: datasets.Dataset) -> bool:
    """Upload the dataset unless the host has it with this sha256; True when it was sent."""
    result = ctx.execute(check_action(ctx, ds))
    name = ds.remote_path(ctx.paths.root).rsplit("/", 1)[1]
    state = parse_helper_state(result.exit_code, result.stdout, result.stderr, ctx.host.python, [name], ctx.host.name)
    if state.files.get(name) == ds.sha256:
        return False
    ctx.execute_upload(upload_action(ctx, ds))
    return True


def one_round(ctx: StepContext, ds: datasets.Dataset, number: int):
    """One bench_serving run, parsed; any failure is the harness's (BenchmarkHarnessFailed)."""
    where = f" (round {number} of {ctx.settings.rounds})" if ctx.settings.rounds > 1 else ""
    result = ctx.execute(action(ctx, ds, number))
    if result.exit_code != 0:
        tail = (result.stderr.strip() or result.stdout.strip())[-600:]
        raise BenchmarkHarnessFailed(f"{ctx.host.name}: bench_serving failed{where} (exit {result.exit_code}): {tail}")
    try:
        bench = parse_bench_result(result.stdout, source=ctx.host.name)
    except DeployError as exc:
        raise BenchmarkHarnessFailed(f"{exc}{where}", exit_code=exc.exit_code) from None
    # bench_serving sends at most as many prompts as the file has usable records
    expected = min(ctx.settings.num_prompts, len(ds.prompts)) if ds.is_file else ctx.settings.num_prompts
    if bench.successful_requests != expected:
        raise BenchmarkHarnessFailed(f"{ctx.host.name}: only {bench.successful_requests} of {expected} benchmark "
                                     f"requests succeeded{where}", exit_code=ExitCode.REMOTE_OUTPUT)
    return bench


def medians(results) -> dict:
    """Each figure's median over the rounds (a figure some round lacks: over the rounds that have it)."""
    figures: dict = {}
    for key, value in results[0].to_dict().items():
        values = [r.to_dict()[key] for r in results if r.to_dict()[key] is not None]
        if not values:
            figures[key] = value
        elif isinstance(value, int) and not isinstance(value, bool):
            figures[key] = int(statistics.median_low(values))
        else:
            figures[key] = statistics.median(values)
    return figures


def run(ctx: StepContext) -> StepOutcome:
    ds = dataset(ctx)
    uploaded = ensure_dataset(ctx, ds) if ds.is_file else False
    results = []
    for number in range(1, ctx.settings.rounds + 1):
        if number > 1:
            ctx.progress(f"round {number} of {ctx.settings.rounds}")
        results.append(one_round(ctx, ds, number))
    # a round that produced no output is that round's harness failure: dropped on its own, never
    # taking the other rounds with it; too few left is the harness's failure (issue 38)
    _, failed = usable_rounds([r.output_tok_s if r.output_tokens > 0 else 0 for r in results])
    results = [r for r in results if r.output_tok_s > 0 and r.output_tokens > 0]
    if len(results) < rounds_needed(ctx.settings.rounds):
        raise BenchmarkHarnessFailed(f"{ctx.host.name}: {len(results)} of {ctx.settings.rounds} benchmark round(s) "
                                     f"measured a throughput ({'; '.join(failed[:8])}); at least "
                                     f"{rounds_needed(ctx.settings.rounds)} are needed")
    # the measurement as one typed record (deploy/host/records.py): record-good and the host's facts read it
    measured = BenchMeasurement.model_validate(
        {"draft_tokens": ctx.draft_tokens, **medians(results), "output_tok_s_rounds": [r.output_tok_s for r in results],
         "failed_rounds": failed or None, "results_file": results_path(ctx), **ds.identity(),
         "dataset_uploaded": uploaded, "settings": load(ctx, ds),
         "dataset_path": ds.remote_path(ctx.paths.root) if ds.is_file else None})
    ctx.memory.bench = measured
    accept = f", accept length {measured.accept_length:.2f}" if measured.accept_length is not None else ""
    spread = (f" (median of {len(results)} rounds, {min(measured.output_tok_s_rounds):.1f}-"
              f"{max(measured.output_tok_s_rounds):.1f})") if len(results) > 1 else ""
    return StepOutcome("ok", f"{measured.output_tok_s:.1f} output tok/s{spread}{accept} (T={ctx.draft_tokens}, "
                             f"dataset {ds.name})", measured.data())
