"""The one way a gloo reference run may end that a training test does not
fail on (tests/python/reference.py) is as narrow as it says."""
from reference import TEARDOWN_ABORT, aborted_after_training

STEPS = "".join(f"step {i} loss 0.5\n" for i in range(24))
SUMMARY = "accelerate on gloo: 2 ranks, 24 steps, 6532 parameters, 0.19 s"


def test_an_abort_after_the_summary_of_a_whole_run_is_the_teardowns():
    # What CI printed (the ranks' output together, the abort after the summary).
    assert aborted_after_training(1, f"{STEPS}{SUMMARY}\n{TEARDOWN_ABORT}\n", SUMMARY, True)
    # A rank's stderr after its stdout (torchrun's two streams, joined).
    assert aborted_after_training(1, f"{STEPS}{SUMMARY}\n" + f"W1128 warning\n{TEARDOWN_ABORT}\n", SUMMARY, True)


def test_anything_else_is_a_failure():
    whole = f"{STEPS}{SUMMARY}\n{TEARDOWN_ABORT}\n"
    assert not aborted_after_training(0, whole, SUMMARY, True)  # nothing to excuse
    assert not aborted_after_training(1, whole, SUMMARY, False)  # a step missing
    assert not aborted_after_training(1, f"{STEPS}{TEARDOWN_ABORT}\n{SUMMARY}\n", SUMMARY, True)  # before the summary
    assert not aborted_after_training(1, f"{STEPS}{TEARDOWN_ABORT}\n", "", True)  # no summary
    assert not aborted_after_training(1, f"{STEPS}{SUMMARY}\nSegmentation fault\n", SUMMARY, True)
    assert not aborted_after_training(
        1, f"{STEPS}{SUMMARY}\nterminate called after throwing an instance of 'gloo::IoException'\n", SUMMARY, True)
    assert not aborted_after_training("timeout", f"{STEPS}{SUMMARY}\n", SUMMARY, True)
