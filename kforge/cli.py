"""The `kforge` command: run a suite, evaluate one candidate, report on recorded results."""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from kforge.kb import kb_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.add_typer(kb_app, name="kb", help="Show, diff, export and import the knowledge base (versions under the cache).")

BackendOption = Annotated[str, typer.Option(help="Kernel backend: cpu | cuda | triton.")]


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _config_or_fail(**settings: Any):
    """A RunConfig, or a one-line error naming the bad setting."""
    from pydantic import ValidationError

    from kforge.config import RunConfig

    try:
        return RunConfig(**settings)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        _fail(problems)


def _check_results_dir(results_dir: str) -> None:
    """Fail in one line, before anything is evaluated, when results cannot be written under `results_dir`
    (nothing is created: a missing folder is checked through the nearest folder that exists)."""
    import tempfile

    path = Path(results_dir).expanduser().absolute()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    try:
        if existing is None or not existing.is_dir():
            raise NotADirectoryError(f"{existing} is not a folder")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        _fail(f"results directory {results_dir} cannot be written ({reason}): give --results a writable folder")


def _check_llm_extra() -> None:
    """A model needs the `llm` extra; without it, one line saying how to install it (not a traceback)."""
    import importlib

    try:
        for module in ("openai", "langchain_openai"):  # openai first: the one a user would recognise
            importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or "openai"
        _fail(f"a model needs the llm extra ({missing} is not installed): pip install -e '.[llm]'")


def _prepare_prefect(cache_dir: str) -> None:
    """Quiet, local Prefect defaults: an ephemeral server unless PREFECT_API_URL names one.
    Call before importing Prefect, which reads its settings at import."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(Path(cache_dir).resolve() / "prefect-results"))
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _read_config_file(path: Path) -> dict[str, Any]:
    """Settings from a YAML or JSON file with RunConfig's keys (the `config` of prefect.yaml)."""
    import yaml

    try:
        settings = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        _fail(f"{path}: cannot read the config file ({type(exc).__name__}: {str(exc).splitlines()[0]})")
    if not isinstance(settings, dict):
        _fail(f"{path}: a config file holds a mapping of RunConfig settings (suite, backend, llm: {{model: ...}})")
    return settings


def _merged_settings(file_settings: dict[str, Any], run_settings: dict[str, Any], llm_settings: dict[str, Any]):
    """Command-line (and environment) values over the config file's, over the defaults."""
    merged = {**file_settings, **{k: v for k, v in run_settings.items() if v is not None}}
    llm = {**(file_settings.get("llm") or {}), **{k: v for k, v in llm_settings.items() if v is not None}}
    if llm:
        merged["llm"] = llm
    return merged


def _announce_agent(config) -> None:
    """Say plainly which agent writes the kernels, and check a model endpoint before the run starts."""
    if config.agent == "identity":
        typer.echo("Identity run: each problem's reference is its own candidate (a speedup near 1.00 is right).")
        return
    if config.agent == "reference":
        why = (
            f" ({config.llm.api_key_env} is set, but no --model was given)"
            if os.environ.get(config.llm.api_key_env)
            else ""
        )
        typer.secho(
            f"No model in use{why}: the offline 'reference' agent proposes the kernels in "
            f"kernels_ref/{config.backend}/ (drafts first, then the working kernel).",
            fg=typer.colors.YELLOW,
        )
        if config.performance_agent:
            typer.secho("The performance agent needs a model: it is off for this run.", fg=typer.colors.YELLOW)
        return
    if not config.llm.model:
        _fail("--agent llm needs a model: give --model NAME (and --base-url URL for a local endpoint)")
    _check_llm_extra()
    from tasks.llm import ModelCallError, check_endpoint, endpoint_name

    try:
        check_endpoint(config.llm)
    except ModelCallError as exc:
        _fail(str(exc))
    typer.echo(
        f"Model {config.llm.model} at {endpoint_name(config.llm)}; reply cache "
        f"{'on' if config.llm.reply_cache else 'off'}; performance agent {'on' if config.performance_agent else 'off'}"
        + (f"; reference kernels from {config.reference_backend}" if config.reference_backend else "")
    )


Opt = typer.Option


@app.command()
def run(
    config_file: Annotated[
        Path | None, Opt("--config", envvar="KFORGE_CONFIG", help="YAML/JSON file of run settings (RunConfig keys).")
    ] = None,
    suite: Annotated[
        str | None, Opt(help="Folder of KernelBench-format problems (default: data/problems/smoke).")
    ] = None,
    backend: Annotated[str | None, Opt(help="Kernel backend: cpu | cuda | triton (default: cpu).")] = None,
    iterations: Annotated[
        int | None, Opt(help="Refinement iterations after the single-shot attempt (default: 1).")
    ] = None,
    agent: Annotated[
        str | None,
        Opt(help="llm | reference (offline) | identity (reference as candidate) (default: llm when a model is set)."),
    ] = None,
    results: Annotated[
        str | None, Opt(help="Results directory; Parquet is appended here (default: data/results).")
    ] = None,
    cache: Annotated[
        str | None, Opt(help="Cache directory: kernels, stage results, replies (default: data/cache).")
    ] = None,
    size_preset: Annotated[str | None, Opt(help="Problem size preset (default: gpu on GPU backends).")] = None,
    seed: Annotated[int | None, Opt(help="Seed for check and timing inputs (default: from the run id).")] = None,
    trials: Annotated[
        int | None, Opt(help="Correctness trials per candidate, each with fresh inputs (default: 3).")
    ] = None,
    threads: Annotated[int | None, Opt(help="CPU threads per worker (default: all cores).")] = None,
    parallel_problems: Annotated[
        int | None, Opt(help="Problems evaluated at once (default: min(8, CPU cores) on GPU backends, 1 on cpu).")
    ] = None,
    torch_compile: Annotated[
        bool | None, Opt(help="Also time the reference under torch.compile (default: on).")
    ] = None,
    reuse_baselines: Annotated[
        bool | None, Opt(help="Reuse baselines timed by an earlier run on this host and toolchain (default: off).")
    ] = None,
    profile: Annotated[
        bool | None, Opt(help="Profile correct kernels and references into the profiles table (default: off).")
    ] = None,
    profile_format: Annotated[
        str | None, Opt(help="Profile for the performance agent: text | image | both (default: text).")
    ] = None,
    optimize: Annotated[
        str | None,
        Opt(
            help="After a correct kernel: none | kb (knowledge-base rollouts) | perf-agent (KForge's: agent G "
            "reads the profile; --performance-agent --profile) (default: none)."
        ),
    ] = None,
    rollouts: Annotated[int | None, Opt(help="Techniques tried per knowledge-base step (default: 2).")] = None,
    depth: Annotated[int | None, Opt(help="Knowledge-base steps per problem (default: 1).")] = None,
    knowledge_base: Annotated[
        str | None, Opt(help="Folder of the versioned knowledge base (default: <cache>/knowledge).")
    ] = None,
    kb_temperature: Annotated[float | None, Opt(help="Technique selection temperature, > 0 (default: 1.0).")] = None,
    memory: Annotated[
        bool | None,
        Opt(help="Carry what one problem learns to the next; --no-memory: each starts from the seed (default: on)."),
    ] = None,
    cycles_only: Annotated[
        bool | None, Opt("--cycles-only", help="The agents see times only, no profile (an ablation; default: off).")
    ] = None,
    model: Annotated[str | None, Opt(envvar="KFORGE_MODEL", help="Model name; without one, no model is used.")] = None,
    base_url: Annotated[
        str | None, Opt(envvar="KFORGE_BASE_URL", help="OpenAI-compatible endpoint (default: OpenAI).")
    ] = None,
    api_key_env: Annotated[
        str | None, Opt(envvar="KFORGE_API_KEY_ENV", help="Variable holding the API key (default: OPENAI_API_KEY).")
    ] = None,
    temperature: Annotated[float | None, Opt(help="Sampling temperature (default: 0.2).")] = None,
    max_tokens: Annotated[int | None, Opt(help="Most tokens per reply (default: 8192).")] = None,
    llm_timeout: Annotated[float | None, Opt(help="Seconds per model request (default: 300).")] = None,
    llm_retries: Annotated[int | None, Opt(help="Retries on 429/5xx/timeouts, with backoff (default: 3).")] = None,
    reply_cache: Annotated[
        bool | None, Opt(help="Answer repeated model calls from the reply cache (default: on).")
    ] = None,
    reference_backend: Annotated[
        str | None, Opt(help="Show the agent the working kernel from kernels_ref/<backend>/ (default: none).")
    ] = None,
    performance_agent: Annotated[
        bool | None, Opt(help="Ask the performance agent for one recommendation per correct kernel (default: off).")
    ] = None,
    soft_check: Annotated[
        bool | None,
        Opt(help="Ask the model to review each correct kernel: whole function, native code (default: off)."),
    ] = None,
) -> None:
    """Run every problem of a suite through generate -> compile -> verify -> time and record the attempts.

    Settings come from the command line, then KFORGE_* variables, then --config, then the defaults."""
    file_settings = _read_config_file(config_file) if config_file else {}
    settings = _merged_settings(
        file_settings,
        {
            "suite": str(Path(suite).expanduser()) if suite else None,
            "backend": backend,
            "iterations": iterations,
            "agent": agent,
            "results_dir": results,
            "cache_dir": cache,
            "size_preset": size_preset,
            "base_seed": seed,
            "correctness_trials": trials,
            "threads": threads,
            "parallel_problems": parallel_problems,
            "torch_compile_baseline": torch_compile,
            "reuse_baselines": reuse_baselines,
            "profile": profile,
            "profile_format": profile_format,
            "optimize": optimize,
            "rollouts": rollouts,
            "depth": depth,
            "kb_dir": str(Path(knowledge_base).expanduser()) if knowledge_base else None,
            "kb_temperature": kb_temperature,
            "kb_memory": memory,
            "cycles_only": cycles_only,
            "reference_backend": reference_backend,
            "performance_agent": performance_agent,
            "soft_check": soft_check,
        },
        {
            "model": model,
            "base_url": base_url,
            "api_key_env": api_key_env,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "timeout_s": llm_timeout,
            "retries": llm_retries,
            "reply_cache": reply_cache,
        },
    )
    config = _config_or_fail(**settings)
    if not Path(config.suite).is_dir():
        _fail(f"problem suite {config.suite} is not a directory (give --suite a folder of KernelBench .py files)")
    _check_results_dir(config.results_dir)
    _announce_agent(config)
    if config.agent == "reference" and config.performance_agent:  # recorded as it ran: off
        config = config.model_copy(update={"performance_agent": False})
    _prepare_prefect(config.cache_dir)
    from flows.suite import run_suite
    from kforge.progress import reporting

    try:
        with reporting():
            summary = run_suite(config)
    except Exception as exc:  # the flow already recorded every finished attempt
        _fail(f"{type(exc).__name__}: {exc}")
    _print_run(summary)


def _split(values: str | None, convert=str, name: str = "") -> list[Any] | None:
    if values is None:
        return None
    try:
        return [convert(v.strip()) for v in values.split(",") if v.strip()]
    except ValueError:
        _fail(f"--{name} {values!r}: give a comma-separated list")


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise ValueError(value)
    return value == "on"


@app.command()
def grid(
    config_file: Annotated[
        Path | None, Opt("--config", envvar="KFORGE_CONFIG", help="YAML/JSON file of base settings (RunConfig keys).")
    ] = None,
    suite: Annotated[
        str | None, Opt(help="Folder of KernelBench-format problems (default: data/problems/smoke).")
    ] = None,
    backend: Annotated[str | None, Opt(help="Kernel backend: cpu | cuda | triton (default: cpu).")] = None,
    results: Annotated[str | None, Opt(help="Results directory (default: data/results).")] = None,
    cache: Annotated[str | None, Opt(help="Cache directory (default: data/cache).")] = None,
    parallel_problems: Annotated[
        int | None, Opt(help="Problems evaluated at once (default: min(8, CPU cores) on GPU backends, 1 on cpu).")
    ] = None,
    base_url: Annotated[str | None, Opt(envvar="KFORGE_BASE_URL", help="OpenAI-compatible endpoint.")] = None,
    api_key_env: Annotated[str | None, Opt(envvar="KFORGE_API_KEY_ENV", help="Variable holding the key.")] = None,
    models: Annotated[str | None, Opt(help="Comma-separated model names.")] = None,
    iterations: Annotated[str | None, Opt(help="Comma-separated refinement counts, e.g. 0,5.")] = None,
    reference_backends: Annotated[
        str | None, Opt(help="Comma-separated, 'none' for no reference, e.g. none,cpu.")
    ] = None,
    performance_agent: Annotated[str | None, Opt(help="off,on (or one of them).")] = None,
) -> None:
    """Run the suite once per combination of the given axes (the papers' ablation grid)."""
    file_settings = _read_config_file(config_file) if config_file else {}
    settings = _merged_settings(
        file_settings,
        {
            "suite": suite,
            "backend": backend,
            "results_dir": results,
            "cache_dir": cache,
            "parallel_problems": parallel_problems,
        },
        {"base_url": base_url, "api_key_env": api_key_env},
    )
    base = _config_or_fail(**settings)
    _check_results_dir(base.results_dir)
    from kforge.config import grid_plan

    axes = {
        "models": _split(models, str, "models"),
        "iterations": _split(iterations, int, "iterations"),
        "reference_backends": [
            None if b == "none" else b for b in _split(reference_backends, str, "reference-backends") or []
        ]
        or None,
        "performance_agent": _split(performance_agent, _on_off, "performance-agent"),
    }
    try:
        combinations, skipped = grid_plan(base, **axes)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        _fail(str(exc).splitlines()[0] + ": " + " ".join(str(exc).splitlines()[1:3]))
    for reason in skipped:  # never run, so never recorded as if the agent had been on
        typer.secho(reason, fg=typer.colors.YELLOW)
    if not combinations:
        _fail(f"none of the {len(skipped)} combinations can run as asked (see the lines above)")
    typer.echo(f"{len(combinations)} combinations of {base.suite}" + (f" ({len(skipped)} skipped)" if skipped else ""))
    for model_settings in {c.llm.model: c for c in combinations}.values():
        _announce_agent(model_settings)
    _prepare_prefect(base.cache_dir)
    from flows.grid import run_grid

    summaries = run_grid(base, **axes)
    for summary in summaries:
        if "failed" in summary:
            typer.echo(f"failed: {summary['failed']}")
        else:
            typer.echo(f"run {summary['run_id']}: outcomes {summary['outcomes']}")
    by = "model,max_iterations,reference_backend,performance_agent"
    typer.echo(f"compare: kforge report --results {base.results_dir} --by {by}")
    if any("failed" in summary for summary in summaries):
        raise typer.Exit(1)


@app.command()
def retry(
    run_id: Annotated[str, typer.Argument(help="The run id (Prefect flow run id) of a failed `kforge run`.")],
    cache: Annotated[str, typer.Option(help="The cache directory the run used (its stage results live there).")] = (
        "data/cache"
    ),
) -> None:
    """Run a failed run again under the same run id: finished stages replay from cache, only what failed runs."""
    from uuid import UUID

    from kforge.config import RunConfig

    try:
        flow_run_id = UUID(run_id)
    except ValueError:
        _fail(f"{run_id!r} is not a run id (a UUID, as printed by `kforge run`)")
    _prepare_prefect(cache)  # before Prefect is imported: it reads its settings at import
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            config = RunConfig(**client.read_flow_run(flow_run_id).parameters["config"])
    except (ObjectNotFound, KeyError):
        _fail(
            f"no kforge run {run_id} in the Prefect database at {os.environ.get('PREFECT_API_URL') or 'PREFECT_HOME'}"
        )
    _prepare_prefect(config.cache_dir)
    from prefect.flow_engine import run_flow
    from prefect.states import Scheduled

    from flows.suite import run_suite

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Scheduled(), force=True)
        flow_run = client.read_flow_run(flow_run_id)
    state = run_flow(run_suite, flow_run=flow_run, parameters={"config": config}, return_type="state")
    if not state.is_completed():
        _fail(state.message or "the retried run failed")
    _print_run(state.result())


def _print_run(summary: dict[str, Any]) -> None:
    import pandas as pd

    from kforge import results

    attempts = results.load("attempts", summary["results_dir"])
    attempts = attempts[attempts["run_id"] == summary["run_id"]]
    typer.echo(f"\nrun {summary['run_id']}: {summary['problems']} problems, outcomes {summary['outcomes']}")
    for rejected in summary["rejected_files"]:
        typer.echo(f"skipped {rejected}")
    for problem_id in summary.get("broken_problems", []):
        typer.echo(f"skipped {problem_id}: its reference Model fails (see the run log)")
    if not attempts.empty:
        columns = list(results.SUMMARY_COLUMNS)
        with pd.option_context(
            "display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3g}".format
        ):
            typer.echo(attempts.sort_values(["problem_id", "iteration"])[columns].to_string(index=False))
    if not attempts.empty and attempts["tokens_in"].fillna(0).sum() > 0:
        tokens_in = int(attempts["tokens_in"].fillna(0).sum() + attempts["analysis_tokens_in"].fillna(0).sum())
        tokens_out = int(attempts["tokens_out"].fillna(0).sum() + attempts["analysis_tokens_out"].fillna(0).sum())
        typer.echo(
            f"model tokens: {tokens_in} in, {tokens_out} out; {int(attempts['reply_cached'].fillna(False).sum())} "
            f"replies from the cache; estimated cost ${attempts['cost_usd'].fillna(0).sum():.4f}"
        )
    typer.echo(f"\nresults: {summary['results_dir']}/attempts  (kforge report --results {summary['results_dir']})")


@app.command("eval")
def eval_one(
    problem: Annotated[Path, typer.Argument(help="KernelBench-format problem file.")],
    candidate: Annotated[Path, typer.Argument(help="Candidate file defining ModelNew.")],
    backend: BackendOption = "cpu",
    cache: Annotated[str, typer.Option(help="Cache directory for compiled kernels.")] = "data/cache",
    size_preset: Annotated[
        str | None, typer.Option(help="Problem size preset (default 'gpu' on GPU backends).")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed for the models' parameters (every call's inputs come from os.urandom).")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of lines.")] = False,
    timeout: Annotated[
        float | None,
        typer.Option(help="Wall-clock limit of each stage's worker, in seconds (default: compile 300, others 120)."),
    ] = None,
) -> None:
    """One candidate through the harness (compile, verify, time, baselines), no LLM and no Prefect."""
    from tasks.compile import compile_candidate
    from tasks.measure import speedups, time_baselines, time_candidate
    from tasks.problems import parse_problem
    from tasks.verify import verify_candidate

    try:
        parsed = parse_problem(problem)
    except (OSError, ValueError) as exc:
        _fail(f"{getattr(exc, 'filename', None) or problem}: {exc}")
    candidate_source = _read_candidate(candidate)
    limits = {"compile_timeout_s": timeout, "run_timeout_s": timeout} if timeout is not None else {}
    config = _config_or_fail(backend=backend, cache_dir=cache, size_preset=size_preset, base_seed=seed, **limits)
    report: dict[str, Any] = {"problem": str(problem), "candidate": str(candidate)}
    for stage, evaluate in (
        ("compile", compile_candidate),
        ("verify", verify_candidate),
        ("baseline", lambda parsed, _source, config: time_baselines(parsed, config)),
        ("time", lambda parsed, source, config: time_candidate(parsed, source, config, report["baseline"])),
    ):
        typer.echo(f"{stage} ...", err=True)  # the stage as it goes (stderr: --json output stays one object)
        report[stage] = evaluate(parsed, candidate_source, config)
        if report[stage]["outcome"] != "correct":
            report["outcome"] = report[stage]["outcome"]
            break
    else:
        report["outcome"] = "correct"
        report.update(speedups(report["time"], report["baseline"]))
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        _print_eval(report)
    raise typer.Exit(0 if report["outcome"] == "correct" else 1)


def _read_candidate(candidate: Path) -> str:
    """The candidate's source, or a one-line error naming the candidate file (not the problem)."""
    try:
        data = candidate.read_bytes()
    except OSError as exc:
        _fail(f"{candidate}: cannot read the candidate ({exc.strerror or exc})")
    if b"\0" in data:
        _fail(f"{candidate}: the candidate is a binary file (NUL bytes), not Python source defining ModelNew")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(
            f"{candidate}: the candidate is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8 Python source"
        )


def _print_eval(report: dict[str, Any]) -> None:
    typer.echo(f"outcome: {report['outcome']}")
    for stage in ("compile", "verify", "time", "baseline"):
        if stage in report:
            details = {k: v for k, v in report[stage].items() if k != "error_excerpt"}
            typer.echo(f"  {stage}: {details}")
            if report[stage].get("error_excerpt"):
                typer.echo("    " + report[stage]["error_excerpt"].strip().replace("\n", "\n    "))
    if report["outcome"] == "correct":
        typer.echo(
            f"  speedup vs eager {report['speedup_eager']:.3g}x, vs torch.compile "
            f"{report['speedup_compile'] or float('nan'):.3g}x"
        )


def _parse_since(since: str) -> datetime:
    units = {"d": "days", "h": "hours", "w": "weeks"}
    if len(since) < 2 or since[-1] not in units or not since[:-1].isdigit():
        _fail(f"--since {since!r}: use a number and a unit, e.g. 7d, 12h, 2w")
    return datetime.now(timezone.utc) - timedelta(**{units[since[-1]]: int(since[:-1])})


@app.command()
def report(
    results: Annotated[str, typer.Option(help="Results directory to read.")] = "data/results",
    since: Annotated[str | None, typer.Option(help="Only attempts newer than this, e.g. 7d or 12h.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Only this run ('latest' for the newest).")] = None,
    baseline: Annotated[str, typer.Option(help="Speedup baseline: eager | compile | best.")] = "eager",
    by: Annotated[str, typer.Option(help="Comma-separated grouping columns.")] = "level,backend",
    html: Annotated[
        Path | None,
        typer.Option(help="Also write one self-contained HTML page of the run (--run-id, default the latest) to PATH."),
    ] = None,
) -> None:
    """fast_p at p = 0, 1, 1.5, 2 and geometric-mean speedup per group, from the Parquet results."""
    import pandas as pd

    from kforge import results as results_lib

    if baseline not in results_lib.BASELINES:
        _fail(f"--baseline {baseline!r}: use one of {', '.join(results_lib.BASELINES)}")
    if html is not None:
        _write_html(results, html, run_id, baseline)
    attempts = results_lib.load("attempts", results)
    if attempts.empty:
        _fail(f"no attempts recorded under {results}/attempts (run `kforge run` first)")
    group_by = [column.strip() for column in by.split(",") if column.strip()]
    if unknown := [column for column in group_by if column not in attempts.columns]:
        _fail(f"--by {','.join(unknown)}: no such column; valid columns: {', '.join(attempts.columns)}")
    if since:
        attempts = attempts[attempts["created_at"] >= _parse_since(since)]
    if run_id == "latest":
        run_id = attempts.sort_values("created_at")["run_id"].iloc[-1]
    if run_id:
        attempts = attempts[attempts["run_id"] == run_id]
    if attempts.empty:
        _fail("no attempts match the filters")
    table = results_lib.report_table(attempts, by=tuple(group_by), baseline=baseline)
    typer.echo(f"{len(attempts)} attempts, {attempts['run_id'].nunique()} run(s), speedup vs {baseline}")
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        typer.echo(table.to_string(index=False))


def _write_html(results: str, path: Path, run_id: str | None, baseline: str) -> None:
    from kforge.htmlreport import ReportError, write_html_report

    try:
        page = write_html_report(results, path, run_id=run_id, baseline=baseline)
    except ReportError as exc:
        _fail(str(exc))
    typer.echo(
        f"wrote {page.page_path} (run {page.run_id}; {len(page.png_paths)} plots and "
        f"{len(page.kernel_paths)} kernels beside it)"
    )


@app.command()
def compare(
    run_a: Annotated[
        str | None, typer.Argument(help="The earlier run id (alone: the run to check, against its previous run).")
    ] = None,
    run_b: Annotated[str | None, typer.Argument(help="The later run id, checked against RUN_A.")] = None,
    results: Annotated[str, typer.Option(help="Results directory to read.")] = "data/results",
) -> None:
    """Regressions of one run against another (default: the latest finished run against the previous one of
    the same suite, backend and model). Exit status 0: none, 1: regressions, 2: bad input."""
    from kforge.compare import CompareError, compare_runs, comparison_text

    if run_a is not None and run_b is None:
        run_a, run_b = None, run_a
    try:
        comparison = compare_runs(results, run_a=run_a, run_b=run_b)
    except CompareError as exc:
        _fail(str(exc))
    typer.echo(comparison_text(comparison))
    raise typer.Exit(comparison.exit_code)


@app.command()
def wheelhouse(
    dest: Annotated[Path, typer.Argument(metavar="DIR", help="Folder for the wheels (created if missing).")],
    python: Annotated[
        str, typer.Option(help="The GPU host's Python version, e.g. 3.12 (default: this one's).")
    ] = f"{sys.version_info[0]}.{sys.version_info[1]}",
    platform: Annotated[
        str, typer.Option(help="The GPU host's platform tag; older manylinux tags are added.")
    ] = "manylinux_2_28_x86_64",
    find_links: Annotated[
        list[Path] | None, typer.Option("--find-links", help="Take wheels only from this folder (no index).")
    ] = None,
    host_has: Annotated[
        Path | None,
        typer.Option(
            "--host-has",
            help="The GPU host's `pip list --format freeze`: its packages in versions every requirement accepts "
            "are left out (a smaller folder to carry).",
        ),
    ] = None,
) -> None:
    """Download the wheels kforge needs, except torch, for a GPU host without internet
    (there: bash scripts/install.sh --wheelhouse DIR)."""
    from kforge.wheelhouse import WheelhouseError, build_wheelhouse, host_packages, leave_out, target_environment

    try:
        installed = host_packages(host_has.read_text()) if host_has else {}
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"--host-has {host_has}: cannot read it ({exc}); give the output of `pip list --format freeze` there")
    try:
        built = build_wheelhouse(dest, python_version=python, platform=platform, find_links=find_links or ())
    except WheelhouseError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    for note in built.notes:
        typer.secho(note, fg=typer.colors.YELLOW, err=True)
    if installed:
        top = [line for line in built.requirements_file.read_text().splitlines() if line and not line.startswith("#")]
        environment = target_environment(built.python_version, built.platforms[0])
        dropped = leave_out(built.dest, installed, keep=["kforge"], top=top, environment=environment)
        built.wheels = sorted(built.dest.glob("*.whl"))
        size_mb = sum(w.stat().st_size for w in built.dest.glob("*.whl")) / 1e6
        typer.echo(f"left out {len(dropped)} wheels the host has; {size_mb:.0f} MB to carry")
    typer.echo(built.summary())


@app.command("compact")
def compact_command(
    results: Annotated[str, typer.Option(help="Results directory.")] = "data/results",
    table: Annotated[str, typer.Option(help="attempts | runs | profiles | kb_updates | all.")] = "all",
    date: Annotated[str | None, typer.Option(help="Only the partition of this run date (YYYY-MM-DD).")] = None,
    before: Annotated[
        str | None, typer.Option(help="Every partition older than this date (YYYY-MM-DD; default: today, UTC).")
    ] = None,
) -> None:
    """Rewrite each date partition's small Parquet files into one; a load during it sees the same rows."""
    from datetime import date as calendar_date

    from kforge.compact import CompactError, compact

    if date and before:
        _fail("give --date or --before, not both")
    days: dict[str, Any] = {"date": None, "before": None if date else datetime.now(timezone.utc).date()}
    for name, value in (("date", date), ("before", before)):
        if value:
            try:
                days[name] = calendar_date.fromisoformat(value)
            except ValueError:
                _fail(f"--{name} {value!r}: give a date as YYYY-MM-DD")
    try:
        done = compact(results, None if table == "all" else [table], day=days["date"], before=days["before"])
    except (CompactError, ValueError) as exc:
        _fail(str(exc))
    changed = [c for c in done if c.changed]
    for c in changed:
        typer.echo(f"{c.table} date={c.date}: {c.files_before} files -> {c.files_after} ({c.rows} rows)")
    typer.echo(f"{len(changed)} partition(s) compacted, {len(done) - len(changed)} already compact")


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # Prefect's flow engine turns SIGTERM into an exception, then sends it again to the handler it
    # found. Python's default one ends the process at once, skipping atexit, where Prefect stops its
    # ephemeral server: that server was left running. SystemExit runs atexit.
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    app(prog_name="kforge")


if __name__ == "__main__":
    sys.exit(main())
