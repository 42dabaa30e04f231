"""Run a function on several threads at once, for the tests of concurrent use."""
import threading


def run_threads(n, target, timeout=120):
    """Call ``target(i)`` on threads i = 0 .. n-1 started together; fail if one
    is still running after ``timeout`` seconds (a deadlock) or if any raised
    (every exception is shown)."""
    errors = []

    def run(i):
        try:
            target(i)
        except BaseException as e:   # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "deadlock: threads still running"
    assert not errors, errors
