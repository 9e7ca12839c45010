"""The numbers a verdict and its fixes are decided by, in one place (published in docs/profile.md).

Below every module that weighs a share or a fix (:mod:`hasten.profile.verdict`,
:mod:`hasten.profile.ranking`, :mod:`hasten.profile.inject.phases`' stopping rule), so that
each imports them from here and none from another. Standard library only: every
instrumented process imports it.

A data share decides a verdict only when its interval, widened to at least :data:`DEAD_BAND`
either side of the estimate, is clear of a threshold. A data share under 10% is worth at most
x1.11 (Amdahl), about the spread of one run against the next beside other work: a run is
called input-bound from 10% of the step on, and compute-bound (its own work sets the pace)
while the whole interval stays under it; 4-6% read ``balanced`` in one run and
``compute-bound`` in the next with the line at 5% (issue 43).

Changes the training math: no.
"""

INPUT_MODERATE = 0.10  # data share of the step: input-bound (moderate) from here, compute-bound below
INPUT_HIGH = 0.20  # ... high
COMM_MODERATE = 0.05  # exposed-communication share: moderate
COMM_HIGH = 0.20
DEAD_BAND = 0.02  # a share's interval is at least this either side of its estimate: noise cannot flip a verdict
HOST_BUSY = 0.90  # GPU runs: the host spends >= 90% of the step launching work
WORTH_IT = 1.05  # a fix predicted (or verified) below this speedup is listed as not recommended
MAX_WORKERS = 8  # the most DataLoader workers a fix proposes
