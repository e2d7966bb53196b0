"""The run's own interruption (interrupt.py): Metaflow's runtime, told to stop by a SIGINT of
its own, leaves a mark the tasks' log pumps read when it kills them."""

from pathlib import Path


def test_the_runtimes_sigint_leaves_a_mark_and_still_interrupts(tmp_path):
    """In Metaflow's runtime process: a SIGINT leaves the mark the tasks' log pumps read, then
    raises KeyboardInterrupt as before; forget_interrupt removes the mark."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, signal, sys
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import interrupt

        # Python's own handler, as in `python flow.py run` from a terminal (a job started in
        # the background by a non-interactive shell inherits SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert interrupt.mark_interrupts() == interrupt.mark_interrupts()  # installed once
        assert not interrupt.was_interrupted(os.getpid())
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            print("interrupted", interrupt.was_interrupted(os.getpid()))
        interrupt.forget_interrupt(os.getpid())
        print("forgotten", not interrupt.was_interrupted(os.getpid()))
    """ % str(Path(__file__).parents[2]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout == "interrupted True\nforgotten True\n", done.stderr
