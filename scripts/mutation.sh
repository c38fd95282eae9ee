#!/usr/bin/env bash
# The mutation command: how many plausible defects in the decision code the fast tests catch.
#
# mutmut (configured in pyproject.toml, [tool.mutmut]) mutates the decision code that scripts/mutation_scope.txt names
# (whole modules, and the decision functions of tune.py) one change at a time (an
# operator, a comparison, a constant, a removed call or argument) and runs, for each mutant, the fast decision tests
# that cover the mutated function. A mutant is killed when a test fails (or it hangs past mutmut's timeout). Every
# survivor is either killed by a new test or listed in tests/mutation_equivalent.txt with the reason it cannot be
# told apart from the original (an equivalent mutant). The score is killed / (mutants - listed equivalents); the
# command fails below 90 %.
#
# SCOPE=FILE runs another list of patterns (one module or function at a time: the whole list takes tens of minutes).
# Run from the repository root with the project's venv: bash scripts/mutation.sh   (about N minutes on 2 cores:
# docs/verify.md). Results stay in mutants/ (ignored by git): `.venv/bin/mutmut show <name>` prints one mutant's diff.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
MUTMUT=${MUTMUT:-$(dirname "$PY")/mutmut}
export PIPELINE_HYPOTHESIS_PROFILE=mutation
SCOPE=${SCOPE:-scripts/mutation_scope.txt}  # another list: one module or function at a time
mapfile -t patterns < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$SCOPE" | grep -v '^$')
rm -rf mutants
"$MUTMUT" run --max-children "${JOBS:-2}" "${patterns[@]}" >/dev/null 2>&1 || true
"$MUTMUT" results --all true > mutants/results.txt 2>/dev/null || "$MUTMUT" results > mutants/results.txt
exec "$PY" scripts/mutation_score.py mutants/results.txt tests/mutation_equivalent.txt "${MINIMUM:-0.9}" "$SCOPE"
