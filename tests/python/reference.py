"""gloo as the reference that training tests compare maestro with, and the
one way its runs may end that is torch's failure, not the run's.

A gloo run can train to the end, print every step and its summary (after
saving what it saves), and then have a rank abort with `terminate called
without an active exception`. That is a race in torch's ProcessGroupGloo
(torch 2.14): the group outlives destroy_process_group when something else
holds it (DistributedDataParallel does), and a worker thread that finished
the last collective drops that work's tensors only after the main thread has
gone on into the interpreter's finalization; freeing a tensor Python owns
takes the GIL, which a finalizing interpreter answers with pthread_exit, and
the unwind through the worker's noexcept frame calls std::terminate. A core
of such a rank shows it: ProcessGroupGloo::runLoop, ~AsyncAllgatherWork,
TensorImpl::decref_pyobject, take_gil, PyThread_exit_thread, while the main
thread is in Py_FinalizeEx. maestro is not loaded in those processes.

How often: 5 of 8 runs of the 4-rank mixture-of-experts example; 1 of 40 of
the 2-rank Accelerate example beside its maestro run (and once in CI).

Such a run's losses and weights stand, and a test compares maestro's with
them; the abort is printed, not failed on. Only a reference may end so:
maestro's runs must exit 0.
"""

TEARDOWN_ABORT = "terminate called without an active exception"


def aborted_after_training(code, output: str, summary: str, trained: bool) -> bool:
    """Whether a run that `trained` (every step printed) and printed its
    `summary` line exited non-zero only because a rank then aborted with
    TEARDOWN_ABORT: the abort comes after the summary in `output` (a rank's
    stderr placed after its stdout counts as after)."""
    cut = output.rfind(summary) if summary else -1
    return code != 0 and trained and cut >= 0 and TEARDOWN_ABORT in output[cut + len(summary):]
