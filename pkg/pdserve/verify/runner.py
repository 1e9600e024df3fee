"""Running the verifier's checks: select them, time each one, retry the failing ones until a deadline.

Which checks a deployment has: pdserve.verify.hosts; what each reads: pdserve.verify.registry; what they
read the host through: pdserve.verify.context.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from pdserve.probes.observations import Unavailable
from pdserve.verify.context import Context, Options
from pdserve.verify.registry import BEFORE_AND_AFTER_E2E, Check
from pdserve.verify.result import CheckResult, Status, skipped

__all__ = ["BEFORE_AND_AFTER_E2E", "Context", "Options", "SelectionError", "run", "run_one", "select"]


class SelectionError(ValueError):
    pass


def _matches(check_id: str, token: str) -> bool:
    return check_id == token or check_id.startswith(token)


def select(ids: list[str], only: list[str], skip: list[str]) -> dict[str, str | None]:
    """check id -> None (run it) or the reason it is not run. Unknown tokens are a usage error."""
    for token in [*only, *skip]:
        if not any(_matches(i, token) for i in ids):
            raise SelectionError(f"{token!r} matches no check; known ids: {', '.join(ids)}")
    plan: dict[str, str | None] = {}
    for i in ids:
        if only and not any(_matches(i, t) for t in only):
            plan[i] = f"not selected by --only {','.join(only)}"
        elif any(_matches(i, t) for t in skip):
            plan[i] = f"excluded by --skip {','.join(t for t in skip if _matches(i, t))}"
        else:
            plan[i] = None
    return plan


def run_one(check_id: str, check: Check, ctx: Context) -> tuple[CheckResult, str | None]:
    """(result, verifier error or None). Unavailable -> skip; any other exception is our bug (exit 3)."""
    start = time.monotonic()
    error = None
    try:
        result = check(ctx)
    except Unavailable as exc:
        result = skipped(check_id, exc.reason)
    except Exception as exc:  # noqa: BLE001 - a crash in one check must not hide the others' results
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        error = f"{check_id}: {type(exc).__name__}: {exc} (at {frame.filename}:{frame.lineno})"
        result = CheckResult(check_id, Status.FAIL, f"the verifier crashed: {type(exc).__name__}: {exc}", "",
                             "a bug in pdserve verify: report it with this message and the --json output")
    return result.timed(int((time.monotonic() - start) * 1000)), error


def run(ctx: Context, plan: dict[str, str | None], checks: dict[str, Check], wait: float = 0.0,
        interval: float = 2.0, clock=time.monotonic, sleep=time.sleep,
        on_retry: Callable[[list[str], float], None] | None = None) -> tuple[list[CheckResult], list[str]]:
    """Run the selected checks; with `wait`, re-run failing ones until they pass or the deadline passes."""
    deadline = clock() + wait
    results: dict[str, CheckResult] = {}
    errors: dict[str, str] = {}
    attempts: dict[str, int] = {}
    pending = [i for i, reason in plan.items() if reason is None]
    if ctx is not None:
        ctx.wants_metrics_baseline = any(i in BEFORE_AND_AFTER_E2E for i in pending)
    for i, reason in plan.items():
        if reason is not None:
            results[i] = skipped(i, reason)
    while pending:
        for i in pending:
            result, error = run_one(i, checks[i], ctx)
            attempts[i] = attempts.get(i, 0) + 1
            results[i] = result.timed(result.duration_ms, attempts[i])
            if error:
                errors[i] = error
            else:
                errors.pop(i, None)
        pending = [i for i in pending if results[i].status is Status.FAIL and i not in errors]
        remaining = deadline - clock()
        if not pending or remaining <= 0:
            break
        if on_retry:
            on_retry(pending, remaining)
        sleep(min(interval, remaining))
    return [results[i] for i in plan], list(errors.values())
