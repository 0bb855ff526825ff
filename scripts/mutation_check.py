"""Mutation check: do the tests notice when the code that decides what a client gets is subtly wrong?

Applies each mutant of scripts/mutants.py to a scratch copy of the repository (the working tree is never
touched), runs the fast tests that guard it, and reports whether they caught it:

    python scripts/mutation_check.py                      # every mutant (docs/testing.md has the time it takes)
    python scripts/mutation_check.py --only text-stop-last-occurrence sampler-gumbel-sign
    python scripts/mutation_check.py --list

A mutant is *killed* when its tests fail, error or hang past --timeout; it *survives* when they pass. Mutants
listed as equivalent are expected to survive. The run fails (exit 1) if any other mutant survives, if an
"equivalent" one is killed (then it was not equivalent), or if a mutant's text is no longer in the source (the
code moved on: update scripts/mutants.py). Before the mutants, the same tests run once unmutated and must pass.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `scripts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.mutants import MUTANTS, Mutant  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 600
# Stop at the first failure (a killed mutant needs no more), quietly, and leave no cache behind.
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider"]
FAILURE_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Outcome:
    mutant: str
    status: str  # "killed" | "survived" | "timeout" (killed) | "error" (the test selection itself is broken)
    expected: str  # "killed", or "survived" for an equivalent mutant
    killed_by: str | None
    seconds: float

    @property
    def as_expected(self) -> bool:
        caught = self.status in ("killed", "timeout")
        return self.status != "error" and caught == (self.expected == "killed")


def stale(mutants: Sequence[Mutant], root: Path = REPO_ROOT) -> list[str]:
    """Mutants whose `before` text is not found exactly once in their file (or that change nothing)."""
    problems = []
    for mutant in mutants:
        path = root / mutant.path
        count = path.read_text().count(mutant.before) if path.is_file() else 0
        if count != 1 or mutant.before == mutant.after:
            problems.append(f"{mutant.id}: {mutant.path} holds its text {count} times (needs exactly once)")
    return problems


def scratch_copy(root: Path, dest: Path) -> None:
    """The files git would see (tracked, and untracked ones that are not ignored): no .venv, no caches."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listing.decode().split("\0")):
        source = root / name
        if source.is_file():  # a deleted but still tracked file is skipped
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)  # a copy, never a link: mutating it must not reach the original


def scratch_environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The copy's packages come first on sys.path (ahead of the editable install of the working tree), and no
    # bytecode is written: a mutant and its restored original can have the same size and mtime second, and a
    # stale .pyc would then run the wrong code.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(copy), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_come_from(copy: Path) -> None:
    probe = "import api, engine, schemas, scripts, service; print(*(m.__file__ for m in (api, engine, schemas)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=copy, env=scratch_environment(copy), capture_output=True, text=True
    )
    if out.returncode != 0 or not all(Path(p).resolve().is_relative_to(copy.resolve()) for p in out.stdout.split()):
        raise SystemExit(f"the scratch copy's packages are not the ones imported:\n{out.stdout}{out.stderr}")


def run_pytest(copy: Path, tests: Sequence[str], timeout_s: float) -> tuple[int | None, str]:
    """(exit code or None on timeout, output). The tests run in their own process group, stopped whole on timeout."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests],
        cwd=copy,
        env=scratch_environment(copy),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output


def run_mutant(copy: Path, mutant: Mutant, timeout_s: float) -> Outcome:
    path = copy / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.before, mutant.after, 1))
    started = time.monotonic()
    try:
        code, output = run_pytest(copy, mutant.tests, timeout_s)
    finally:
        path.write_text(original)
    failure = FAILURE_LINE.search(output)
    if code is None:
        status = "timeout"
    elif code == 0:
        status = "survived"
    elif code in (1, 2):  # tests failed; or collection failed (the mutant broke an import)
        status = "killed"
    else:  # 3-5: pytest's internal error, usage error, no tests collected: the selection is wrong, not the code
        status = "error"
        print(output[-3000:], file=sys.stderr)
    return Outcome(
        mutant=mutant.id,
        status=status,
        expected="survived" if mutant.equivalent else "killed",
        killed_by=failure.group(1) if failure and status == "killed" else None,
        seconds=round(time.monotonic() - started, 1),
    )


def check(mutants: Sequence[Mutant], timeout_s: float = DEFAULT_TIMEOUT_S, baseline: bool = True) -> list[Outcome]:
    """Run `mutants` in a scratch copy of the repository and return their outcomes, printing one line each."""
    problems = stale(mutants)
    if problems:
        raise SystemExit("stale mutants (update scripts/mutants.py):\n  " + "\n  ".join(problems))
    with tempfile.TemporaryDirectory(prefix="dllm-mutants-") as scratch:
        copy = Path(scratch)
        scratch_copy(REPO_ROOT, copy)
        check_imports_come_from(copy)
        if baseline:
            selection = list(dict.fromkeys(test for m in mutants for test in m.tests))
            code, output = run_pytest(copy, selection, timeout_s * 2)
            if code != 0:
                print(output[-6000:], file=sys.stderr)
                raise SystemExit("the selected tests fail without any mutant: fix them first")
            print(f"baseline: the {len(selection)} test selections pass unmutated", flush=True)
        outcomes = []
        for index, mutant in enumerate(mutants, 1):
            outcome = run_mutant(copy, mutant, timeout_s)
            outcomes.append(outcome)
            note = "" if outcome.as_expected else "   <-- UNEXPECTED"
            by = f" by {outcome.killed_by}" if outcome.killed_by else ""
            equivalent = " (equivalent)" if mutant.equivalent else ""
            line = f"[{index}/{len(mutants)}] {mutant.id}{equivalent}: {outcome.status}{by} ({outcome.seconds:.0f} s)"
            print(line + note, flush=True)
    return outcomes


def summary(mutants: Sequence[Mutant], outcomes: Sequence[Outcome]) -> str:
    equivalent = {m.id for m in mutants if m.equivalent}
    judged = [o for o in outcomes if o.mutant not in equivalent]
    killed = sum(o.status in ("killed", "timeout") for o in judged)
    lines = [f"killed {killed} of {len(judged)} mutants; {len(outcomes) - len(judged)} listed as equivalent"]
    for outcome in outcomes:
        if not outcome.as_expected:
            lines.append(f"  UNEXPECTED {outcome.mutant}: {outcome.status} (expected {outcome.expected})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and the tests that guard them")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per mutant (a hang kills)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the selected tests")
    parser.add_argument("--json", type=Path, help="also write the outcomes to this file")
    args = parser.parse_args(argv)

    mutants = list(MUTANTS)
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            parser.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id}  [{m.path}]  {m.breaks}\n    tests: {' '.join(m.tests)}")
            if m.equivalent:
                print(f"    equivalent: {m.equivalent}")
        return 0

    started = time.monotonic()
    outcomes = check(mutants, args.timeout, baseline=not args.no_baseline)
    print(summary(mutants, outcomes))
    print(f"{time.monotonic() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    return 0 if all(o.as_expected for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
