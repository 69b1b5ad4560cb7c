"""The one typed configuration object a run passes down (also the form Prefect's UI renders)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_CACHE = Path(os.environ.get("KFORGE_CACHE", "data/cache"))
Backend = Literal["cpu", "cuda", "triton"]


class ModelSettings(BaseModel):
    """Which OpenAI-compatible model the agents talk to. The API key itself is never stored: only the
    name of the environment variable holding it."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="Model name; none means the offline reference agent")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key")
    temperature: float = Field(0.2, ge=0)
    max_tokens: int = Field(8192, ge=1)
    timeout_s: float = Field(300.0, gt=0, description="Per request")
    retries: int = Field(3, ge=0, description="Task retries on 429, 5xx, timeouts and lost connections")
    retry_delay_s: float = Field(10.0, ge=0, description="First retry delay; doubles each retry")
    reply_cache: bool = Field(True, description="Answer repeated calls from the on-disk reply cache")
    usd_per_million_input_tokens: float = Field(0.0, ge=0, description="For the cost_usd estimate")
    usd_per_million_output_tokens: float = Field(0.0, ge=0, description="For the cost_usd estimate")


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt setting in prefect.yaml or a config is an error

    suite: str = Field("data/problems/smoke", description="Directory of KernelBench-format problem files")
    backend: Backend = Field("cpu", description="Kernel backend")
    iterations: int = Field(1, ge=0, description="Refinement iterations after the single-shot attempt")
    agent: Literal["llm", "reference", "identity"] | None = Field(
        None,
        description="'llm', 'reference' (offline, no model) or 'identity' (the reference itself as the candidate,"
        " which measures the harness: speedups near 1.00); default: llm when a model is set",
    )
    llm: ModelSettings = Field(default_factory=ModelSettings, description="Model access for the agents")
    reference_backend: Backend | None = Field(
        None, description="Show the agent the working kernel from kernels_ref/<this backend>/ (cross-platform)"
    )
    performance_agent: bool = Field(False, description="After each correct kernel, ask agent G for one optimization")
    soft_check: bool = Field(
        False,
        description="Ask the model whether a correct kernel still computes the whole reference function "
        "with native kernel code only (recorded beside the outcome, never changing it)",
    )
    results_dir: str = Field("data/results", description="Where the Parquet datasets are appended")
    cache_dir: str = Field(str(DEFAULT_CACHE), description="Compiled kernels and inductor cache")
    gpus: list[int] | None = Field(
        None,
        description="GPU indices (as this process numbers them) the problems are spread over, each problem's "
        "stages on one of them; default every visible GPU (tasks/gpus.py)",
    )
    gpu_index: int = Field(
        0, ge=0, description="The GPU a problem's stages run on: set per problem from `gpus`, not by hand"
    )
    problem_deployment: str | None = Field(
        None,
        description="Run each problem as a flow run of this Prefect deployment of flows/synthesize.py "
        "(e.g. 'synthesize-problem/kforge-problem'), which any host's worker of its pool may take; "
        "results_dir must then be a path every host reaches (README: several hosts)",
    )
    size_preset: str | None = Field(None, description="Problem SIZE_PRESETS entry; default 'gpu' on GPU backends")
    base_seed: int | None = Field(None, description="Seed for check and timing inputs; default: from the run id")
    correctness_trials: int = Field(3, ge=1)
    warmup_runs: int = Field(3, ge=0)
    min_timed_runs: int = Field(10, ge=1)
    max_timed_runs: int = Field(100, ge=1)
    timing_budget_s: float = Field(1.0, gt=0, description="Stop timing after min runs once this is spent")
    torch_compile_baseline: bool = Field(True, description="Also time the reference under torch.compile")
    device_memory_fraction: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Share of the free GPU memory one problem's checks plan for, and of the whole GPU memory "
        "the problems in flight may plan for together (tasks/memory.py, tasks/slots.py)",
    )
    paired_reference: bool = Field(
        True,
        description="Time the reference eagerly beside each candidate, call for call in alternating order, and "
        "take speedup_eager from that pair: both times come from the same machine state, busy or quiet",
    )
    profile: bool = Field(
        False,
        description="Profile each correct candidate and each problem's reference (Nsight Compute where present, "
        "torch.profiler otherwise) into the profiles table: advisory numbers for the agents",
    )
    profile_format: Literal["text", "image", "both"] = Field(
        "text",
        description="How the performance agent sees a distilled profile: 'text' (a few lines), 'image' (a PNG chart "
        "of kernel time shares and speed-of-light bars, for multimodal models; needs the report extra) or 'both'",
    )
    reuse_baselines: bool = Field(
        False,
        description="Reuse each problem's baseline stage (eager and torch.compile times, the trusted echo) from "
        "an earlier run on the same host, device and toolchain, as a nightly rerun of a suite would; off: every "
        "run times its baselines again",
    )
    optimize: Literal["none", "kb", "perf-agent"] = Field(
        "none",
        description="After a problem's loop ends with a correct kernel: 'kb' runs the knowledge-base loop "
        "(state, weighted choice of techniques, one rollout each, measured gain updates the KB, tasks/optimize.py); "
        "'perf-agent' is KForge's setting: agent G reads each correct kernel's profile each iteration "
        "(performance_agent and profile on), no knowledge base",
    )
    rollouts: int = Field(2, ge=1, description="Techniques tried per knowledge-base step (breadth)")
    depth: int = Field(1, ge=0, description="Knowledge-base steps per problem, each from the best kernel so far")
    kb_dir: str | None = Field(
        None, description="Directory of the versioned knowledge base (kb-v<N>.json); default <cache_dir>/knowledge"
    )
    kb_temperature: float = Field(
        1.0, gt=0, description="Selection temperature: p ~ gain^(1/T); lower is greedier, never plain argmax"
    )
    kb_memory: bool = Field(
        True,
        description="False (an ablation): every problem starts from the seed knowledge base, and what it learns "
        "stays with that problem (a folder of its own under <cache_dir>/kb-no-memory)",
    )
    cycles_only: bool = Field(
        False, description="An ablation: the agents see times only, never a profile (profiles are still recorded)"
    )
    threads: int | None = Field(None, description="CPU threads per worker (default: all cores)")
    compile_timeout_s: float = Field(300.0, gt=0)
    run_timeout_s: float = Field(120.0, gt=0, description="Wall-time limit of a verify or timing worker")
    profile_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Wall-time limit of a profile worker under ncu (its replays are slow); past it, and for the "
        "rest of the run, torch.profiler",
    )
    memory_limit_mb: int | None = Field(
        8192,
        description="Memory limit per worker: its address space on the cpu backend; on GPU backends, where "
        "the CUDA context rules that out, the resident memory of the worker and its children (checked by "
        "the orchestrator every 0.1 s)",
    )
    allow_library_calls: bool = Field(False, description="Allow candidates to call the reference's torch ops")
    worker_pool: int | None = Field(
        None,
        ge=0,
        description="Workers started ahead of need (torch imported, CUDA ready); 0: start each on demand; "
        "default 2 on GPU backends, 1 on cpu (no spare starts or warms up while a stage is timed)",
    )
    parallel_problems: int | None = Field(
        None,
        ge=1,
        description="Problems evaluated at once (GPU stages still take the GPU one at a time); "
        "default min(8, CPU cores) on GPU backends, 1 on cpu (CPU timing must not share the cores)",
    )

    @model_validator(mode="after")
    def _resolve_agent(self) -> RunConfig:
        if self.agent is None:
            self.agent = "llm" if self.llm.model else "reference"
        if self.agent == "identity":  # the reference's own ops are the identity candidate's whole point
            self.allow_library_calls = True
        if self.optimize == "perf-agent":  # KForge's setting: agent G reads each correct kernel's profile
            self.performance_agent, self.profile = True, True
        return self

    def effective_size_preset(self) -> str | None:
        if self.size_preset:
            return None if self.size_preset == "default" else self.size_preset
        return "gpu" if self.backend in ("cuda", "triton") else None

    def effective_worker_pool(self) -> int:
        if self.worker_pool is not None:
            return self.worker_pool
        return 2 if self.backend in ("cuda", "triton") else 1

    def effective_parallel_problems(self) -> int:
        if self.parallel_problems is not None:
            return self.parallel_problems
        return min(8, os.cpu_count() or 1) if self.backend in ("cuda", "triton") else 1

    def seeds(self, purpose: str, count: int) -> list[int]:
        """Distinct seeds per purpose ('verify', 'time', 'time-spare'), never the ones a problem file uses itself."""
        offset = {"init": 0, "verify": 1_000, "time": 2_000, "time-spare": 3_000}[purpose]
        base = (self.base_seed or 0) * 10_007
        return [base + offset + 17 * i + 3 for i in range(count)]


def grid_plan(
    base: RunConfig,
    models: list[str] | None = None,
    iterations: list[int] | None = None,
    reference_backends: list[str | None] | None = None,
    performance_agent: list[bool] | None = None,
) -> tuple[list[RunConfig], list[str]]:
    """The combinations of the given axes that can run as asked, and one line per combination that
    cannot (a performance agent or a soft check without a model), saying which and why: a skipped
    combination is never run, so nothing is recorded as if it had run with a setting that was off."""
    combinations = itertools.product(
        models or [base.llm.model],
        iterations if iterations is not None else [base.iterations],
        reference_backends or [base.reference_backend],
        performance_agent or [base.performance_agent],
    )
    configs, skipped = [], []
    for model, iteration_count, reference_backend, with_analysis in combinations:
        settings = base.model_dump()
        settings["llm"]["model"] = model
        settings.update(
            iterations=iteration_count,
            reference_backend=reference_backend,
            performance_agent=with_analysis,
            agent=base.agent if base.agent != "reference" or not model else None,
        )
        config = RunConfig(**settings)
        if config.agent == "llm":
            configs.append(config)
            continue
        wanted = [name for name, on in (("performance agent", with_analysis), ("soft check", config.soft_check)) if on]
        if not wanted:
            configs.append(config)
            continue
        skipped.append(
            f"skipped model={model} iterations={iteration_count} reference_backend={reference_backend} "
            f"performance_agent={'on' if with_analysis else 'off'}: the {' and the '.join(wanted)} "
            f"need{'s' if len(wanted) == 1 else ''} a model (give --models NAME)"
        )
    return configs, skipped


def grid_configs(
    base: RunConfig,
    models: list[str] | None = None,
    iterations: list[int] | None = None,
    reference_backends: list[str | None] | None = None,
    performance_agent: list[bool] | None = None,
) -> list[RunConfig]:
    """One RunConfig per combination of the given axes (an axis left out keeps `base`'s value), in
    the order models x iterations x reference backends x performance agent; combinations that cannot
    run as asked are left out (`grid_plan` says which and why)."""
    return grid_plan(base, models, iterations, reference_backends, performance_agent)[0]
