"""A key-value store over files in one directory (set/get/check, as StoreBootstrap needs), for tests that
start ranks as plain processes: no launcher tears the survivors down when a rank dies."""
import os


class DirStore:
    """set/get/check over files in one directory (written whole, then renamed into place)."""

    def __init__(self, path):
        self.path = path

    def _file(self, key):
        return os.path.join(self.path, key.replace("/", "_"))

    def set(self, key, value):
        with open(self._file(key) + ".tmp", "wb") as f:
            f.write(value)
        os.replace(self._file(key) + ".tmp", self._file(key))

    def get(self, key):
        with open(self._file(key), "rb") as f:
            return f.read()

    def check(self, keys):
        return all(os.path.exists(self._file(k)) for k in keys)


def report_and_end_stopped(path, rank, size, victim, mode, victim_pid):
    """Mark this rank's result reported; with a stopped victim, the lowest survivor waits (30 s at most) for
    every other survivor's mark and then kills the victim while it is stopped: it is gone for good."""
    import signal
    import time
    open(os.path.join(path, f"reported{rank}"), "w").close()
    if mode != "stop" or rank != min(q for q in range(size) if q != victim):
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(path, f"reported{q}")) for q in range(size) if q not in (victim, rank)):
        time.sleep(0.01)
    os.kill(victim_pid, signal.SIGKILL)
