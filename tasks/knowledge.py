"""The persistent knowledge base (KernelBlaster): performance states, the optimizations that help them, and
what applying those optimizations actually gained.

A knowledge base is a JSON document (data/knowledge/seed.json is version 1): `kb_version`, and `states`, each
with rules over distilled metric names and optimizations with an expected gain (a speedup factor) and the
record of measured gains. It is never edited in place: every update returns a new KnowledgeBase with
kb_version + 1, `save_version` writes it as `<kb_dir>/kb-v<N>.json` (refusing to overwrite one), and the
update's KbUpdate rows go to the `kb_updates` table. Old versions and the seed stay readable as they were.

Steps of the loop that live here: `extract_state` (rules first; `state_prompt`/`parse_state_reply` when the
rules are unsure), `select` (weighted random choice, never argmax), `numeric_update` (no model) and
`textual_update` (a model explains the gap between expected and measured and rewrites the description).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kforge.config import DEFAULT_CACHE
from tasks.prompts import render_messages

SEED_PATH = Path(__file__).resolve().parents[1] / "data" / "knowledge" / "seed.json"
DEFAULT_KB_DIR = DEFAULT_CACHE / "knowledge"
VERSION_FILE = re.compile(r"^kb-v(\d+)\.json$")

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
}

# A technique never tried is scored with at least this expected gain, so a new idea with a modest (or no)
# estimate from its author is still drawn now and then; once tried, its measured record speaks for it.
UNTRIED_PRIOR_GAIN = 1.25
# The expected gain in the document counts as this many pseudo-measurements on top of the real attempts.
PRIOR_WEIGHT = 2.0


class KbFormatError(ValueError):
    """A knowledge-base document that is not valid; the message is one line naming the file."""


@dataclass(frozen=True)
class Rule:
    metric: str
    op: str
    value: float

    def holds(self, metrics: dict[str, float]) -> bool:
        """False when the metric is missing: an unmeasured metric never confirms a state."""
        return self.metric in metrics and OPERATORS[self.op](float(metrics[self.metric]), self.value)


@dataclass(frozen=True)
class Optimization:
    technique: str
    description: str
    expected_gain: float | None  # speedup factor; None: no estimate yet (the selector uses the prior)
    attempts: int = 0
    successes: int = 0  # rollouts that produced a correct kernel faster than its parent
    mean_gain: float | None = None  # over all attempts, a failed rollout counting as 1.0 (nothing gained)
    gain_spread: float | None = None  # standard deviation of the same gains
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class State:
    name: str
    primary_bottleneck: str
    secondary: tuple[str, ...]
    rules: tuple[Rule, ...]
    optimizations: tuple[Optimization, ...]

    def optimization(self, technique: str) -> Optimization | None:
        return next((o for o in self.optimizations if o.technique == technique), None)


@dataclass(frozen=True)
class KnowledgeBase:
    kb_version: int
    states: tuple[State, ...]
    source: str = ""

    def state(self, name: str) -> State | None:
        return next((s for s in self.states if s.name == name), None)


@dataclass(frozen=True)
class Rollout:
    """One applied technique, from the replay buffer. measured_gain: parent time / child time, or None
    when the rollout did not give a correct kernel."""

    attempt_id: str
    state: str
    technique: str
    measured_gain: float | None
    gpu: str
    notes: str = ""  # what the rollout's profile or error said, for the gap analysis


@dataclass(frozen=True)
class KbUpdate:
    """One row of the `kb_updates` table."""

    kb_version: int
    state: str
    technique: str
    expected_gain: float | None
    measured_gain: float | None
    rationale: str
    attempt_ids: tuple[str, ...] = field(default_factory=tuple)
    tokens: int | None = None  # the step's model tokens, on its accounting row (technique "")

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "attempt_ids": list(self.attempt_ids)}


@dataclass(frozen=True)
class StateReply:
    state: str
    primary_bottleneck: str
    reason: str


# ---------------------------------------------------------------- the document


def _fail(origin: str, what: str) -> KbFormatError:
    return KbFormatError(f"{origin}: {what}")


def _number(value: Any, origin: str, where: str, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(origin, f"{where} must be a number, got {value!r}")
    return float(value)


def _count(value: Any, origin: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(origin, f"{where} must be a non-negative integer, got {value!r}")
    return value


def _text(value: Any, origin: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(origin, f"{where} must be a non-empty string, got {value!r}")
    return value


def _optimization(entry: Any, origin: str, where: str) -> Optimization:
    if not isinstance(entry, dict):
        raise _fail(origin, f"{where} must be an object")
    gain = _number(entry.get("expected_gain"), origin, f"{where}.expected_gain", allow_none=True)
    if gain is not None and gain <= 0:
        raise _fail(origin, f"{where}.expected_gain must be positive, got {gain:g}")
    attempts = _count(entry.get("attempts", 0), origin, f"{where}.attempts")
    successes = _count(entry.get("successes", 0), origin, f"{where}.successes")
    if successes > attempts:
        raise _fail(origin, f"{where} has {successes} successes in {attempts} attempts")
    gpus = entry.get("gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
        raise _fail(origin, f"{where}.gpus must be a list of strings")
    return Optimization(
        technique=_text(entry.get("technique"), origin, f"{where}.technique"),
        description=_text(entry.get("description"), origin, f"{where}.description"),
        expected_gain=gain,
        attempts=attempts,
        successes=successes,
        mean_gain=_number(entry.get("mean_gain"), origin, f"{where}.mean_gain", allow_none=True),
        gain_spread=_number(entry.get("gain_spread"), origin, f"{where}.gain_spread", allow_none=True),
        gpus=tuple(gpus),
    )


def _state(entry: Any, origin: str, where: str) -> State:
    if not isinstance(entry, dict):
        raise _fail(origin, f"{where} must be an object")
    name = _text(entry.get("name"), origin, f"{where}.name")
    if not isinstance(entry.get("rules", []), list):
        raise _fail(origin, f"state {name!r}: rules must be a list")
    rules = []
    for i, rule in enumerate(entry.get("rules", [])):
        if not isinstance(rule, dict) or rule.get("op") not in OPERATORS:
            raise _fail(origin, f"state {name!r} rule {i} needs metric, op (one of {' '.join(OPERATORS)}) and value")
        metric = _text(rule.get("metric"), origin, f"state {name!r} rule {i} metric")
        rules.append(Rule(metric, rule["op"], _number(rule.get("value"), origin, f"state {name!r} rule {i} value")))
    optimizations = entry.get("optimizations")
    if not isinstance(optimizations, list) or not optimizations:
        raise _fail(origin, f"state {name!r} has no optimizations (a list of at least one technique)")
    parsed = tuple(_optimization(o, origin, f"state {name!r} optimization {i}") for i, o in enumerate(optimizations))
    if len({o.technique for o in parsed}) != len(parsed):
        raise _fail(origin, f"state {name!r} names a technique twice")
    secondary = entry.get("secondary", [])
    if not isinstance(secondary, list) or not all(isinstance(s, str) for s in secondary):
        raise _fail(origin, f"state {name!r}: secondary must be a list of strings")
    return State(
        name=name,
        primary_bottleneck=_text(entry.get("primary_bottleneck"), origin, f"state {name!r} primary_bottleneck"),
        secondary=tuple(secondary),
        rules=tuple(rules),
        optimizations=parsed,
    )


def parse_kb(document: Any, origin: str = "knowledge base") -> KnowledgeBase:
    """A KnowledgeBase from a parsed JSON document; raises KbFormatError (one line, naming `origin`)."""
    if not isinstance(document, dict):
        raise _fail(origin, "the document must be a JSON object with kb_version and states")
    version = document.get("kb_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _fail(origin, f"kb_version must be a positive integer, got {version!r}")
    states = document.get("states")
    if not isinstance(states, list) or not states:
        raise _fail(origin, "states must be a non-empty list")
    parsed = tuple(_state(s, origin, f"state {i}") for i, s in enumerate(states))
    if len({s.name for s in parsed}) != len(parsed):
        raise _fail(origin, "a state name appears twice")
    source = document.get("source", "")
    return KnowledgeBase(version, parsed, source if isinstance(source, str) else "")


def to_document(kb: KnowledgeBase) -> dict[str, Any]:
    """The JSON document of `kb` (lists, not tuples), kb_version first."""
    document = json.loads(json.dumps(asdict(kb)))
    return {"kb_version": document.pop("kb_version"), **document}


def load(path: str | Path) -> KnowledgeBase:
    """The knowledge base in `path`; raises KbFormatError naming the file for anything unreadable."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise _fail(str(path), f"cannot be read ({exc.strerror or exc})") from exc
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise _fail(str(path), f"not JSON ({exc})") from exc
    return parse_kb(document, str(path))


def version_path(kb_dir: str | Path, version: int) -> Path:
    return Path(kb_dir) / f"kb-v{version}.json"


def versions(kb_dir: str | Path) -> list[int]:
    """The versions saved in `kb_dir`, ascending."""
    kb_dir = Path(kb_dir)
    if not kb_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in kb_dir.iterdir() if (m := VERSION_FILE.match(p.name)))


def load_latest(kb_dir: str | Path = DEFAULT_KB_DIR, seed: str | Path = SEED_PATH) -> KnowledgeBase:
    """The newest version in `kb_dir`, or the seed when none has been saved."""
    saved = versions(kb_dir)
    return load(version_path(kb_dir, saved[-1]) if saved else seed)


def save_version(kb: KnowledgeBase, kb_dir: str | Path = DEFAULT_KB_DIR) -> Path:
    """Write `kb` as `<kb_dir>/kb-v<kb_version>.json` and return the path. A version is written once:
    if that file exists (another run saved the same version first) FileExistsError is raised."""
    kb_dir = Path(kb_dir)
    kb_dir.mkdir(parents=True, exist_ok=True)
    final = version_path(kb_dir, kb.kb_version)
    fd, partial = tempfile.mkstemp(dir=kb_dir, prefix=".", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(to_document(kb), handle, indent=2)
            handle.write("\n")
        os.link(partial, final)  # atomic, and fails instead of replacing an existing version
    finally:
        os.unlink(partial)
    return final


# ---------------------------------------------------------------- state extraction


def extract_state(metrics: dict[str, float], kb: KnowledgeBase) -> tuple[str | None, float]:
    """(state name, confidence) from the states' rules; a state matches when all its rules hold.

    One match: confidence 1.0. Several: the most specific (most rules) wins with confidence
    n_best / (n_best + n_second). No match: (None, 0.0); a tie for most specific: (None, 0.5). For None,
    ask the model (`state_prompt`)."""
    matched = sorted((len(s.rules), s.name) for s in kb.states if s.rules and all(r.holds(metrics) for r in s.rules))
    if not matched:
        return None, 0.0
    if len(matched) == 1:
        return matched[0][1], 1.0
    (second, _), (best, name) = matched[-2], matched[-1]
    if best == second:
        return None, 0.5
    return name, best / (best + second)


def state_prompt(metrics: dict[str, float], kb: KnowledgeBase) -> list[dict[str, str]]:
    """Chat messages asking the model to name the state of a kernel with these distilled metrics."""
    return render_messages("kb_state", metrics=dict(sorted(metrics.items())), states=kb.states)


def _json_objects(text: str) -> list[Any]:
    fenced = re.findall(r"```(?:json)?\s*\n(.*?)```", text, flags=re.DOTALL)
    start, end = text.find("{"), text.rfind("}")
    parsed = []
    for candidate in [*fenced, text[start : end + 1] if 0 <= start < end else ""]:
        try:
            parsed.append(json.loads(candidate))
        except ValueError:
            continue
    return parsed


def parse_state_reply(text: str) -> tuple[StateReply | None, str | None]:
    """The model's {state, primary_bottleneck, reason} object, or (None, why not)."""
    keys = ("state", "primary_bottleneck", "reason")
    for parsed in _json_objects(text):
        if isinstance(parsed, dict) and all(isinstance(parsed.get(k), str) and parsed[k].strip() for k in keys):
            return StateReply(*(parsed[k].strip() for k in keys)), None
    return None, f"the state reply has no JSON object with {', '.join(keys)}"


def discovered_state(reply: StateReply, template: State) -> State:
    """A state the model named that the knowledge base lacks: its name (lowercase, hyphenated), the
    model's bottleneck and reason, no rules (the rules never claim it; the model recognises it again
    from its description, and people can add rules with `kforge kb import`), and `template`'s techniques
    (the fallback state's) as untried entries, with no measured record, for the selector to start from."""
    name = re.sub(r"[^a-z0-9]+", "-", reply.state.lower()).strip("-")[:48] or "model-named-state"
    return State(
        name=name,
        primary_bottleneck=reply.primary_bottleneck,
        secondary=(f"named by the model: {reply.reason}",),
        rules=(),
        optimizations=tuple(Optimization(o.technique, o.description, o.expected_gain) for o in template.optimizations),
    )


def with_state(kb: KnowledgeBase, state: State) -> KnowledgeBase:
    """`kb` with `state` added (the same version: the step's update saves the next one)."""
    if kb.state(state.name) is not None:
        return kb
    return replace(kb, states=(*kb.states, state))


# ---------------------------------------------------------------- selection


def selection_weights(state: State, temperature: float) -> dict[str, float]:
    """Probability of drawing each technique first: softmax(log g / temperature), where g is the expected
    gain, or max(expected gain, UNTRIED_PRIOR_GAIN) for a technique with no attempts (UNTRIED_PRIOR_GAIN
    when it has no estimate). Equivalently p ∝ g^(1/temperature)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive (never plain argmax), got {temperature}")
    scores = {}
    for o in state.optimizations:
        gain = o.expected_gain if o.expected_gain is not None else UNTRIED_PRIOR_GAIN
        if o.attempts == 0:
            gain = max(gain, UNTRIED_PRIOR_GAIN)
        scores[o.technique] = math.log(gain) / temperature
    top = max(scores.values())
    exps = {t: math.exp(s - top) for t, s in scores.items()}
    total = sum(exps.values())
    return {t: e / total for t, e in exps.items()}


def select(kb: KnowledgeBase, state: str, k: int, temperature: float, rng: random.Random) -> list[str]:
    """k distinct techniques of `state`, drawn one after another without replacement with the weights of
    `selection_weights` (renormalised over those left). Fewer when the state has fewer than k."""
    found = kb.state(state)
    if found is None:
        raise KeyError(f"state {state!r} is not in knowledge base version {kb.kb_version}")
    weights = selection_weights(found, temperature)
    chosen: list[str] = []
    while weights and len(chosen) < k:
        techniques = list(weights)
        pick = rng.choices(techniques, weights=[weights[t] for t in techniques])[0]
        chosen.append(pick)
        del weights[pick]
    return chosen


# ---------------------------------------------------------------- updates


def _groups(kb: KnowledgeBase, replay: Sequence[Rollout]) -> dict[tuple[str, str], list[Rollout]]:
    groups: dict[tuple[str, str], list[Rollout]] = {}
    for rollout in replay:
        if rollout.measured_gain is not None and not rollout.measured_gain > 0:
            raise ValueError(
                f"rollout {rollout.attempt_id}: measured gain must be positive, got {rollout.measured_gain}"
            )
        state = kb.state(rollout.state)
        if state is None or state.optimization(rollout.technique) is None:
            raise ValueError(f"rollout {rollout.attempt_id}: {rollout.state}/{rollout.technique} is not in the KB")
        groups.setdefault((rollout.state, rollout.technique), []).append(rollout)
    return groups


def _replace_optimization(kb: KnowledgeBase, state: str, new: Optimization) -> KnowledgeBase:
    states = tuple(
        replace(s, optimizations=tuple(new if o.technique == new.technique else o for o in s.optimizations))
        if s.name == state
        else s
        for s in kb.states
    )
    return replace(kb, states=states)


def updated_optimization(old: Optimization, rollouts: Sequence[Rollout]) -> Optimization:
    """The numeric update of one entry. Gains g_i (a failed rollout counts as 1.0: the kernel stays its parent).

    expected gain: a Bayesian mean in log space, the old value weighing PRIOR_WEIGHT + old attempts:
        log g_new = ((PRIOR_WEIGHT + attempts) * log g_old + sum(log g_i)) / (PRIOR_WEIGHT + attempts + n)
    (an entry without an estimate starts from UNTRIED_PRIOR_GAIN). mean_gain and gain_spread (standard
    deviation) are merged with the old ones by the pooled-variance formula; successes count g_i > 1."""
    gains = [r.measured_gain if r.measured_gain is not None else 1.0 for r in rollouts]
    n, weight = len(gains), PRIOR_WEIGHT + old.attempts
    prior = old.expected_gain if old.expected_gain is not None else UNTRIED_PRIOR_GAIN
    log_gain = (weight * math.log(prior) + sum(math.log(g) for g in gains)) / (weight + n)
    batch_mean = sum(gains) / n
    batch_m2 = sum((g - batch_mean) ** 2 for g in gains)
    if old.attempts and old.mean_gain is not None:
        old_m2 = (old.gain_spread or 0.0) ** 2 * old.attempts
        delta = batch_mean - old.mean_gain
        total = old.attempts + n
        mean = old.mean_gain + delta * n / total
        m2 = old_m2 + batch_m2 + delta**2 * old.attempts * n / total
    else:
        total, mean, m2 = n, batch_mean, batch_m2
    return replace(
        old,
        expected_gain=math.exp(log_gain),
        attempts=old.attempts + n,
        successes=old.successes + sum(g > 1.0 for g in gains),
        mean_gain=mean,
        gain_spread=math.sqrt(m2 / total),
        gpus=tuple(sorted({*old.gpus, *(r.gpu for r in rollouts if r.gpu)})),
    )


def numeric_update(kb: KnowledgeBase, replay: Sequence[Rollout]) -> tuple[KnowledgeBase, list[KbUpdate]]:
    """A new version (kb_version + 1) with every (state, technique) in the replay buffer updated by
    `updated_optimization`, and one KbUpdate per entry. An empty buffer returns `kb` itself and no rows."""
    if not replay:
        return kb, []
    new_kb, updates = replace(kb, kb_version=kb.kb_version + 1), []
    for (state, technique), rollouts in _groups(kb, replay).items():
        old = new_kb.state(state).optimization(technique)
        new = updated_optimization(old, rollouts)
        new_kb = _replace_optimization(new_kb, state, new)
        measured = [r.measured_gain for r in rollouts if r.measured_gain is not None]
        rationale = (
            f"numeric update: expected gain {_gain(old.expected_gain)} -> {new.expected_gain:.3g} from "
            f"{len(rollouts)} rollout(s), {len(rollouts) - len(measured)} failed (prior weight "
            f"{PRIOR_WEIGHT:g} + {old.attempts} earlier attempts)"
        )
        updates.append(
            KbUpdate(
                new_kb.kb_version,
                state,
                technique,
                new.expected_gain,
                _mean(measured),
                rationale,
                tuple(r.attempt_id for r in rollouts),
            )
        )
    return new_kb, updates


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _gain(value: float | None) -> str:
    return "none" if value is None else f"{value:.3g}"


def gap_prompt(state: State, optimization: Optimization, rollouts: Sequence[Rollout]) -> list[dict[str, str]]:
    """Messages for the gap analysis of one entry against its rollouts."""
    return render_messages("kb_gap", state=state, optimization=optimization, rollouts=list(rollouts))


def parse_gap_reply(text: str) -> tuple[tuple[str, str] | None, str | None]:
    """(explanation, rewritten description) from the gap-analysis reply, or (None, why not)."""
    for parsed in _json_objects(text):
        if isinstance(parsed, dict) and all(
            isinstance(parsed.get(k), str) and parsed[k].strip() for k in ("explanation", "description")
        ):
            return (parsed["explanation"].strip(), parsed["description"].strip()), None
    return None, "the gap-analysis reply has no JSON object with explanation and description"


def textual_update(
    kb: KnowledgeBase, replay: Sequence[Rollout], llm_call: Callable[[list[dict[str, str]]], str]
) -> tuple[KnowledgeBase, list[KbUpdate], list[str]]:
    """For each (state, technique) in the buffer, ask `llm_call(messages) -> reply text` why measured and
    expected gain differ, and rewrite the entry's description from the answer (the textual gradient).

    Returns (new KB, one KbUpdate per rewrite with the explanation as rationale, one line per entry left
    unchanged saying why). The new KB has kb_version + 1 when anything was rewritten, else it is `kb`."""
    rewrites: list[tuple[str, Optimization, str, list[Rollout]]] = []
    skipped: list[str] = []
    for (state_name, technique), rollouts in _groups(kb, replay).items():
        state = kb.state(state_name)
        old = state.optimization(technique)
        answer, why_not = parse_gap_reply(llm_call(gap_prompt(state, old, rollouts)))
        if answer is None:
            skipped.append(f"{state_name}/{technique} unchanged: {why_not}")
        elif answer[1] == old.description:
            skipped.append(f"{state_name}/{technique} unchanged: the model kept the description as it was")
        else:
            rewrites.append((state_name, replace(old, description=answer[1]), answer[0], rollouts))
    if not rewrites:
        return kb, [], skipped
    new_kb = replace(kb, kb_version=kb.kb_version + 1)
    updates = []
    for state_name, new, explanation, rollouts in rewrites:
        new_kb = _replace_optimization(new_kb, state_name, new)
        measured = _mean([r.measured_gain for r in rollouts if r.measured_gain is not None])
        ids = tuple(r.attempt_id for r in rollouts)
        updates.append(
            KbUpdate(new_kb.kb_version, state_name, new.technique, new.expected_gain, measured, explanation, ids)
        )
    return new_kb, updates, skipped


# ---------------------------------------------------------------- for people


def diff(kb_a: KnowledgeBase, kb_b: KnowledgeBase) -> str:
    """What changed from `kb_a` to `kb_b`, one line per change ('no differences' when none)."""
    lines = [f"kb_version {kb_a.kb_version} -> {kb_b.kb_version}"] if kb_a.kb_version != kb_b.kb_version else []
    names_a, names_b = [s.name for s in kb_a.states], [s.name for s in kb_b.states]
    lines += [f"- state {name}" for name in names_a if name not in names_b]
    for state_b in kb_b.states:
        state_a = kb_a.state(state_b.name)
        if state_a is None:
            lines.append(f"+ state {state_b.name} ({len(state_b.optimizations)} techniques)")
            lines += [
                f"+ {state_b.name}/{o.technique} expected {_gain(o.expected_gain)}" for o in state_b.optimizations
            ]
            continue
        if state_a.rules != state_b.rules:
            lines.append(f"~ state {state_b.name}: recognition rules changed")
        lines += [
            f"- {state_a.name}/{o.technique}" for o in state_a.optimizations if not state_b.optimization(o.technique)
        ]
        for new in state_b.optimizations:
            where, old = f"{state_b.name}/{new.technique}", state_a.optimization(new.technique)
            if old is None:
                lines.append(f"+ {where} expected {_gain(new.expected_gain)}")
                continue
            if old.expected_gain != new.expected_gain:
                lines.append(f"~ {where} expected gain {_gain(old.expected_gain)} -> {_gain(new.expected_gain)}")
            if (old.attempts, old.successes) != (new.attempts, new.successes):
                lines.append(
                    f"~ {where} attempts {old.attempts} -> {new.attempts}, successes {old.successes} -> {new.successes}"
                )
            if old.gpus != new.gpus:
                lines.append(f"~ {where} gpus {', '.join(old.gpus) or '-'} -> {', '.join(new.gpus) or '-'}")
            if old.description != new.description:
                lines += [
                    f"~ {where} description rewritten:",
                    f"    old: {old.description}",
                    f"    new: {new.description}",
                ]
    return "\n".join(lines) if lines else "no differences"
