"""Calls that read the host run without the GIL and cannot be hung by the tree: a FIFO in place of
a sysfs file is refused (gpuslice opens attributes non-blocking and reads only regular files), the
call returns with the rest of the host, and the main thread keeps running Python meanwhile (it
tries to feed the FIFO in a loop until the worker is done). A binding that held the GIL, or a read
that blocked on the FIFO, would hang, which the subprocess timeout turns into a failure; with
forced GIL switches turned off, a binding that held the GIL would leave the main thread no turn
while the worker runs (zero spins)."""

import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent

SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, tempfile
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import gpuslice
    from hosttree import two_gpu_host

    tree = two_gpu_host(Path(tempfile.mkdtemp()) / "host")
    fifo = tree.root / "sys/devices/pci0000:00/0000:af:00.0/{file}"
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    result = {{}}
    # No forced switches: the main thread runs only while the worker is outside the GIL, so it
    # spins only if the binding releases it. Fifty calls keep the worker busy long enough for the
    # main thread to be scheduled on a loaded machine (one discovery takes about a millisecond).
    sys.setswitchinterval(100)
    worker = threading.Thread(target=lambda: result.update(out=[{call} for _ in range(50)][-1]))
    worker.start()
    spins = 0
    while worker.is_alive():
        spins += 1
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader has it open
            continue
        try:
            os.write(fd, {content!r}.encode())
        except OSError:  # the reader refused it and closed
            pass
        finally:
            os.close(fd)
    worker.join()
    assert spins > 0
    print(len(result["out"]{items}))
    """
)


def run(file, call, content, items=""):
    script = SCRIPT.format(tests=str(HERE), file=file, call=call, content=content, items=items)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


def test_discover_lets_other_threads_run_while_it_reads_the_host():
    out = run("vendor", 'gpuslice.discover(str(tree.root), node="n")', "0x1002\n", '["gpus"]')

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"


def test_health_lets_other_threads_run_while_it_reads_the_host():
    out = run("aer_dev_fatal", "gpuslice.health(str(tree.root))", "TOTAL_ERR_FATAL 0\n")

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
